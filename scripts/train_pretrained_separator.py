"""Train the small separator mtlab ships (mtlab/separation/weights/pit_blstm_clean.pt) and print its dev and
test SI-SDR improvement, measured on the weights as stored (float16, loaded back).

    python scripts/train_pretrained_separator.py                 # 800 steps, one thread (~8 min of CPU)
    python scripts/train_pretrained_separator.py --evaluate      # only score the shipped file
    python scripts/train_pretrained_separator.py --steps 20 --out /tmp/x.pt   # a quick try

PIT, a BLSTM 2x128 on the clean linked set of data_samples/ plus 5,000 mixtures remixed from its training
sources (mtlab.separation.build_separator's defaults), seed 0, batch 8, lr 1e-3. The step budget, not the
clock, decides where training stops (``--minutes`` is only a safety cap), so a rerun gives the same file on
the same torch version; the CPU seconds it prints do not depend on what else runs on the machine.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from mtlab.separation import build_separator
from mtlab.separation.pretrained import WEIGHTS, load_pretrained, pretrained_info, save_pretrained


def scores(path: Path) -> dict[str, float]:
    """Mean SI-SDRi (dB) on dev and test of the separator stored at ``path``."""
    sep = load_pretrained(path=path)
    return {f"{split}_si_sdri": round(float(sep.evaluate(split)["si_sdri"].mean()), 2) for split in ("dev", "test")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=800, help="training steps (batch 8)")
    ap.add_argument("--minutes", type=float, default=45.0, help="safety cap on the wall-clock training time")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: the machine is shared)")
    ap.add_argument("--out", type=Path, default=WEIGHTS)
    ap.add_argument("--evaluate", action="store_true", help="only print the scores of --out")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.evaluate:
        info = pretrained_info(args.out)
        print(f"{args.out}: {info['steps']} steps; stored dev {info['dev_si_sdri']:+.2f} dB, test "
              f"{info['test_si_sdri']:+.2f} dB")
        print("measured now:", {k: f"{v:+.2f} dB" for k, v in scores(args.out).items()})
        return
    sep = build_separator("pit", "clean", seed=0)
    t0, c0 = time.perf_counter(), time.process_time()

    def log(s) -> None:
        if s.trainer.step_count % 50 == 0:
            print(f"step {s.trainer.step_count:4d}  {time.perf_counter() - t0:5.0f} s  train loss "
                  f"{float(s.trainer.history['separation/loss'].iloc[-1]):.4f}", flush=True)

    done = sep.step(args.steps, max_seconds=60 * args.minutes, on_step=log)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    info = {"steps": done, "train_seconds": round(seconds, 1), "train_cpu_seconds": round(cpu, 1), "threads": args.threads,
            "torch": str(torch.__version__), "dev_si_sdri": float("nan"), "test_si_sdri": float("nan")}
    save_pretrained(sep, args.out, info)
    info.update(scores(args.out))  # the stored (float16) weights, loaded back as a notebook loads them
    save_pretrained(sep, args.out, info)
    print(f"{done} steps in {seconds:.0f} s wall, {cpu:.0f} s CPU; wrote {args.out} ({args.out.stat().st_size / 1e6:.2f} MB)")
    print(f"SI-SDR improvement over the mixture: dev {info['dev_si_sdri']:+.2f} dB, test {info['test_si_sdri']:+.2f} dB")


if __name__ == "__main__":
    main()
