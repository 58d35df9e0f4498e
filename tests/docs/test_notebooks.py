"""Every notebook in notebooks/ runs top to bottom (MTLAB_FAST=1, cwd notebooks/), with nbclient."""

from __future__ import annotations

import re

import json
import time
from pathlib import Path

import pytest
from helpers.notebooks import notebook_tools
from helpers.paths import NOTEBOOKS, REPO



PATHS = sorted(NOTEBOOKS.glob("*.ipynb"))


def test_notebooks_are_committed_without_outputs():
    assert PATHS, f"no notebooks in {NOTEBOOKS}"
    for path in PATHS:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        dirty = [i for i, c in enumerate(cells) if c["cell_type"] == "code" and (c.get("outputs") or c.get("execution_count"))]
        assert not dirty, f"{path.name}: cells {dirty} have outputs; clear them before committing"


def test_the_notebooks_name_the_dashboard_parts_as_the_screen_shows_them():
    """'run ended' is said by the status line (the counter above it shows the step and the phases)."""
    for path in PATHS:
        text = "".join("".join(c["source"]) for c in json.loads(path.read_text(encoding="utf-8"))["cells"])
        assert not re.search(r"counter says\W+\**run ended", text), f"{path.name}: the status line says 'run ended'"


@pytest.mark.slow  # a kernel per notebook
@pytest.mark.parametrize("path", PATHS, ids=[p.stem for p in PATHS])
def test_notebook_runs(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MTLAB_FAST", "1")
    nbformat, nbclient = notebook_tools()
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOKS)}})
    t0 = time.monotonic()
    client.execute()  # raises CellExecutionError naming the failing cell
    elapsed = time.monotonic() - t0
    print(f"{path.name}: {elapsed:.1f}s")
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.get("output_type") == "error"]
    assert not errors
    ran = [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    assert ran and all(c.execution_count for c in ran), "some code cells did not run"


def test_the_pretrained_separator_ships_small_with_its_scores():
    from mtlab.separation.pretrained import WEIGHTS, pretrained_info

    root = REPO
    assert WEIGHTS.stat().st_size <= 5_000_000
    info = pretrained_info()
    assert info["steps"] > 0 and info["dev_si_sdri"] > 3 and info["test_si_sdri"] > 3
    assert info["config"]["loss"] == "pit" and re.fullmatch(r"\d+(, then \d+)*", str(info["threads"]))  # each stage's
    assert '"mtlab.separation" = ["weights/*.pt"]' in (root / "pyproject.toml").read_text()  # in the wheel
