"""bench/attach.py computes what it prints: per-step times of the three systems, and each job.set's place and delay."""

from __future__ import annotations

import sys

import pytest
from helpers.paths import REPO

sys.path.insert(0, str(REPO / "bench"))
import attach  # noqa: E402

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]  # a few seconds: servers, threads, steps


def test_the_step_costs_time_each_system_and_the_delays_come_from_the_journal() -> None:
    times = attach.step_costs(steps=2)
    assert set(times) == {"plain", "attachable", "watched"} and all(t > 0 for t in times.values())
    applied = attach.set_delays(sets=3)
    assert len(applied) == 3 and all(a.words.startswith("tag/train weight") for a in applied)
    for a in applied:
        assert a.in_force and a.entry["source"] == "attached" and a.entry["kind"] == "weight"
        assert a.delay_s is not None and a.delay_s >= 0.0
