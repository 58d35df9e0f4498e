"""Events: listeners are called in order, may remove themselves, and must be callable."""

from __future__ import annotations

import pytest

from mtlab.core.events import Events


def test_listeners_in_order_and_self_removal() -> None:
    ev, seen = Events(), []

    def once(event, info):
        seen.append(("once", event))
        ev.unsubscribe(once)

    ev.subscribe(once)
    ev.subscribe(lambda e, i: seen.append(("always", e, i["n"])))
    ev.emit("x", {"n": 1})
    ev.emit("y", {"n": 2})
    assert seen == [("once", "x"), ("always", "x", 1), ("always", "y", 2)]
    assert len(ev) == 1
    ev.unsubscribe(once)  # not subscribed any more: no error
    with pytest.raises(TypeError, match="callable"):
        ev.subscribe("not a function")
