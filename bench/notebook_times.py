"""Wall time and kernel CPU time of each notebook run top to bottom with nbclient, one at a time (as a
reader runs them), its slowest cells and its longest silence: the longest time a cell ran without showing
anything new (an output, a progress-bar update or a printed line; the aim is at most 10 s). Without ``--fast``
the notebooks run at their full size (the README lists these times; the aim is under 3 minutes each on 2 CPU cores).

    python bench/notebook_times.py                     # every notebook, full size
    python bench/notebook_times.py 05 06               # the notebooks whose names start so
    python bench/notebook_times.py --fast              # MTLAB_FAST=1 (what CI runs)
    python bench/notebook_times.py --figures docs      # also write each notebook's last figure (PNG)
    python bench/notebook_times.py 05 --keep /tmp/nb   # also write the executed notebooks (to read their outputs)
"""

from __future__ import annotations

import argparse
import base64
import os
import time
from pathlib import Path

import nbclient
import nbformat

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def last_png(nb: nbformat.NotebookNode) -> bytes | None:
    """The last PNG a cell displayed (the notebook's final figure)."""
    pngs = [o["data"]["image/png"] for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if "image/png" in o.get("data", {})]
    return base64.b64decode(pngs[-1]) if pngs else None


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of a process (Linux /proc; nan elsewhere): independent of how many other
    programs share the machine, unlike the wall time."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, TypeError):
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class TimedClient(nbclient.NotebookClient):
    """A client that notes when each output message of a cell arrives (stream, display, update)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.arrivals: dict[int, list[float]] = {}

    def output(self, outs, msg, display_id, cell_index):  # noqa: ANN001, ANN201 (nbclient's hook)
        self.arrivals.setdefault(cell_index, []).append(time.monotonic())
        return super().output(outs, msg, display_id, cell_index)

    def handle_comm_msg(self, outs, msg, cell_index):  # noqa: ANN001, ANN201 (a widget's update: a moving bar)
        if msg.get("msg_type") == "comm_msg":
            self.arrivals.setdefault(cell_index, []).append(time.monotonic())
        return super().handle_comm_msg(outs, msg, cell_index)


def longest_gap(start: float, arrivals: list[float], end: float) -> float:
    """The longest stretch without a new output between a cell's start and its end."""
    times = [start, *sorted(t for t in arrivals if start <= t <= end), end]
    return max(b - a for a, b in zip(times, times[1:]))


def run(path: Path, timeout: int, figures: Path | None = None, keep: Path | None = None
        ) -> tuple[float, float, list[tuple[float, int, str]], tuple[float, int]]:
    """Wall seconds, kernel CPU seconds, cells (seconds, index, first line) slowest first, and the longest
    silence (seconds, cell index)."""
    nb = nbformat.read(path, as_version=4)
    client = TimedClient(nb, timeout=timeout, kernel_name="python3",
                         resources={"metadata": {"path": str(NOTEBOOKS)}})
    silent = (0.0, -1)
    cells: list[tuple[float, int, str]] = []
    t0 = time.monotonic()
    with client.setup_kernel():
        process = getattr(getattr(client.km, "provisioner", None), "process", None)
        pid = getattr(process, "pid", None)
        for i, cell in enumerate(nb.cells):
            c0 = time.monotonic()
            client.execute_cell(cell, i)
            c1 = time.monotonic()
            if cell.cell_type == "code":
                cells.append((c1 - c0, i, cell.source.splitlines()[0][:60] if cell.source else ""))
                silent = max(silent, (longest_gap(c0, client.arrivals.get(i, []), c1), i))
        cpu = cpu_seconds(pid)
    total = time.monotonic() - t0
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, keep / path.name)
    png = last_png(nb)
    if figures is not None and png is not None:
        figures.mkdir(parents=True, exist_ok=True)
        (figures / f"{path.stem}_figure.png").write_bytes(png)
    return total, cpu, sorted(cells, reverse=True), silent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*", help="notebook name prefixes (default: all)")
    ap.add_argument("--fast", action="store_true", help="MTLAB_FAST=1")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    ap.add_argument("--figures", type=Path, default=None, help="write each notebook's last figure here")
    ap.add_argument("--keep", type=Path, default=None, help="write each executed notebook here")
    args = ap.parse_args()
    if args.fast:
        os.environ["MTLAB_FAST"] = "1"
    else:
        os.environ.pop("MTLAB_FAST", None)
    paths = [p for p in sorted(NOTEBOOKS.glob("*.ipynb")) if not args.names or p.name.startswith(tuple(args.names))]
    print(f"{len(paths)} notebook(s), MTLAB_FAST={'1' if args.fast else 'unset'}, {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.1f}")
    for path in paths:
        total, cpu, cells, (gap, where) = run(path, args.timeout, args.figures, args.keep)
        slow = ", ".join(f"cell {i} {t:.0f}s" for t, i, _ in cells[:3])
        print(f"{path.name:<36} {total:7.1f} s wall, {cpu:7.1f} s kernel CPU, longest silence {gap:5.1f} s "
              f"(cell {where})  (slowest: {slow}; load now {os.getloadavg()[0]:.1f})", flush=True)


if __name__ == "__main__":
    main()
