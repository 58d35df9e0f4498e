"""The work around the math of one step, counted rather than timed: torch ops dispatched and Python
function calls, mtlab's ``trainer.step()`` against the loop a user writes (``bench/peers.py``'s cases).

Counts do not depend on how busy the machine is, so they show what a change to the step path removes
even where timings of a 4 ms step drown in noise. Both systems draw the same batches (``BatchStream``
and ``collate``, counted in both).

    python bench/step_work.py                       # the overhead case (1-layer BLSTM 16, batch 4, K = 4)
    python bench/step_work.py --case multitask --precision bf16
    python bench/step_work.py --layers              # also: where mtlab's own time goes, layer by layer
    python bench/step_work.py --parts               # also: the work around the math, timed part by part

For the loop a user writes (``overhead``, ``compute``) it also counts one minibatch: mtlab's
``process_minibatch`` on a batch made by ``mtlab.collate`` against the user's own minibatch (forward, the same
loss, backward), averaged over the minibatches of a step, and the rest of the step (mtlab's ``finish()``: normalize,
clip, apply; the loop's division, clipping and Adam step).

``--layers`` profiles both systems with cProfile over the same steps and charges each function's own time
(and that of the builtins and torch calls it makes directly) to the mtlab layer of its file: the share of the
step each layer costs beside the loop's whole step. The profiler slows Python far more than torch's kernels,
so the shares overstate Python layers; they rank the layers, the timed ratio is ``bench/peers.py``'s.

``--parts`` times what is around the math, with no profiler: the overhead case's batches on a model of negligible
cost (two small linear layers per frame), mtlab (``process_minibatch`` on collated batches, ``finish()``) and the
loop taking turns step by step, the minimum over many steps of each part (a minimum sees through the load of a
shared machine): the microseconds a minibatch and the rest of a step cost beyond the loop's.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
from collections import Counter
from pathlib import Path

import os
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).parent))
import common  # noqa: E402
import peers  # noqa: E402


class CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def count(step, steps: int = 5) -> tuple[float, float, Counter]:
    """(torch ops, Python calls) per step, averaged over ``steps`` steps each (two passes: the dispatch
    mode's own Python calls must not count), and the ops by name."""
    calls = 0

    def tracer(frame, event, arg):  # noqa: ANN001
        nonlocal calls
        if event == "call":
            calls += 1

    with CountOps() as mode:
        for _ in range(steps):
            step()
    sys.setprofile(tracer)
    try:
        for _ in range(steps):
            step()
    finally:
        sys.setprofile(None)
    return sum(mode.ops.values()) / steps, calls / steps, mode.ops


def minibatch_ops(case: str = "overhead", steps: int = 3) -> dict[str, float]:
    """Torch ops per minibatch (averaged over the minibatches of the steps after the first) and per step's rest, of
    mtlab (``process_minibatch`` on ``mtlab.collate`` batches, then ``finish()``) and of the user's loop (forward,
    loss, backward; then division, clipping, Adam), on the same minibatches."""
    layers, hidden, batch, lo, hi, _ = peers.SETTINGS[case]
    k = common.K
    padded = peers.plain_batches(batch, lo, hi, "cpu", n=(steps + 1) * k)
    tr = peers.plain_trainer(peers.plain_model(layers, hidden), batch, "cpu")
    ready = peers.collated(padded, "cpu")
    model = peers.plain_model(layers, hidden)
    params = list(model.parameters())
    opt = torch.optim.Adam(params, lr=1e-3)
    mb: dict[str, Counter] = {"mtlab": Counter(), peers.LOOP: Counter()}
    rest: dict[str, Counter] = {"mtlab": Counter(), peers.LOOP: Counter()}
    for step in range(steps + 1):  # the first step makes the optimizers' state: not counted
        window = range(step * k, (step + 1) * k)
        for i in window:
            with CountOps() as mode:
                tr.process_minibatch("tag", "train", batch=ready[i])
            mb["mtlab"] += mode.ops if step else Counter()
        with CountOps() as mode:
            tr.finish()
        rest["mtlab"] += mode.ops if step else Counter()
        opt.zero_grad()
        frames = torch.zeros((), dtype=torch.long)
        for i in window:
            x, y, _ = padded[i]
            with CountOps() as mode:
                F.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=common.IGNORE,
                                reduction="sum").backward()
            mb[peers.LOOP] += mode.ops if step else Counter()
            with CountOps() as mode:
                frames = frames + (y != common.IGNORE).sum()
            rest[peers.LOOP] += mode.ops if step else Counter()
        with CountOps() as mode:
            for p in params:
                p.grad.div_(frames)
            torch.nn.utils.clip_grad_value_(params, 1.0)
            opt.step()
        rest[peers.LOOP] += mode.ops if step else Counter()
    out = {f"{n}/minibatch": sum(c.values()) / (steps * k) for n, c in mb.items()}
    out.update({f"{n}/rest": sum(c.values()) / steps for n, c in rest.items()})
    return out


class Negligible(nn.Module):
    """A per-frame model whose own cost is negligible: what a step costs beyond it is the work around the math."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.hidden, self.head = nn.Linear(common.DIN, 8), nn.Linear(8, common.CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.hidden(x))


def part_times(steps: int = 2000) -> dict[str, float]:
    """Seconds, the minimum over ``steps`` steps taken in turn: K minibatches and the rest of the step, of mtlab
    (``process_minibatch`` on ``mtlab.collate`` batches, ``finish()``) and of the loop (forward, loss, backward;
    frame count, division, clipping, Adam), both on :class:`Negligible` and the overhead case's batches."""
    _, _, batch, lo, hi, _ = peers.SETTINGS["overhead"]
    k = common.K
    padded = peers.plain_batches(batch, lo, hi, "cpu", n=8)
    ready = peers.collated(padded, "cpu")
    tr = peers.plain_trainer(Negligible(), batch, "cpu")
    model = Negligible()
    params = list(model.parameters())
    opt = torch.optim.Adam(params, lr=1e-3)
    clock = time.perf_counter
    best = {"mtlab/minibatches": 1.0, "mtlab/rest": 1.0, "loop/minibatches": 1.0, "loop/rest": 1.0}
    for step in range(steps + 20):  # the first 20 warm up, not counted
        window = [(step * k + j) % len(padded) for j in range(k)]
        t0 = clock()
        for i in window:
            tr.process_minibatch("tag", "train", batch=ready[i])
        t1 = clock()
        tr.finish()
        t2 = clock()
        opt.zero_grad()
        frames = torch.zeros((), dtype=torch.long)
        for i in window:
            x, y, _ = padded[i]
            F.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=common.IGNORE, reduction="sum").backward()
            frames = frames + (y != common.IGNORE).sum()
        t3 = clock()
        for p in params:
            p.grad.div_(frames)
        torch.nn.utils.clip_grad_value_(params, 1.0)
        opt.step()
        t4 = clock()
        if step >= 20:
            for key, t in (("mtlab/minibatches", t1 - t0), ("mtlab/rest", t2 - t1), ("loop/minibatches", t3 - t2),
                           ("loop/rest", t4 - t3)):
                best[key] = min(best[key], t)
    return best


def print_parts(steps: int) -> None:
    t = part_times(steps)
    k = common.K
    mb, loop_mb = t["mtlab/minibatches"] / k, t["loop/minibatches"] / k
    print(f"\nthe work around the math, a model of negligible cost (minimum over {steps} steps each, taking turns)")
    print(f"per minibatch: mtlab {mb * 1e6:.0f} us, the loop {loop_mb * 1e6:.0f} us: {(mb - loop_mb) * 1e6:+.0f} us, "
          f"ratio {mb / loop_mb:.3f}")
    print(f"rest of a step: mtlab's finish() {t['mtlab/rest'] * 1e6:.0f} us, the loop's {t['loop/rest'] * 1e6:.0f} us: "
          f"{(t['mtlab/rest'] - t['loop/rest']) * 1e6:+.0f} us, ratio {t['mtlab/rest'] / t['loop/rest']:.3f}")
    extra = t["mtlab/minibatches"] + t["mtlab/rest"] - t["loop/minibatches"] - t["loop/rest"]
    print(f"a step of K={k}: {extra * 1e6:+.0f} us beyond the loop's")


# mtlab's files by the layer a reader knows them as (paths relative to the package)
LAYERS = {
    "core/scope.py": "call scope and generator", "core/journal.py": "journal and knobs", "core/knobs.py": "journal and knobs",
    "core/events.py": "listeners", "core/history.py": "history row", "core/columns.py": "history row",
    "core/accumulator.py": "accumulator", "core/transforms.py": "clip and normalize", "base/gradops.py": "clip and normalize",
    "core/update.py": "update (apply)", "core/optimizers.py": "update (apply)", "core/trainer.py": "trainer calls",
    "core/parallel.py": "trainer calls", "core/precision.py": "trainer calls",
    "tasks/forward.py": "forward and loss plumbing", "tasks/graph.py": "forward and loss plumbing",
    "losses/__init__.py": "forward and loss plumbing", "base/batching.py": "forward and loss plumbing",
}
TORCH = "torch (the math, both systems)"


def layer_of(filename: str) -> str | None:
    """The mtlab layer of a source file (None: not mtlab's)."""
    marker = "/mtlab/"
    if marker not in filename or "/bench/" in filename:
        return None
    rel = filename.rsplit(marker, 1)[1]
    return LAYERS.get(rel, "other mtlab")


def layer_times(step, steps: int = 200) -> dict[str, float]:
    """Seconds per step by layer under cProfile: an mtlab function's own time, and the time of what it calls that
    is not mtlab's Python (builtins, torch ops called directly), go to its layer; the rest is torch's."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        step()
    prof.disable()
    out: dict[str, float] = {}
    for (filename, _, _), (_, _, tt, _, callers) in pstats.Stats(prof).stats.items():  # type: ignore[attr-defined]
        own = layer_of(filename)
        if own is not None:
            out[own] = out.get(own, 0.0) + tt
            continue
        for (cfile, _, _), (_, _, ctt, _) in callers.items():  # charged to the caller that made the call
            layer = layer_of(cfile) or TORCH
            out[layer] = out.get(layer, 0.0) + ctt
    return {k: v / steps for k, v in out.items()}


def print_layers(systems: dict, steps: int) -> None:
    mt, loop = layer_times(systems["mtlab"], steps), layer_times(systems[peers.LOOP], steps)
    base = sum(loop.values())
    print(f"\nwhere the time goes (cProfile, {steps} steps each; share of the loop's whole step)")
    print(f"{'layer':<34}{'mtlab ms':>10}{'share':>8}{'loop ms':>10}{'share':>8}")
    for name in sorted(set(mt) | set(loop), key=lambda k: -mt.get(k, 0.0)):
        a, b = mt.get(name, 0.0), loop.get(name, 0.0)
        print(f"{name:<34}{a * 1e3:>10.3f}{a / base:>8.1%}{b * 1e3:>10.3f}{b / base:>8.1%}")
    total = sum(mt.values())
    print(f"{'whole step':<34}{total * 1e3:>10.3f}{total / base:>8.1%}{base * 1e3:>10.3f}{1:>8.1%}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", default="overhead", choices=list(peers.SETTINGS))
    ap.add_argument("--precision", default="32", choices=["32", "bf16", "16"])
    ap.add_argument("--top", type=int, default=0, help="also list the N ops mtlab dispatches most")
    ap.add_argument("--layers", action="store_true", help="also the time share of each mtlab layer (cProfile)")
    ap.add_argument("--parts", action="store_true", help="also the work around the math, timed part by part")
    args = ap.parse_args()
    precision = {"32": "32", "bf16": "bf16-mixed", "16": "16-mixed"}[args.precision]
    common.set_threads()
    rows, steps = {}, {}
    for name in ("mtlab", peers.LOOP):
        system = peers.build(name, args.case, "cpu", precision)
        system.step()  # optimizer state, first allocations
        rows[name] = count(system.step)
        steps[name] = system.step
    minibatches = common.K * (2 if args.case == "multitask" else 1)
    print(f"case {args.case}, precision {precision}, K={common.K} ({minibatches} minibatches per step)")
    print(f"{'system':<8}{'torch ops/step':>16}{'ratio':>8}{'Python calls/step':>20}{'ratio':>8}")
    for name, (ops, calls, _) in rows.items():
        base_ops, base_calls, _ = rows[peers.LOOP]
        print(f"{name:<8}{ops:>16.0f}{ops / base_ops:>8.3f}{calls:>20.0f}{calls / base_calls:>8.3f}")
    extra_ops = (rows["mtlab"][0] - rows[peers.LOOP][0]) / minibatches
    extra_calls = (rows["mtlab"][1] - rows[peers.LOOP][1]) / minibatches
    print(f"mtlab's extra work per minibatch: {extra_ops:.1f} torch ops, {extra_calls:.0f} Python calls")
    if args.case in peers.PLAIN and precision == "32":
        per = minibatch_ops(args.case)
        mt, loop = per["mtlab/minibatch"], per[f"{peers.LOOP}/minibatch"]
        print(f"torch ops per minibatch (averaged over a step): mtlab {mt:.2f}, the user's (forward, loss, backward) "
              f"{loop:.2f}: {mt - loop:+.2f}; the rest of a step: mtlab's finish() {per['mtlab/rest']:.0f}, "
              f"the loop's {per[f'{peers.LOOP}/rest']:.0f} (its frame count, division, clipping, Adam)")
    if args.top:
        diff = rows["mtlab"][2] - rows[peers.LOOP][2]
        print("ops mtlab dispatches more often than the loop (over the counted steps):",
              ", ".join(f"{k} +{v}" for k, v in diff.most_common(args.top)))
    if args.layers:
        print_layers(steps, 200)
    if args.parts:
        print(f"load {os.getloadavg()[0]:.1f} (1-minute average)")
        print_parts(2000)


if __name__ == "__main__":
    main()
