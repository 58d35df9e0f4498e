"""mtlab ``trainer.step()`` against a hand-written PyTorch loop doing the same math.

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


def build(system: str, case: str):
    layers, hidden, batch, lo, hi = common.CASES[case]
    examples = common.make_examples(256, lo, hi, seed=1)
    models = common.make_models(layers, hidden)
    if system == "mtlab":
        return common.make_trainer(models, examples, batch).step
    return common.HandLoop(models, examples, batch).step


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
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--memory-child", nargs=2, metavar=("SYSTEM", "STEPS"))
    args = ap.parse_args()
    if args.memory_child:
        memory_child(args.memory_child[0], args.case, int(args.memory_child[1]))
        return
    common.set_threads()
    rounds = 3 if args.quick else args.rounds
    systems = {"hand-written": build("hand", args.case), "mtlab": build("mtlab", args.case)}
    med = common.interleaved(systems, rounds, args.steps)
    mem = {}
    for name, key in (("hand-written", "hand"), ("mtlab", "mtlab")):
        out = subprocess.run([sys.executable, __file__, "--case", args.case, "--memory-child", key, "3"],
                             capture_output=True, text=True, check=True)
        mem[name] = json.loads(out.stdout.strip().splitlines()[-1])["peak_growth"]
    print(f"case={args.case} {common.CASES[args.case]} K={common.K} rounds={rounds} steps/round={args.steps}")
    print(f"{'system':<14}{'ms/step':>10}{'ratio':>8}{'peak MB':>10}{'ratio':>8}")
    for name in systems:
        print(f"{name:<14}{med[name] * 1e3:>10.1f}{med[name] / med['hand-written']:>8.3f}"
              f"{mem[name] / 2**20:>10.1f}{mem[name] / max(mem['hand-written'], 1):>8.3f}")
    print(f"time ratio mtlab/hand = {med['mtlab'] / med['hand-written']:.3f}; "
          f"memory ratio mtlab/hand = {mem['mtlab'] / max(mem['hand-written'], 1):.3f}")


if __name__ == "__main__":
    main()
