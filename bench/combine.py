"""Step time of each task-combination method against the weighted sum, and against LibMTL's way.

On the demo recipe (recipes/demo.toml: BLSTM encoder shared by a speaker-id and a frame task, each with a
clean and a noisy linked set, batch 8): the same minibatches are fed to

- mtlab: ``process_minibatch`` for every (task, linked set), normalize, clip, apply with the method
  (tasks × minibatches backward passes, one combination per step on the accumulated gradients);
- LibMTL's way (written here in plain PyTorch from its ``_compute_grad(mode="backward")``): per
  minibatch round, each task's forward, then T ``backward(retain_graph=True)`` passes reading the shared
  gradient into a T × n matrix, the same torchjd aggregator on it, and an optimizer step (no accumulation).

Interleaved rounds, median seconds per step, 1 torch thread unless MTLAB_BENCH_THREADS is set.

    python bench/combine.py            # every method
    python bench/combine.py --quick    # fewer rounds
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import common  # noqa: E402

import mtlab  # noqa: E402
from mtlab.core import combine as combine_mod  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
METHODS = ["sum", *combine_mod.AGGREGATORS, "uncertainty", "dwa", "famo", "random_loss"]


def batches(tr: mtlab.Trainer, rounds: int) -> list[dict[tuple[str, str], object]]:
    """``rounds`` steps' worth of minibatches, one per (task, linked set), drawn once for both systems."""
    return [{(t, s): next(tr.stream(t, s)) for t, task in tr.tasks.items() for s in task.linkedsets}
            for _ in range(rounds)]


def mtlab_step(tr: mtlab.Trainer, data: dict) -> None:
    for (t, s), batch in data.items():
        tr.process_minibatch(t, s, batch=batch)
    tr.normalize()
    tr.clip()
    tr.apply()


class LibMTLWay:
    """T backward passes per minibatch round with retain_graph, aggregator per round, no accumulation."""

    def __init__(self, tr: mtlab.Trainer, method: str) -> None:
        self.tr = tr
        self.shared = [tr.params[n] for n in tr.shared]
        self.params = list(tr.params.values())
        self.opt = torch.optim.Adam(self.params, lr=tr.lr)
        self.agg = None
        if method != "sum":
            spec = combine_mod.AGGREGATORS[method]
            cls = getattr(combine_mod.require(method, spec), spec.cls)
            self.agg = cls(n_tasks=len(tr.tasks), **spec.defaults) if spec.per_size else cls(**spec.defaults)

    def step(self, data: dict) -> None:
        tr = self.tr
        sets = sorted({s for _, s in data})
        for s in sets:  # one round: every task's minibatch of linked set s
            self.opt.zero_grad(set_to_none=True)
            losses = []
            for t, _task in tr.tasks.items():
                if (t, s) in data:
                    r = tr.plans[t].loss(data[(t, s)], require_grad=True)
                    losses.append(r.loss_sum / r.normalizer)
            rows = []
            for i, loss in enumerate(losses):  # LibMTL: losses[tn].backward(retain_graph=True), read, zero
                loss.backward(retain_graph=i + 1 < len(losses))
                rows.append(torch.cat([p.grad.reshape(-1) for p in self.shared]))
                for p in self.shared:
                    p.grad = None
            J = torch.stack(rows)
            d = J.sum(0) if self.agg is None else self.agg(J)
            for p, g in zip(self.shared, torch.split(d, [p.numel() for p in self.shared])):
                p.grad = g.view_as(p)
            torch.nn.utils.clip_grad_value_(self.params, tr.clip_grad_value or float("inf"))
            self.opt.step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--methods", nargs="*", default=METHODS)
    parser.add_argument("--directions-only", action="store_true", help="only the cost of the combination itself")
    args = parser.parse_args()
    common.set_threads()
    steps, repeats = (3, 2) if args.quick else (6, 3)
    exp = mtlab.from_recipe(ROOT / "recipes" / "demo.toml")
    tr = exp.trainer
    data = batches(tr, steps)
    snap = tr.state_dict()
    if args.directions_only:
        directions_cost(tr, data[0], args.methods, None)
        return
    print(f"demo recipe, {len(tr.tasks)} tasks, {sum(p.numel() for p in tr.params.values())} parameters "
          f"({sum(tr.params[n].numel() for n in tr.shared)} shared), {len(data[0])} minibatches per step, "
          f"{torch.get_num_threads()} thread(s), device {tr.device}")
    runners: dict[str, tuple] = {}
    for method in args.methods:  # build and warm up each (solvers' first calls, buffers)
        try:
            tr.load_state_dict(snap)
            tr.set_combine(method)
            mtlab_step(tr, data[0])
            way = None
            if method == "sum" or method in combine_mod.AGGREGATORS:
                tr.load_state_dict(snap)
                way = LibMTLWay(tr, method)
                way.step(data[0])
            runners[method] = (way,)
        except ImportError as exc:
            print(f"{method}: skipped ({exc})")
    runners["sum, no stats"] = (None,)
    times: dict[str, list[float]] = {k: [] for k in runners}
    other_times: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(repeats):  # interleaved: every method once per round, so load swings hit all alike
        for method, (way,) in runners.items():
            tr.load_state_dict(snap)
            tr.set_combine("sum" if method == "sum, no stats" else method)
            tr.update.record_stats = method != "sum, no stats"
            for d in data:
                t0 = time.perf_counter()
                mtlab_step(tr, d)
                times[method].append(time.perf_counter() - t0)
            if way is not None:
                tr.load_state_dict(snap)
                for d in data:
                    t0 = time.perf_counter()
                    way.step(d)
                    other_times[method].append(time.perf_counter() - t0)
    results = {k: (statistics.median(v), statistics.median(other_times[k]) if other_times[k] else None)
               for k, v in times.items()}
    bare = results.pop("sum, no stats")[0]
    base = results["sum"][0] if "sum" in results else bare
    print(f"\n{'method':<14}{'mtlab s/step':>14}{'vs sum':>9}{'LibMTL way':>13}{'mtlab/LibMTL':>14}")
    for method, (mine, other) in results.items():
        o = f"{other:13.4f}{mine / other:14.2f}" if other else f"{'-':>13}{'-':>14}"
        print(f"{method:<14}{mine:14.4f}{mine / base:9.2f}{o}")
    print(f"{'sum, no stats':<14}{bare:14.4f}{bare / base:9.2f}   (history statistics off: cosines, norms)")
    tr.load_state_dict(snap)
    directions_cost(tr, data[0], args.methods, base)


def directions_cost(tr: mtlab.Trainer, data: dict, methods: list[str], step_s: float | None) -> None:
    """The combination alone: ``update.directions`` on one accumulated step (median of 7 calls), the part
    that LibMTL's way pays once per minibatch round and mtlab once per step."""
    for (t, s), batch in data.items():
        tr.process_minibatch(t, s, batch=batch)
    tr.normalize()
    tr.clip()
    accs = {t: tr.state(t) for t in tr.tasks}
    weights = {t: x.weight for t, x in tr.tasks.items()}
    print(f"\n{'method':<14}{'directions ms':>14}" + (f"{'% of a sum step':>17}" if step_s else ""))
    for method in methods:
        try:
            tr.set_combine(method)
        except ImportError as exc:
            print(f"{method}: skipped ({exc})")
            continue
        for record in (True, False) if method == "sum" else (True,):
            tr.update.record_stats = record
            tr.update.directions(accs, weights)  # warm-up
            times = []
            for _ in range(7):
                t0 = time.perf_counter()
                tr.update.directions(accs, weights)
                times.append(time.perf_counter() - t0)
            ms = statistics.median(times) * 1e3
            name = method if record else "sum, no stats"
            print(f"{name:<14}{ms:14.2f}" + (f"{100 * ms / 1e3 / step_s:16.1f}%" if step_s else ""))
    tr.update.record_stats = True


if __name__ == "__main__":
    main()
