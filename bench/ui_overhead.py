"""The dashboard's pace and cost: how often the live plot redraws during a run and how long a knob
change takes to show, on an idle machine and under load; and (``--throughput``) training throughput
with the dashboard attached against the same run headless.

Pace (the default, ~40 s): a two-task trainer with two linked sets each (the plot of 03: loss,
gradient norm, elements clipped) runs in the dashboard's background thread for ``--seconds``; a weight
slider is moved every ~1.5 s the way the browser moves it (a comm ``update`` message). Printed, idle
and with a busy loop per CPU (started here, ended after the window): the redraw interval (median, p95,
max; aim: at most 1 s idle), the time from a knob change to its mark on the plot (the numbered event
line) and to the first drawn step trained with the new value, and the draws' cost (full, blitted).

    python bench/ui_overhead.py                 # pace, idle and under load, ~40 s
    python bench/ui_overhead.py --quick         # shorter windows
    python bench/ui_overhead.py --throughput    # dashboard/headless steps per second (aim >= 0.95)

Throughput: both train through ``mtlab.ui.Run`` (the background thread the dashboard uses); headless
has no dashboard listening. Each system runs in fixed time windows, interleaved, and the median
steps/second is compared; the plot's lag behind the step counter is sampled every 50 ms.

The dashboard's controller collects new history rows and builds its state (every text) in the training
thread every ``refresh_s`` (0.25 s); a painter thread draws the plot at most every ``draw_interval``
(0.7 s) and at most ``MAX_INTERVAL`` (1 s) after the previous draw began, moving the axis limits (a full
redraw, the layout only when panels or legends change) at most every 4 s and otherwise redrawing only
the data lines over a cached background. On a shared machine windows vary by +-25%: rerun before
reading a figure a few percent off.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
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


def lecture_trainer(hidden: int = 32, batch: int = 8) -> mtlab.Trainer:
    """Two tasks sharing an encoder, linked sets clean and noisy each (03's shape), clipping on."""
    import torch

    from mtlab.models import BLSTM

    torch.manual_seed(0)
    models = {"enc": BLSTM(common.DIN, hidden), "head_a": torch.nn.Linear(2 * hidden, common.CLASSES),
              "head_b": torch.nn.Linear(2 * hidden, common.CLASSES)}
    tasks = []
    for name, head, seed in (("frames", "head_a", 1), ("speaker", "head_b", 2)):
        sets = {ls: mtlab.LinkedSet(common.make_examples(64, 20, 80, seed=seed + 10 * i), weight=1.0)
                for i, ls in enumerate(("clean", "noisy"))}
        tasks.append(mtlab.Task(name, nodes=[mtlab.Node("h", "enc", ["x"]), mtlab.Node("logits", head, ["h"])],
                                inputs=["x"], targets=["y"], outputs=["logits"],
                                loss=mtlab.losses.CrossEntropy(output="logits", target="y"), linkedsets=sets,
                                batch_size=batch))
    return mtlab.Trainer(models, tasks, lr=2e-3, clip_grad_value=0.05, device="cpu", seed=0)


def busy_loops(seconds: float) -> list[subprocess.Popen]:
    """One spinning process per CPU, each ending by itself after ``seconds``."""
    code = f"import time\nend = time.time() + {seconds:.1f}\nwhile time.time() < end:\n    pass\n"
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(os.cpu_count() or 1)]


def pace(seconds: float, loaded: bool) -> dict[str, list[float]]:
    """Redraw times and knob-to-screen latencies of one dashboard run of ``seconds``."""
    trainer = lecture_trainer()
    dash = mtlab.ui.dashboard(trainer)
    painter = dash.painter
    sink = painter.sink
    draws: list[tuple[float, int, int]] = []  # (time, step drawn, events drawn)

    def timed_sink(png: bytes, step: int) -> None:
        sink(png, step)
        draws.append((time.monotonic(), step, len(painter.plot._events)))

    painter.sink = timed_sink
    loops = busy_loops(seconds + 3.0) if loaded else []
    try:
        if loaded:
            time.sleep(1.0)  # the load is there before the run starts
        dash.start(0)
        time.sleep(1.0)
        painter.reset_counters()
        full0, fast0 = dash.live.full_draws, dash.live.fast_draws
        changes: list[tuple[float, int, int]] = []  # (time, events before, step in flight)
        slider = dash.sliders["frames/noisy"]
        t0 = time.monotonic()
        value = 1.0
        while time.monotonic() - t0 < seconds:
            time.sleep(1.5)
            value = 0.3 if value == 1.0 else 1.0
            changes.append((time.monotonic(), len(dash.events), trainer.step_count))
            slider._handle_msg({"content": {"data": {"method": "update", "state": {"value": value}}}})
        time.sleep(1.5)
        steps = trainer.step_count
        dash.stop(wait=True)
        elapsed = time.monotonic() - t0
    finally:
        for p in loops:
            p.kill()
            p.wait()
    window = [t for t, _, _ in draws if t0 <= t <= t0 + elapsed - 1.5]
    marks = [next((t for t, _, n in draws if t >= tc and n > before), math.inf) - tc for tc, before, _ in changes]
    data = [next((t for t, s, _ in draws if t >= tc and s > step), math.inf) - tc for tc, _, step in changes]
    out = {"intervals": [b - a for a, b in zip(window, window[1:])], "marks": marks, "data": data,
           "step_s": [elapsed / max(steps, 1)], "draw_ms": [1e3 * painter.redraw_seconds / max(painter.redraws, 1)],
           "draw_cpu_ms": [1e3 * painter.redraw_cpu / max(painter.redraws, 1)],
           "full": [dash.live.full_draws - full0], "fast": [dash.live.fast_draws - fast0]}
    dash.close()
    return out


def draw_costs(repeats: int = 5) -> dict[str, float]:
    """CPU milliseconds (thread time: what a draw costs on an idle core) of one live-plot draw of 03's
    shape (2 tasks x 2 linked sets, clipping, 300 steps, events): with the layout, full, blitted."""
    from mtlab.ui.liveplot import LivePlot

    steps = list(range(1, 301))
    series: dict[str, tuple[list[float], list[float]]] = {}
    for i, t in enumerate(("frames", "speaker")):
        for suffix, scale in (("loss", 1.0), ("clean/loss", 1.1), ("noisy/loss", 1.3), ("grad_norm", 0.5),
                              ("grad_norm_clipped", 0.4)):
            series[f"{t}/{suffix}"] = (steps, [scale * (1 + i) / math.sqrt(s) for s in steps])
        series[f"{t}/clip_fraction"] = (steps, [0.1 if s % 7 == 0 else 0.0 for s in steps])
    series["direction_norm"] = (steps, [0.7] * len(steps))
    valid = {f"{t}/{ls}": ([100, 200, 300], [0.3, 0.2, 0.15]) for t in ("frames", "speaker") for ls in ("clean", "noisy")}
    events = [(60, "lr"), (150, "weight")]
    live = LivePlot(["frames", "speaker"], width_px=620)
    out: dict[str, list[float]] = {"layout": [], "full": [], "blit": []}
    for kind in ("layout", "full", "blit"):
        for _ in range(repeats):
            live._stale = live._stale or kind != "blit"
            live._relayout = live._relayout or kind == "layout"
            c0 = time.thread_time()
            live.update(series, valid, step=300, events=events)
            live.png()
            out[kind].append(1e3 * (time.thread_time() - c0))
    return {k: statistics.median(v) for k, v in out.items()}


def show_pace(seconds: float) -> None:
    print(f"pace: 2 tasks x 2 linked sets, clipping on; a slider moved every 1.5 s; {seconds:g} s per window; "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} before")
    print(f"{'machine':<16}{'s/step':>8}{'redraws':>9}{'interval med/p95/max s':>24}"
          f"{'knob->mark med/max s':>22}{'knob->data med/max s':>22}{'draw ms':>9}{'cpu ms':>8}{'full/blit':>11}")
    for loaded in (False, True):
        load = os.getloadavg()[0]
        r = pace(seconds, loaded)
        iv = sorted(r["intervals"]) or [math.nan]
        p95 = iv[min(int(0.95 * len(iv)), len(iv) - 1)]
        fmt = lambda xs: f"{statistics.median(xs):.2f}/{max(xs):.2f}" if xs else "-"
        name = f"+{os.cpu_count()} busy" if loaded else "as is"
        print(f"{name:<16}{r['step_s'][0]:>8.2f}{len(iv) + 1:>9}"
              f"{statistics.median(iv):>10.2f}/{p95:.2f}/{max(iv):.2f}".ljust(24 + 33)
              + f"{fmt(r['marks']):>22}{fmt(r['data']):>22}{r['draw_ms'][0]:>9.0f}{r['draw_cpu_ms'][0]:>8.0f}"
              f"{int(r['full'][0]):>6}/{int(r['fast'][0])}   (load {load:.1f} before)")
    cost = draw_costs()
    from mtlab.ui.painter import MAX_INTERVAL

    print(f"one draw, CPU ms (an idle core): with layout {cost['layout']:.0f}, full {cost['full']:.0f}, "
          f"blitted {cost['blit']:.0f}; the painter starts a draw at most {MAX_INTERVAL:g} s after the last began: "
          f"on an idle machine draws end at most {MAX_INTERVAL + cost['full'] / 1e3:.2f} s apart while data arrive")
    print("as is: the machine as it was (idle when the load is under 1 per CPU); +N busy: a spinning process per CPU.\n"
          "aim: redraws at most 1 s apart idle (while steps end faster than that); a knob's mark within ~1 s.\n"
          "draw ms: wall time per draw; cpu ms: the drawing thread's CPU time (what a draw costs on an idle core)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--throughput", action="store_true", help="dashboard/headless throughput instead of the pace")
    ap.add_argument("--case", default="medium", choices=list(CASES))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=None, help="length of one measuring window")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--painter", default="thread", choices=["auto", "thread", "inline"],
                    help="where the dashboard draws during a run (auto: inline when the machine is oversubscribed)")
    args = ap.parse_args()
    # One intra-op thread unless told otherwise: on a shared machine, spinning OpenMP threads make
    # both sides of the ratio noise; the dashboard's drawing shares the cores with training either way.
    os.environ.setdefault("MTLAB_BENCH_THREADS", "1")
    common.set_threads()
    if not args.throughput:
        show_pace(args.seconds or (8.0 if args.quick else 15.0))
        return
    rounds, seconds = (3, 3.0) if args.quick else (args.rounds, args.seconds or 6.0)

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
