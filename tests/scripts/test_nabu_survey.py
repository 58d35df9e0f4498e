"""scripts/nabu_survey.py's recipe filter (``--only``), on recipe folders written in the original's formats."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers.paths import SCRIPTS

SCRIPT = SCRIPTS / "nabu_survey.py"


@pytest.mark.slow
def test_only_surveys_the_recipes_whose_path_contains_a_pattern(tmp_path: Path) -> None:
    from helpers.nabu import write_recipe

    for name in ("SS/DBLSTM/MERL_A", "papers/X/MERL_B", "papers/Y/MERL_C"):
        write_recipe(tmp_path / name)

    def survey(*only: str) -> subprocess.CompletedProcess[str]:
        args = [a for p in only for a in ("--only", p)]
        return subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), *args], capture_output=True, text=True, check=False,
                              timeout=300)

    done = survey("MERL_B", "SS/")
    assert done.returncode == 0, done.stderr
    rows = [line.split()[0] for line in done.stdout.splitlines() if line.startswith(("SS/", "papers/"))]
    assert rows == ["SS/DBLSTM/MERL_A", "papers/X/MERL_B"]
    assert "2 recipes in" in done.stdout
    missing = survey("nowhere")
    assert missing.returncode != 0 and "--only nowhere: no recipe folder below" in missing.stderr
