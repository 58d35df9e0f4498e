"""The GPU checks in one short script: sync-free step, speed against the peers, peak memory.

On a CUDA machine it

1. runs tests/core/test_trainer_sync_free.py's CUDA test, whose step runs under ``torch.cuda.set_sync_debug_mode("error")``
   (any host read in process_minibatch -> normalize -> clip -> apply under ``nonfinite="skip"`` fails it);
2. runs bench/peers.py on the GPU (mtlab, the loop a user writes, Lightning, Accelerate; wall clock with a
   synchronize per step);
3. compares peak GPU memory (``torch.cuda.max_memory_allocated`` over one step after a warm-up step) of mtlab
   and the loop, for one task and for two tasks sharing an encoder;
4. repeats the speed and memory rows in bf16-mixed and 16-mixed (every system in the same precision: the
   user's AMP loop with autocast and a GradScaler, Lightning's ``precision=``), and times mtlab's step eager
   against ``compile=True`` (bench/compile.py);

and prints one table. Without CUDA it refuses and says so.

    python bench/gpu_check.py                 # about 5-8 minutes on one GPU
    python bench/gpu_check.py --quick         # one case per precision (about 3 minutes)
    python bench/gpu_check.py --rounds 5      # more rounds for the speed rows
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import torch

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))


def sync_free() -> tuple[bool, str]:
    """The CUDA sync-free test, in a fresh process (pytest's own output kept to its last line)."""
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                          str(HERE.parent / "tests" / "core" / "test_trainer_sync_free.py"), "-k", "cuda", "-rs"],
                         capture_output=True, text=True, cwd=HERE.parent)
    lines = [line for line in (out.stdout + out.stderr).strip().splitlines() if line.strip()]
    last = lines[-1] if lines else "(no output)"
    return out.returncode == 0 and "passed" in last and "skipped" not in last, last


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="the overhead case only in bf16/fp16; compile on one case")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench/gpu_check.py needs a CUDA device and this machine has none (torch.cuda.is_available() "
                 "is False): nothing was run. Run it on a GPU machine.")
    import peers  # noqa: E402  (after the CUDA check: it imports mtlab and the models)

    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    ok, last = sync_free()
    table: list[tuple[str, str, str]] = [("sync-free step (set_sync_debug_mode('error'))", "pass" if ok else "FAIL", last)]
    print(f"sync-free: {'pass' if ok else 'FAIL'} ({last})", flush=True)

    print(f"{'case':<10}{'system':<12}{'ms/step':>10}{'ratio':>8}{'spread':>9}{'peak MB':>12}{'ratio':>8}")
    mixed_cases = ("overhead",) if args.quick else ("compute", "overhead", "multitask")
    runs = [("32", c) for c in ("compute", "overhead", "multitask")]
    runs += [(p, c) for p in ("bf16-mixed", "16-mixed") for c in mixed_cases]
    for precision, case in runs:
        tag = case if precision == "32" else f"{case} {precision}"
        print(f"-- {tag}", flush=True)
        for row in peers.run_case(case, args.rounds, "cuda", precision=precision):
            print(peers.format_row(row), flush=True)
            if "ratio" in row and row["system"] != peers.LOOP:
                table.append((f"{tag}: {row['system']} time / loop", f"{row['ratio']:.3f}",
                              f"±{row['spread']:.3f}, {row['ms_per_step']:.2f} ms/step"))
            if "mem_ratio" in row and row["system"] == "mtlab":
                table.append((f"{tag}: mtlab peak GPU memory / loop", f"{row['mem_ratio']:.3f}",
                              f"{row['peak_mb']:.1f} MB"))
    import compile as compile_bench  # noqa: E402  (bench/compile.py)

    for case in ("compute",) if args.quick else ("compute", "overhead"):
        row = compile_bench.run(case, "cuda", rounds=args.rounds)
        print(compile_bench.format_row(row), flush=True)
        table.append((f"{case}: mtlab compile=True time / eager", f"{row['ratio']:.3f}",
                      f"±{row['spread']:.3f}, {row['compiled_ms']:.2f} vs {row['eager_ms']:.2f} ms/step, "
                      f"compiled in {row['compile_s']:.0f} s"))

    print("\nsummary")
    width = max(len(k) for k, _, _ in table)
    for key, value, detail in table:
        print(f"  {key:<{width}}  {value:>7}  {detail}")
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
