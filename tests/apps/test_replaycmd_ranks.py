"""`mtlab replay` of a run of several ranks in another world refuses before it starts, naming the command that can."""

from __future__ import annotations

from pathlib import Path

import pytest

from mtlab.apps.replaycmd import check_ranks
from mtlab.base.errors import ConfigError


def state(world: int) -> dict:
    return {"streams": {"spk/clean": {"world_size": world, "rank": 0}, "frames/noisy": {"world_size": world}}}


def test_a_two_rank_run_replayed_in_one_process_is_refused_naming_torchrun(monkeypatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ConfigError, match=r"trained on 2 ranks and this replay runs on 1.*`torchrun "
                                          r"--nproc-per-node 2 -m mtlab replay exp/run`; nothing was replayed"):
        check_ranks(state(2), Path("exp/run"))
    check_ranks(state(1), Path("exp/run"))  # one process: as it ran
    check_ranks({}, Path("exp/run"))  # a state without streams: one process
    monkeypatch.setenv("WORLD_SIZE", "2")
    check_ranks(state(2), Path("exp/run"))  # under torchrun with as many ranks
    with pytest.raises(ConfigError, match=r"`mtlab replay exp/run \(without torchrun\)`"):
        check_ranks(state(1), Path("exp/run"))
