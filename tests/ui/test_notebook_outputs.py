"""What the notebooks show (MTLAB_FAST=1): no stray reprs or raw HTML in their outputs, progress
while notebook 05 trains, and its audio players under labels in the order its text gives."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # kernels and notebooks: not in the fast tier

nbformat = pytest.importorskip("nbformat", reason="notebook tests need nbformat (pip install nbformat)")
nbclient = pytest.importorskip("nbclient", reason="notebook tests need nbclient (pip install nbclient)")
pytest.importorskip("ipykernel", reason="notebook tests need ipykernel in this environment (pip install ipykernel)")
pytest.importorskip("ipywidgets", reason="the notebooks need mtlab[notebook]: pip install 'mtlab[notebook]'")

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def execute(name: str, upto: int | None = None, monkeypatch: pytest.MonkeyPatch | None = None) -> list:
    """Run the first ``upto`` code cells (all by default); the executed code cells."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code"]
    if upto is not None:
        keep = cells[:upto]
        nb.cells = [c for c in nb.cells if c.cell_type != "code" or c in keep]
        cells = keep
    client = nbclient.NotebookClient(nb, timeout=180, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute()
    return cells


def text_of(cell) -> str:
    parts = []
    for out in cell.outputs:
        if out.get("output_type") == "stream":
            parts.append(out["text"])
        for mime in ("text/plain",):
            if mime in out.get("data", {}):
                parts.append(out["data"][mime])
    return "".join(parts)


@pytest.mark.parametrize("name", ["02_accumulation_explained.ipynb", "04_stepwise_debugging.ipynb"])
def test_setup_cell_prints_no_generator(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MTLAB_FAST", "1")
    (cell,) = execute(name, upto=1)
    assert "Generator" not in text_of(cell)


def test_notebook_03_prints_no_raw_html(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MTLAB_FAST", "1")
    cells = execute("03_multitask_linkedsets.ipynb", upto=6)
    printed = "".join(o["text"] for c in cells for o in c.outputs if o.get("output_type") == "stream")
    assert "run ended after" in printed and not re.search(r"<\w+[ >]", printed)


def test_notebook_05_shows_progress_and_labelled_players(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MTLAB_FAST", "1")
    cells = execute("05_separation.ipynb", upto=5)
    train = next(c for c in cells if "sep.step(" in c.source)
    progress = [o for o in train.outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
                or (o.get("output_type") == "stream" and "step" in o.get("text", "") and "it" in o.get("text", ""))]
    assert progress, "training shows no progress"
    listen = cells[-1]
    (html_out,) = [o for o in listen.outputs if "text/html" in o.get("data", {})]
    html = html_out["data"]["text/html"]
    labels = re.findall(r"<b>([^<]+)</b>", html)
    assert labels == ["mixture", "estimate 1", "estimate 2", "reference 1", "reference 2"]
    assert html.count("<audio") == 5 and all(html.index(f"<b>{n}</b>") < html.index("<audio", html.index(f"<b>{n}</b>"))
                                              for n in labels)
