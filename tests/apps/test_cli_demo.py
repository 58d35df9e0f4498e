"""``mtlab demo``'s own checks, in process (the runs themselves: tests/apps/test_cli.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mtlab.apps import cli
from mtlab.base.errors import ConfigError


@pytest.mark.parametrize("steps", ["0", "-3"])
@pytest.mark.parametrize("expdir", [None, "mine"])
def test_demo_with_no_step_to_run_is_refused_before_writing_anything(steps: str, expdir: str | None, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):  # refused as the command line is read
        cli._parser().parse_args(["demo", "--steps", steps, *(["--expdir", expdir] if expdir else [])])
    args = cli._parser().parse_args(["demo", *(["--expdir", expdir] if expdir else [])])
    args.steps = int(steps)  # from Python: refused by the demo itself
    with pytest.raises(ConfigError, match=rf"--steps {steps}: the demo would train nothing; leave --steps out"):
        cli._demo(args)
    assert list(tmp_path.iterdir()) == []  # no exp/demo, no empty folder
