"""mtlab's step eager against ``compile=True``, side by side in one run.

The models of ``bench/peers.py``'s single-task cases (BLSTM tagger), the same variable-length batches in
both trainers (each built from the same weights and seed), K = 4, clip by value. Times: the median over
interleaved rounds of time(compiled) / time(eager) in the same round, ``spread`` the half-range of those
ratios; ``compile_s`` is the first step of the compiled trainer (when compiling happens). With dynamic
shapes the later lengths reuse the compiled code: ``graphs`` counts the graphs dynamo made over the run.
nn.LSTM runs eagerly under torch.compile (dynamo does not trace RNNs), so only the layers around it compile.

    python bench/compile.py                      # the compute and overhead cases on the CPU, a few minutes
    python bench/compile.py --case overhead --rounds 5
    python bench/compile.py --device cuda        # bench/gpu_check.py runs this on a GPU
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
import peers  # noqa: E402


def run(case: str, device: str, rounds: int = 5, steps: int | None = None, precision: str = "32") -> dict:
    """One row: eager and compiled ms/step, their ratio and spread, the first compiled step's seconds."""
    from torch._dynamo.utils import counters

    layers, hidden, batch, lo, hi, default_steps = peers.SETTINGS[case]
    steps = steps or max(2, default_steps // 2)
    examples = common.make_examples(256, lo, hi, seed=1)
    trainers = {name: common.make_trainer(common.make_models(layers, hidden), examples, batch, device=device,
                                          precision=precision, compile=name == "compiled")
                for name in ("eager", "compiled")}
    clock = time.perf_counter

    def step(tr):
        tr.step()
        if device == "cuda":
            torch.cuda.synchronize()

    t0 = clock()
    step(trainers["compiled"])
    compile_s = clock() - t0
    step(trainers["eager"])
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    for r in range(rounds):
        for name in (("eager", "compiled") if r % 2 == 0 else ("compiled", "eager")):
            times[name].append(common.timed(lambda n=name: step(trainers[n]), steps, clock))
    ratios = [c / e for c, e in zip(times["compiled"], times["eager"])]
    return {"case": case, "device": device, "eager_ms": statistics.median(times["eager"]) * 1e3,
            "compiled_ms": statistics.median(times["compiled"]) * 1e3, "ratio": statistics.median(ratios),
            "spread": (max(ratios) - min(ratios)) / 2, "compile_s": compile_s,
            "graphs": counters["stats"]["unique_graphs"]}


def format_row(r: dict) -> str:
    return (f"{r['case']:<10}{r['eager_ms']:>10.2f}{r['compiled_ms']:>12.2f}{r['ratio']:>8.3f}"
            f"{'±' + format(r['spread'], '.3f'):>9}{r['compile_s']:>12.1f}{r['graphs']:>8}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", default="all", choices=["all", "compute", "overhead"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=None, help="steps per round (default: half of peers.py's)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: CUDA is not available here")
    common.set_threads()
    print(f"torch {torch.__version__}, device {args.device}, threads {torch.get_num_threads()}, K={common.K}, "
          f"rounds={args.rounds}, wall clock; ratio = median per-round compiled / eager, ± half-range")
    print(f"{'case':<10}{'eager ms':>10}{'compiled ms':>12}{'ratio':>8}{'spread':>9}{'compile s':>12}{'graphs':>8}")
    for case in (["compute", "overhead"] if args.case == "all" else [args.case]):
        print(format_row(run(case, args.device, args.rounds, args.steps)), flush=True)


if __name__ == "__main__":
    main()
