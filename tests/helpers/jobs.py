"""A job as `mtlab train` runs it, in a thread of the test's process: attachable over its real socket."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from mtlab.remote.server import attachable
from mtlab.training.loop import run


def start_job(exp: Any, expdir: Path) -> tuple[Any, threading.Thread]:
    """Train ``exp`` (an experiment: trainer, schedule, recipe) in a daemon thread, attachable in ``expdir``;
    ``(steering, thread)``. Stop it with ``steering.stopping.set()`` and join the thread."""
    steering = attachable(exp, expdir, progress=False)
    assert steering is not None

    def train() -> None:  # as `mtlab train` does
        try:
            run(exp, progress=False, between_steps=steering.between)
        finally:
            steering.close(exp.schedule.last_stop)

    thread = threading.Thread(target=train, daemon=True)
    return steering, thread
