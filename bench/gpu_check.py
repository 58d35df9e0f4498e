"""The GPU checks in one unattended run of under 3 minutes, one table: sync-free step, exactness, speed, memory.

On a CUDA machine it runs, cheap essential checks first:

1. **no host sync per step**: tests/core/test_trainer_sync_free.py's CUDA test, whose step runs under
   ``torch.cuda.set_sync_debug_mode("error")`` (any host read in process_minibatch -> normalize -> clip -> apply
   under ``nonfinite="skip"`` fails it), in float32, bf16-mixed and 16-mixed; pass or FAIL;
2. **exactness vs CPU**: a small mtlab trainer of two tasks sharing a BLSTM encoder (bench/peers.py's
   multitask case, small) trains a few steps on CUDA and on the CPU from the same initial weights and data, and
   so does the loop a user writes for it (``peers.mt_loop``); in float32 with TF32 off and cuDNN deterministic.
   Rows: the largest parameter difference of mtlab on CUDA against mtlab on the CPU (passes within
   ``max(TOL_DEVICE, 2 x the user's loop's own CUDA-to-CPU difference)``), of mtlab against the loop on the
   same device (passes within ``max(TOL_SAME, the loop's own CUDA-to-CPU difference)``; "bit-for-bit" when
   equal), and the loop's own CUDA-to-CPU difference, the reference: Adam divides each gradient by its root
   mean square, so a component near zero turns a rounding difference into a larger step, in the loop as in
   mtlab, and the loop's gap says how large that is on this GPU;
3. bench/peers.py on the GPU (mtlab, the loop a user writes, Accelerate, Lightning in the first case; wall clock
   with a synchronize per step) and peak GPU memory (``torch.cuda.max_memory_allocated`` over one step after a
   warm-up step): the overhead-bound case, two tasks sharing an encoder, the compute-bound case, then the
   overhead-bound case in bf16-mixed and the streaming one in 16-mixed (the user's AMP loop with a GradScaler);
4. mtlab's step eager against ``compile=True`` (bench/compile.py, in a subprocess stopped at the budget).

A total time budget (``--budget-s``, 170 s by default, counted from the script's start) decides: the essential
checks (1, 2) always run; each later one runs only if its estimate (a guess per check, scaled by how the earlier
speed checks compared with their guesses) fits in what is left, and is otherwise listed as skipped with a
note. ``--full`` runs the earlier, longer set with no budget: every case in float32, bf16-mixed and 16-mixed,
Lightning in every case, compile on two cases (about 5-8 minutes).

Every row carries its time (``^``: the same run as the row above); the total time is printed at the end. Exit
status: 0 when every check passed, 1 when one failed, 2 when there is no CUDA device (nothing is run).

``--device cpu`` is a **rehearsal** on a machine without a GPU: the exactness rows CPU against CPU, the
budget and the table, every CUDA-only row listed as "needs CUDA". It checks the script, not the GPU.

    python bench/gpu_check.py                 # under 3 minutes on one GPU
    python bench/gpu_check.py --full          # the longer run (about 5-8 minutes)
    python bench/gpu_check.py --device cpu    # the rehearsal, here
    python bench/gpu_check.py --budget-s 120 --rounds 5
"""

from __future__ import annotations

import time

START = time.perf_counter()  # the budget counts from here (the imports are part of an unattended run)

import argparse  # noqa: E402
import contextlib  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

BUDGET_S = 170.0
SYNC_FREE_TIMEOUT_S = 120.0  # the sync-free test in its own process; a hang fails it instead of the run
EXACT_STEPS = 3  # optimizer steps (each of K = 4 minibatches per task) of the exactness rows
TOL_DEVICE = 1e-5  # mtlab on CUDA against mtlab on the CPU (or 2x the plain loop's own gap, if larger)
TOL_SAME = 1e-6  # mtlab against the user's loop on one device (or the loop's own device gap, if larger): the
# order of the sums and mtlab's fused Adam against torch's default one; on the CPU 1.5e-8 was measured
NEEDS_CUDA = "needs CUDA"


@dataclass
class Row:
    check: str
    status: str  # "pass", "FAIL", "ok" (a measurement, no pass criterion), "skipped", NEEDS_CUDA
    value: str = "-"
    detail: str = ""
    seconds: float | None = None  # the check's time; None: the same run as the row above


@dataclass
class Check:
    name: str
    estimate_s: float  # a guess for one GPU (never yet measured on one); scaled by the pace of earlier checks
    run: Callable[[Context], list[Row]]
    essential: bool = False  # runs whatever the budget
    cuda_only: bool = True
    paced: bool = True  # its time tells the pace of the later ones (the in-process speed checks)


@dataclass
class Context:
    device: str
    rounds: int
    budget_s: float
    steps: int | None = None  # steps per round of the speed rows (None: bench/peers.py's per case)
    start: float = START
    done: list[tuple[float, float]] = field(default_factory=list)  # (estimate, seconds) of the paced checks

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return self.budget_s - self.elapsed()


# ----------------------------------------------------------------------------- the budget and the table
MIN_PACE = 0.5  # a check that went faster than guessed lets the later ones count on half their estimate, no less


def pace(done: list[tuple[float, float]]) -> float:
    """How the paced checks so far compared with their estimates: their seconds over their estimates, at least
    MIN_PACE (1 before any ran)."""
    est = sum(e for e, _ in done)
    return max(sum(t for _, t in done) / est, MIN_PACE) if est > 0 else 1.0


def skip_note(estimate_s: float, essential: bool, elapsed_s: float, budget_s: float, scale: float = 1.0) -> str | None:
    """None when the check runs; otherwise the note of its row. An essential check always runs; another runs
    when its scaled estimate fits in what is left of the budget."""
    if essential or math.isinf(budget_s):
        return None
    need, left = estimate_s * scale, budget_s - elapsed_s
    if need <= left:
        return None
    return (f"skipped: about {need:.0f} s, {max(left, 0):.0f} s of the {budget_s:g} s budget left "
            "(--full runs it, or a larger --budget-s)")


def format_table(rows: list[Row], total_s: float, budget_s: float, header: str = "") -> str:
    """The printed table: one line per row (check, status, value, seconds, detail), then the total time and
    the verdict."""
    wc = max([len("check")] + [len(r.check) for r in rows])
    wv = max([len("value")] + [len(r.value) for r in rows])
    ws = max([len("status")] + [len(r.status) for r in rows])
    lines = [header] if header else []
    lines.append(f"{'check':<{wc}}  {'status':<{ws}}  {'value':>{wv}}  {'s':>6}  detail")
    for r in rows:
        s = f"{r.seconds:6.1f}" if r.seconds is not None else f"{'^':>6}"
        lines.append(f"{r.check:<{wc}}  {r.status:<{ws}}  {r.value:>{wv}}  {s}  {r.detail}".rstrip())
    failed = [r.check for r in rows if r.status == "FAIL"]
    budget = "no budget" if math.isinf(budget_s) else f"budget {budget_s:g} s"
    lines.append(f"total {total_s:.1f} s ({budget}); "
                 + (f"{len(failed)} check(s) FAILED: {'; '.join(failed)}" if failed else "no check failed"))
    return "\n".join(lines)


def exit_status(rows: list[Row]) -> int:
    return 1 if any(r.status == "FAIL" for r in rows) else 0


# ----------------------------------------------------------------------------- 1. no host sync per step
SYNC_FREE = "no host sync per step (set_sync_debug_mode('error'))"


def sync_free_verdict(returncode: int, output: str) -> tuple[bool, str]:
    """Whether pytest's run of the CUDA sync-free test passed (and ran: a skip is no pass), and its last line."""
    lines = [line for line in output.strip().splitlines() if line.strip()]
    last = lines[-1].strip() if lines else "(no output)"
    return returncode == 0 and "passed" in last and "skipped" not in last and "failed" not in last, last


def check_sync_free(ctx: Context) -> list[Row]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
           str(HERE.parent / "tests" / "core" / "test_trainer_sync_free.py"), "-k", "cuda", "-rs"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE.parent, timeout=SYNC_FREE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return [Row(SYNC_FREE, "FAIL", "timeout", f"no result within {SYNC_FREE_TIMEOUT_S:g} s")]
    ok, last = sync_free_verdict(out.returncode, out.stdout + out.stderr)
    return [Row(SYNC_FREE, "pass" if ok else "FAIL", "pass" if ok else "fail",
                f"{last} (float32, bf16-mixed, 16-mixed; tests/core/test_trainer_sync_free.py -k cuda)")]


# ----------------------------------------------------------------------------- 2. exactness vs CPU
@contextlib.contextmanager
def strict_float32() -> Iterator[None]:
    """float32 as it is: no TF32 in matmuls or cuDNN, cuDNN deterministic and not autotuned; restored after."""
    b = torch.backends
    before = (b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, b.cudnn.deterministic, b.cudnn.benchmark)
    b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, b.cudnn.deterministic, b.cudnn.benchmark = False, False, True, False
    try:
        yield
    finally:
        b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, b.cudnn.deterministic, b.cudnn.benchmark = before


def trained(system: str, device: str, steps: int = EXACT_STEPS, hidden: int = 16) -> dict[str, torch.Tensor]:
    """The parameters (CPU copies) after ``steps`` steps of bench/peers.py's two-task system ``system``
    ("mtlab" or "loop") on ``device``, from the same initial weights (seed 0) and the same batches."""
    import peers

    models = peers.mt_models(hidden)  # built on the CPU with the same seed, then moved by the system
    s = {"mtlab": peers.mt_mtlab, peers.LOOP: peers.mt_loop}[system](models, peers.mt_examples(64, 5, 20), 4, device)
    for _ in range(steps):
        s.step()
    return {f"{k}.{n}": p.detach().float().cpu().clone() for k, m in models.items() for n, p in m.named_parameters()}


def initial(hidden: int = 16) -> dict[str, torch.Tensor]:
    import peers

    return {f"{k}.{n}": p.detach().clone() for k, m in peers.mt_models(hidden).items() for n, p in m.named_parameters()}


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest absolute difference over every parameter of two state dicts with the same names."""
    if sorted(a) != sorted(b):
        raise ValueError(f"different parameters: {sorted(set(a) ^ set(b))}")
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def exactness_rows(device: str, d_mtlab: float, d_same: float, d_loop: float, moved: float,
                   steps: int = EXACT_STEPS) -> list[Row]:
    """The exactness rows from the measured differences: mtlab on ``device`` against on the CPU, mtlab against
    the plain loop on ``device``, the plain loop's own ``device``-to-CPU difference."""
    bound = max(TOL_DEVICE, 2 * d_loop)
    bound_same = max(TOL_SAME, d_loop)
    setting = "float32, TF32 off, cudnn deterministic"
    same = "0 (bit-for-bit)" if d_same == 0 else f"{d_same:.2e}"
    return [
        Row(f"exactness vs CPU: mtlab on {device} against on cpu, {steps} steps", "pass" if d_mtlab <= bound else "FAIL",
            "0 (bit-for-bit)" if d_mtlab == 0 else f"{d_mtlab:.2e}",
            f"max |param diff|; tolerance {bound:.1e} = max({TOL_DEVICE:.0e}, 2 x the loop's own gap); "
            f"params moved up to {moved:.1e}; {setting}"),
        Row(f"exactness: mtlab against the plain loop on {device}", "pass" if d_same <= bound_same else "FAIL", same,
            f"max |param diff|; tolerance {bound_same:.1e} = max({TOL_SAME:.0e}, the loop's own gap) "
            "(bench/peers.py mt_loop: same weights and batches)", None),
        Row(f"exactness: the plain loop on {device} against on cpu", "ok",
            "0 (bit-for-bit)" if d_loop == 0 else f"{d_loop:.2e}", "the reference: PyTorch's own device gap", None),
    ]


def check_exactness(ctx: Context) -> list[Row]:
    with strict_float32():
        ref = trained("mtlab", "cpu")
        dev = trained("mtlab", ctx.device)
        loop = trained("loop", ctx.device)
        loop_ref = trained("loop", "cpu")
    moved = max_abs_diff(ref, initial())
    return exactness_rows(ctx.device, max_abs_diff(dev, ref), max_abs_diff(dev, loop), max_abs_diff(loop, loop_ref),
                          moved)


# ----------------------------------------------------------------------------- 3. bench/peers.py on the GPU
def peers_rows(tag: str, rows: list[dict], loop: str = "loop") -> list[Row]:
    """bench/peers.py's rows of one case as table rows: the loop's ms/step (the baseline), every other system's
    time over the loop's, mtlab's peak GPU memory over the loop's; systems not measured as one skipped row."""
    out: list[Row] = []
    unmeasured = [r for r in rows if "ms_per_step" not in r]
    for r in sorted(rows, key=lambda r: r["system"] != loop):  # the baseline first
        if "ms_per_step" not in r:
            continue
        if r["system"] == loop:
            mem = f", peak {r['peak_mb']:.1f} MB" if "peak_mb" in r else ""
            out.append(Row(f"{tag}: the loop (baseline)", "ok", f"{r['ms_per_step']:.2f} ms", f"per step{mem}"))
            continue
        out.append(Row(f"{tag}: {r['system']} time / loop", "ok", f"{r['ratio']:.3f}",
                       f"±{r['spread']:.3f}, {r['ms_per_step']:.2f} ms/step"))
        if "mem_ratio" in r and r["system"] == "mtlab":
            out.append(Row(f"{tag}: mtlab peak GPU memory / loop", "ok", f"{r['mem_ratio']:.3f}", f"{r['peak_mb']:.1f} MB"))
    if unmeasured:
        notes = sorted({r.get("note", "") for r in unmeasured})
        out.append(Row(f"{tag}: {', '.join(r['system'] for r in unmeasured)}", "skipped", "-", "; ".join(notes)))
    return out


def peers_check(case: str, precision: str = "32", lightning: bool = False) -> Callable[[Context], list[Row]]:
    def run(ctx: Context) -> list[Row]:
        import peers

        tag = case if precision == "32" else f"{case} {precision}"
        rows = peers.run_case(case, ctx.rounds, ctx.device, ctx.steps, precision=precision, lightning=lightning)
        for r in rows:
            print("   ", peers.format_row(r), flush=True)
        return peers_rows(tag, rows, peers.LOOP)

    return run


# ----------------------------------------------------------------------------- 4. compile
COMPILE_ROW = re.compile(r"^(?P<case>\S+)\s+(?P<eager>[\d.]+)\s+(?P<compiled>[\d.]+)\s+(?P<ratio>[\d.]+)\s+"
                         r"±(?P<spread>[\d.]+)\s+(?P<compile_s>[\d.]+)\s+(?P<graphs>\d+)\s*$")


def compile_row(case: str, output: str) -> Row:
    """The table row from bench/compile.py's printed row for ``case`` (FAIL when there is none)."""
    for line in output.splitlines():
        m = COMPILE_ROW.match(line.strip())
        if m and m["case"] == case:
            return Row(COMPILE.format(case), "ok", f"{float(m['ratio']):.3f}",
                       f"±{float(m['spread']):.3f}, {float(m['compiled']):.2f} vs {float(m['eager']):.2f} ms/step, "
                       f"compiled in {float(m['compile_s']):.0f} s, {m['graphs']} graph(s)")
    lines = [line for line in output.strip().splitlines() if line.strip()]
    return Row(COMPILE.format(case), "FAIL", "error", lines[-1][:160] if lines else "(no output)")


def compile_check(case: str) -> Callable[[Context], list[Row]]:
    def run(ctx: Context) -> list[Row]:
        cmd = [sys.executable, str(HERE / "compile.py"), "--device", ctx.device, "--case", case,
               "--rounds", str(ctx.rounds)]
        timeout = None if math.isinf(ctx.budget_s) else max(ctx.left(), 1.0)
        t0 = time.perf_counter()
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE.parent, timeout=timeout)
        except subprocess.TimeoutExpired:
            return [Row(COMPILE.format(case), "skipped", "-",
                        f"stopped at the budget after {time.perf_counter() - t0:.0f} s (--full lets it finish)")]
        return [compile_row(case, out.stdout + out.stderr)]

    return run


# ----------------------------------------------------------------------------- the runs
def speed(tag: str) -> str:
    return f"{tag}: speed, peak memory (bench/peers.py)"


COMPILE = "{}: mtlab compile=True time / eager"


def default_checks() -> list[Check]:
    """The default run, cheap essential checks first."""
    return [
        Check(SYNC_FREE, 30, check_sync_free, essential=True, paced=False),
        Check("exactness vs CPU", 10, check_exactness, essential=True, cuda_only=False, paced=False),
        Check(speed("overhead"), 40, peers_check("overhead", lightning=True)),
        Check(speed("multitask"), 15, peers_check("multitask")),
        Check(speed("compute"), 15, peers_check("compute")),
        Check(speed("overhead bf16-mixed"), 15, peers_check("overhead", "bf16-mixed")),
        Check(speed("overhead-streaming 16-mixed"), 20, peers_check("overhead-streaming", "16-mixed")),
        Check(COMPILE.format("compute"), 60, compile_check("compute"), paced=False),
    ]


def full_checks() -> list[Check]:
    """The earlier, longer run: every case in three precisions with Lightning, compile on two cases."""
    checks = default_checks()[:2]
    for precision in ("32", "bf16-mixed", "16-mixed"):
        for case in ("compute", "overhead", "multitask"):
            tag = case if precision == "32" else f"{case} {precision}"
            checks.append(Check(speed(tag), 30, peers_check(case, precision, lightning=True)))
    checks.append(Check(speed("overhead-streaming 16-mixed"), 30, peers_check("overhead-streaming", "16-mixed", True)))
    checks += [Check(COMPILE.format(c), 60, compile_check(c), paced=False) for c in ("compute", "overhead")]
    return checks


def run_checks(checks: list[Check], ctx: Context) -> list[Row]:
    rows: list[Row] = []
    for check in checks:
        if check.cuda_only and ctx.device != "cuda":
            rows.append(Row(check.name, NEEDS_CUDA, "-", f"not run in the CPU rehearsal (estimate on a GPU: "
                            f"{check.estimate_s:g} s{', essential' if check.essential else ''})", 0.0))
            continue
        note = skip_note(check.estimate_s, check.essential, ctx.elapsed(), ctx.budget_s, pace(ctx.done))
        if note:
            rows.append(Row(check.name, "skipped", "-", note, 0.0))
            print(f"-- {check.name}: {note}", flush=True)
            continue
        print(f"-- {check.name} ({ctx.elapsed():.0f} s so far)", flush=True)
        t0 = time.perf_counter()
        try:
            got = check.run(ctx)
        except Exception as e:  # one check's error is its row; the others still run
            got = [Row(check.name, "FAIL", "error", f"{type(e).__name__}: {e}"[:200])]
        took = time.perf_counter() - t0
        got = got or [Row(check.name, "FAIL", "-", "the check gave no row")]
        if check.paced:
            ctx.done.append((check.estimate_s, took))
        got[0].seconds = took
        for r in got:
            print(f"   {r.check}: {r.status} {r.value} {r.detail}", flush=True)
        rows += got
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cuda (the checks) or cpu (a rehearsal: the exactness rows CPU vs CPU and the table)")
    ap.add_argument("--budget-s", type=float, default=BUDGET_S,
                    help="total seconds from the start: later checks that would not fit are skipped with a note")
    ap.add_argument("--full", action="store_true", help="the longer run (every case and precision, compile twice), "
                    "no budget")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the speed rows")
    ap.add_argument("--quick", action="store_true", help=argparse.SUPPRESS)  # the old short run: now the default
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench/gpu_check.py needs a CUDA device and this machine has none (torch.cuda.is_available() is "
              "False): nothing was run. Run it on a GPU machine, or `--device cpu` for a rehearsal of the script.",
              file=sys.stderr)
        sys.exit(2)
    import common

    common.set_threads()  # one CPU thread, as bench/peers.py (the CPU side of the exactness rows too)
    budget = math.inf if args.full else args.budget_s
    ctx = Context(args.device, args.rounds, budget)
    where = torch.cuda.get_device_name() if args.device == "cuda" else "CPU rehearsal (no GPU work)"
    header = (f"torch {torch.__version__}, {where}, {'--full' if args.full else 'default run'}, "
              f"{'no budget' if args.full else f'budget {budget:g} s'}, rounds {args.rounds}")
    print(header, flush=True)
    rows = run_checks(full_checks() if args.full else default_checks(), ctx)
    print()
    print(format_table(rows, ctx.elapsed(), budget, header="summary (s: seconds of the check; ^: the same run as above)"))
    sys.exit(exit_status(rows))


if __name__ == "__main__":
    main()
