"""Events: listeners are called in order, may remove themselves, and must be callable."""

from __future__ import annotations

import pytest

from mtlab.core.events import Events, RestoreInfo


def test_listeners_in_order_and_self_removal() -> None:
    ev, seen = Events(), []

    def once(event, info):
        seen.append(("once", event))
        ev.unsubscribe(once)

    ev.subscribe(once)
    ev.subscribe(lambda e, i: seen.append(("always", e, i["step"])))
    ev.emit("restore", RestoreInfo(step=1))
    ev.emit("restore", RestoreInfo(step=2))
    assert seen == [("once", "restore"), ("always", "restore", 1), ("always", "restore", 2)]
    assert len(ev) == 1
    ev.unsubscribe(once)  # not subscribed any more: no error
    with pytest.raises(TypeError, match="callable"):
        ev.subscribe("not a function")
