"""Run each notebook of notebooks/ top to bottom and write it, with its outputs and figures, to
docs/tutorials/ (the docs site renders those copies without executing them).

    python scripts/render_tutorials.py            # every notebook, full size (a few minutes on 2 cores)
    python scripts/render_tutorials.py 05 06      # the notebooks whose names start so
    python scripts/render_tutorials.py --fast     # MTLAB_FAST=1: a few steps each

Rerun it after editing a notebook: tests/docs/test_docs.py checks that each copy's cells are the notebook's.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import nbclient
import nbformat

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
OUT = ROOT / "docs" / "tutorials"


WIDGET = "application/vnd.jupyter.widget-view+json"
WIDGET_NOTE = "[an interactive widget: it shows in a running notebook, not on a static page]"


def static_widgets(nb: nbformat.NotebookNode) -> None:
    """Replace each widget output's data by a one-line note: without a kernel a widget cannot show, and its
    text form is a long repr of its children. A widget that offers a static form of what it shows (HTML or a
    PNG, as ``dash.follow`` does) keeps that instead. Live widget state is dropped too."""
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if WIDGET in data:
                static = {k: v for k, v in data.items() if k in ("text/html", "image/png")}
                out["data"] = {**static, "text/plain": data["text/plain"]} if static else {"text/plain": WIDGET_NOTE}


def render(path: Path, timeout: int) -> Path:
    """Execute ``path`` in a fresh kernel (cwd notebooks/) and write the executed copy under docs/tutorials/."""
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    static_widgets(nb)
    out = OUT / path.name
    nbformat.write(nb, out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*", help="notebook name prefixes (default: all)")
    ap.add_argument("--fast", action="store_true", help="MTLAB_FAST=1 (a few steps per notebook)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    args = ap.parse_args()
    if args.fast:
        os.environ["MTLAB_FAST"] = "1"
    else:
        os.environ.pop("MTLAB_FAST", None)
    os.environ["MTLAB_WAIT"] = "1"  # unattended: a notebook waits for its runs (in class its cells never do)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    OUT.mkdir(parents=True, exist_ok=True)
    paths = [p for p in sorted(NOTEBOOKS.glob("*.ipynb")) if not args.names or p.name.startswith(tuple(args.names))]
    for path in paths:
        t0 = time.monotonic()
        out = render(path, args.timeout)
        print(f"{path.name}: {time.monotonic() - t0:.0f} s -> {out.relative_to(ROOT)} "
              f"({out.stat().st_size / 1e3:.0f} kB)", flush=True)


if __name__ == "__main__":
    main()
