"""mtlab ``trainer.step()`` against the loop a user writes for the same math (``common.UserLoop``:
ignore_index cross-entropy, ``clip_grad_value_``, default Adam; 1 torch thread unless MTLAB_BENCH_THREADS is set).

2-layer BLSTM (hidden 128), 40-dim inputs, batch 16, lengths 50-300, K=4 minibatches per step,
clip by value, Adam. Interleaved rounds, median time per step; peak memory (RSS growth during
training) measured in separate processes. Prints the ratios.

    python bench/overhead.py            # full
    python bench/overhead.py --quick    # fewer rounds
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import common  # noqa: E402


def build(system: str, case: str, with_state: bool = False):
    layers, hidden, batch, lo, hi = common.CASES[case]
    examples = common.make_examples(256, lo, hi, seed=1)
    models = common.make_models(layers, hidden)
    if system == "mtlab":
        tr = common.make_trainer(models, examples, batch)
        state = (list(tr.params.values()), [tr.optimizer],
                 lambda: [b for t in tr.tasks for b in tr.state(t).buffers] + tr.update.buffers())
        return (tr.step, state) if with_state else tr.step
    hl = common.UserLoop(models, examples, batch)
    return (hl.step, (hl.params, [hl.opt], lambda: ())) if with_state else hl.step


def tensor_peaks(case: str) -> dict[str, int]:
    """Peak tensor bytes of one step (same batch in both), after one warm-up step."""
    out = {}
    for name, key in (("loop", "hand"), ("mtlab", "mtlab")):
        step, (params, opts, extra) = build(key, case, with_state=True)
        step()
        for opt in opts:
            opt.zero_grad()  # what the loop's step frees first (mtlab's buffers stay: nothing to free)
        out[name] = common.peak_step_bytes(step, params, opts, extra)
    return out


def memory_child(system: str, case: str, steps: int) -> None:
    common.set_threads()
    step = build(system, case)
    step()  # first step allocates optimizer state and warms up
    base = common.reset_peak_rss()
    for _ in range(steps):
        step()
    print(json.dumps({"peak_growth": common.rss("VmHWM") - base}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", default="compute", choices=list(common.CASES))
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--memory-child", nargs=2, metavar=("SYSTEM", "STEPS"))
    args = ap.parse_args()
    if args.memory_child:
        memory_child(args.memory_child[0], args.case, int(args.memory_child[1]))
        return
    common.set_threads()
    rounds = 4 if args.quick else args.rounds
    systems = {"loop": build("hand", args.case), "mtlab": build("mtlab", args.case)}
    times = common.interleaved_times(systems, rounds, args.steps)
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    ratio = common.paired_ratio(times, "mtlab", "loop")
    mem = {}
    for name, key in (("loop", "hand"), ("mtlab", "mtlab")):
        out = subprocess.run([sys.executable, __file__, "--case", args.case, "--memory-child", key, "3"],
                             capture_output=True, text=True, check=True)
        mem[name] = json.loads(out.stdout.strip().splitlines()[-1])["peak_growth"]
    print(f"case={args.case} {common.CASES[args.case]} K={common.K} rounds={rounds} steps/round={args.steps}")
    peaks = tensor_peaks(args.case)
    print(f"{'system':<14}{'ms/step':>10}{'ratio':>8}{'tensor peak MB':>16}{'ratio':>8}{'RSS growth MB':>15}")
    for name in systems:
        r = 1.0 if name == "loop" else ratio
        print(f"{name:<14}{med[name] * 1e3:>10.1f}{r:>8.3f}{peaks[name] / 2**20:>16.2f}"
              f"{peaks[name] / peaks['loop']:>8.3f}{mem[name] / 2**20:>15.1f}")
    print(f"time ratio mtlab/loop (median of per-round ratios, same batches) = {ratio:.3f}; "
          f"peak tensor memory ratio = {peaks['mtlab'] / peaks['loop']:.3f} "
          f"(parameters, gradients, Adam state and every allocation during one step, torch profiler); "
          f"RSS growth (separate processes, noisy) ratio = {mem['mtlab'] / max(mem['loop'], 1):.3f}")


if __name__ == "__main__":
    main()
