"""Training throughput with the dashboard attached (live plots on) against the same run headless,
and how far the plot lags the step counter.

Both train through ``mtlab.ui.Run`` (the background thread the dashboard uses); headless has no
dashboard listening. Each system runs in fixed time windows, interleaved, and the median
steps/second is compared. Prints the ratio dashboard/headless (aim: >= 0.95), how often and how
long the dashboard redrew, and the plot's lag behind the counter (aim: <= ~1 s), sampled every
50 ms as (steps done - step the plot shows) / steps per second.

    python bench/ui_overhead.py                 # BLSTM tagger, ~60 s
    python bench/ui_overhead.py --quick         # shorter windows
    python bench/ui_overhead.py --case overhead # tiny model: per-step costs dominate

The dashboard's controller collects new history rows and builds its state (every text) in the training
thread every ``refresh_s`` (0.25 s); a painter thread draws the plot at most every ``draw_interval``
(0.7 s), moving the axis limits (a full redraw, the layout only when panels or legends change) at most
every 4 s and otherwise redrawing only the data lines.
On a shared machine windows vary by +-25%: rerun, or raise --rounds, before reading a ratio a
few percent off 1.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import common  # noqa: E402

import mtlab  # noqa: E402
import mtlab.ui  # noqa: E402

CASES = {**common.CASES, "medium": (1, 64, 8, 20, 120)}


class Headless:
    """The dashboard's background run, nothing listening."""

    def __init__(self, trainer) -> None:
        self.trainer = trainer
        self.run: mtlab.ui.Run | None = None

    def start(self) -> None:
        self.run = mtlab.ui.Run(self.trainer)
        self.run.start()

    def stop(self) -> None:
        assert self.run is not None
        self.run.stop(wait=True)


def build(case: str):
    layers, hidden, batch, lo, hi = CASES[case]
    examples = common.make_examples(256, lo, hi, seed=1)
    return common.make_trainer(common.make_models(layers, hidden), examples, batch)


def window(system, trainer, seconds: float, settle: float = 0.5, dash=None, lags: list[float] | None = None) -> float:
    """Steady-state steps per second: counted while running, after ``settle`` seconds, so that
    thread start and the dashboard's final redraw at the end of a run stay out of the count.
    With ``dash``, the plot's lag (seconds) is sampled every 50 ms into ``lags``."""
    system.start()
    time.sleep(settle)
    n0, t0 = trainer.step_count, time.perf_counter()
    end = t0 + seconds
    samples: list[int] = []
    while time.perf_counter() < end:
        time.sleep(min(0.05, max(end - time.perf_counter(), 0)))
        if dash is not None and dash.drawn_step is not None:
            samples.append(trainer.step_count - dash.drawn_step)
    n1, t1 = trainer.step_count, time.perf_counter()
    system.stop()
    rate = (n1 - n0) / (t1 - t0)
    if lags is not None and rate > 0:
        lags += [k / rate for k in samples]
    return rate


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", default="medium", choices=list(CASES))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=6.0, help="length of one measuring window")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--painter", default="thread", choices=["auto", "thread", "inline"],
                    help="where the dashboard draws during a run (auto: inline when the machine is oversubscribed)")
    args = ap.parse_args()
    # One intra-op thread unless told otherwise: on a shared machine, spinning OpenMP threads make
    # both sides of the ratio noise; the dashboard's drawing shares the cores with training either way.
    os.environ.setdefault("MTLAB_BENCH_THREADS", "1")
    common.set_threads()
    rounds, seconds = (3, 3.0) if args.quick else (args.rounds, args.seconds)

    head_tr, dash_tr = build(args.case), build(args.case)
    headless = Headless(head_tr)
    dash = mtlab.ui.dashboard(dash_tr, painter=args.painter)  # live plots on, default cadence

    class DashSystem:
        start = staticmethod(lambda: dash.start(0))
        stop = staticmethod(lambda: dash.stop(wait=True))

    for s, tr in ((headless, head_tr), (DashSystem, dash_tr)):  # warm up
        window(s, tr, 1.0)
    dash.painter.reset_counters()  # (redraws at the end of each window are counted too)
    dash.controller.collect_cpu = 0.0
    rates: dict[str, list[float]] = {"headless": [], "dashboard": []}
    lags: list[float] = []
    for r in range(rounds):
        order = [("headless", headless, head_tr, None), ("dashboard", DashSystem, dash_tr, dash)]
        for name, s, tr, d in (order if r % 2 == 0 else order[::-1]):
            rates[name].append(window(s, tr, seconds, dash=d, lags=lags if d is not None else None))
    med = {k: statistics.median(v) for k, v in rates.items()}
    ratio = med["dashboard"] / med["headless"]
    total = rounds * seconds
    print(f"case={args.case} {CASES[args.case]} K={common.K} rounds={rounds} window={seconds:g}s "
          f"painter={args.painter} load={os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'system':<12}{'steps/s':>10}{'ms/step':>10}")
    for k, v in med.items():
        print(f"{k:<12}{v:>10.2f}{1e3 / v:>10.1f}")
    painter = dash.painter
    print(f"dashboard redraws: {painter.redraws} in {total:.0f}s of dashboard runs "
          f"({painter.redraws / total:.2f}/s, {1e3 * painter.redraw_seconds / max(painter.redraws, 1):.0f} ms each, "
          f"{100 * painter.redraw_seconds / total:.1f}% of the time; {dash.live.full_draws} full, "
          f"{dash.live.fast_draws} blitted)")
    print(f"dashboard CPU per second of run (thread time, load-independent): drawing "
          f"{1e3 * painter.redraw_cpu / total:.0f} ms/s, collecting rows and building states "
          f"{1e3 * dash.controller.collect_cpu / total:.0f} ms/s")
    if lags:
        lags.sort()
        p95 = lags[min(int(0.95 * len(lags)), len(lags) - 1)]
        print(f"plot lag behind the counter: median {statistics.median(lags):.2f}s, p95 {p95:.2f}s, "
              f"max {lags[-1]:.2f}s over {len(lags)} samples (aim <= ~1 s)")
    print(f"throughput ratio dashboard/headless = {ratio:.3f} (aim >= 0.95)")
    dash.close()


if __name__ == "__main__":
    main()
