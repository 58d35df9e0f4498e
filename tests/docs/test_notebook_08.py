"""Notebook 08 (accumulation across frameworks, MTLAB_FAST=1): what its text says is what its output shows."""

from __future__ import annotations

import importlib
from html import escape as html_escape
import re
import sys

import pytest
from helpers.notebooks import notebook_tools
from helpers.paths import BENCH, NOTEBOOKS

pytestmark = pytest.mark.slow  # a kernel, and the peers that are installed

NAME = "08_accumulation_across_frameworks.ipynb"


@pytest.fixture(scope="module")
def cells(tmp_path_factory):
    nbformat, nbclient = notebook_tools()
    nb = nbformat.read(NOTEBOOKS / NAME, as_version=4)
    mp = pytest.MonkeyPatch()
    mp.setenv("MTLAB_FAST", "1")
    try:
        nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    finally:
        mp.undo()
    return nb.cells


def text_of(cell) -> str:
    out = []
    for o in cell.get("outputs", []):
        out.append(o.get("text", "") + o.get("data", {}).get("text/plain", ""))
    return "".join(out)


def accumulation():
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    return importlib.import_module("accumulation")


def test_it_says_which_peers_are_installed(cells):
    A = accumulation()
    text = text_of(next(c for c in cells if c.cell_type == "code"))
    missing = [p for p in ("transformers", "accelerate", "lightning") if not A.installed(p)]
    assert f"not installed (their rows say so; pip install \"mtlab[bench]\"): {missing or 'none'}" in text


def test_the_table_has_a_row_per_system_with_its_cause(cells):
    A = accumulation()
    html = "".join(o.get("data", {}).get("text/html", "") for c in cells if c.cell_type == "code" for o in c.outputs)
    for row in A.ROWS:
        if row.ranks == 1:
            assert html_escape(row.why, quote=False) in html, row.setting
            if not A.installed(row.needs):
                assert f"not installed (pip install {row.needs})" in html


def test_the_prose_claims_match_the_printed_grid(cells):
    A = accumulation()
    grid = next(c for c in cells if c.cell_type == "code" and c.source.startswith("for name in names"))
    text = text_of(grid)
    found = dict(re.findall(r"(.+):\n  at the float floor for the spreads \[([^\]]*)\]", text))
    assert found["mtlab, fp32"] == "1, 3, 30"  # MTLAB_FAST: spreads 1, 3, 30
    assert found["plain PyTorch, mean of per-minibatch means, fp32"] == "1"
    ks = dict(re.findall(r"(.+):\n.*for K in \[([^\]]*)\] \(spread 1:1, ragged end\)", text))
    assert ks["mtlab, fp32"] == "1, 2, 4, 8" and ks["plain PyTorch, mean of per-minibatch means, fp32"] == "1"
    prose = "\n".join(c.source for c in cells if c.cell_type == "markdown")
    assert "mtlab stays at the float32 floor everywhere" in prose
    if A.installed("transformers"):
        assert ks["HF Transformers Trainer, without num_items_in_batch"] == "1, 2"
        assert "so on the right it is exact at K = 2" in prose
