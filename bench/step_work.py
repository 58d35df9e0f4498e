"""The work around the math of one step, counted rather than timed: torch ops dispatched and Python
function calls, mtlab's ``trainer.step()`` against the loop a user writes (``bench/peers.py``'s cases).

Counts do not depend on how busy the machine is, so they show what a change to the step path removes
even where timings of a 4 ms step drown in noise. Both systems draw the same batches (``BatchStream``
and ``collate``, counted in both).

    python bench/step_work.py                       # the overhead case (1-layer BLSTM 16, batch 4, K = 4)
    python bench/step_work.py --case multitask --precision bf16
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", default="overhead", choices=list(peers.SETTINGS))
    ap.add_argument("--precision", default="32", choices=["32", "bf16", "16"])
    ap.add_argument("--top", type=int, default=0, help="also list the N ops mtlab dispatches most")
    args = ap.parse_args()
    precision = {"32": "32", "bf16": "bf16-mixed", "16": "16-mixed"}[args.precision]
    common.set_threads()
    rows = {}
    for name in ("mtlab", peers.LOOP):
        system = peers.build(name, args.case, "cpu", precision)
        system.step()  # optimizer state, first allocations
        rows[name] = count(system.step)
    minibatches = common.K * (2 if args.case == "multitask" else 1)
    print(f"case {args.case}, precision {precision}, K={common.K} ({minibatches} minibatches per step)")
    print(f"{'system':<8}{'torch ops/step':>16}{'ratio':>8}{'Python calls/step':>20}{'ratio':>8}")
    for name, (ops, calls, _) in rows.items():
        base_ops, base_calls, _ = rows[peers.LOOP]
        print(f"{name:<8}{ops:>16.0f}{ops / base_ops:>8.3f}{calls:>20.0f}{calls / base_calls:>8.3f}")
    extra_ops = (rows["mtlab"][0] - rows[peers.LOOP][0]) / minibatches
    extra_calls = (rows["mtlab"][1] - rows[peers.LOOP][1]) / minibatches
    print(f"mtlab's extra work per minibatch: {extra_ops:.1f} torch ops, {extra_calls:.0f} Python calls")
    if args.top:
        diff = rows["mtlab"][2] - rows[peers.LOOP][2]
        print("ops mtlab dispatches more often than the loop (over the counted steps):",
              ", ".join(f"{k} +{v}" for k, v in diff.most_common(args.top)))


if __name__ == "__main__":
    main()
