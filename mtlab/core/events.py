"""Events: who is told what happened, after it happened.

The trainer emits ``minibatch``, ``normalize``, ``clip``, ``apply``, ``reset``, ``weight``, ``task_weight``,
``evaluate`` and ``restore``; the loop adds ``step``, ``validation``, ``run_start`` and ``run_end``. A
listener is any ``fn(event: str, info: dict)``; loggers, the dashboard and traces are listeners.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Listener = Callable[[str, dict[str, Any]], None]


class Events:
    """A list of listeners called in order; a listener may remove itself while being called."""

    def __init__(self) -> None:
        self.listeners: list[Listener] = []

    def subscribe(self, fn: Listener) -> Listener:
        """Call ``fn(event, info)`` on every event from now on; returns ``fn``."""
        if not callable(fn):
            raise TypeError(f"a listener must be callable as fn(event, info), got {type(fn).__name__}")
        self.listeners.append(fn)
        return fn

    def unsubscribe(self, fn: Listener) -> None:
        """Stop calling ``fn`` (no error if it was not subscribed)."""
        if fn in self.listeners:
            self.listeners.remove(fn)

    def emit(self, event: str, info: dict[str, Any]) -> None:
        """Call every listener with ``(event, info)``, in the order they subscribed."""
        for fn in list(self.listeners):
            fn(event, info)

    def __len__(self) -> int:
        return len(self.listeners)
