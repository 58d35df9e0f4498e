"""bench/gpu_check.py without a GPU: the budget, the table, the rows it builds from the checks' outputs, the
exactness rows CPU against CPU, and the whole script as its CPU rehearsal (``--device cpu``). Never its timings."""

from __future__ import annotations

import importlib
import math
import subprocess
import sys
import time

import pytest
import torch

from helpers.paths import BENCH, REPO

if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
gpu_check = importlib.import_module("gpu_check")
Row, Check, Context = gpu_check.Row, gpu_check.Check, gpu_check.Context


def test_an_optional_check_runs_only_if_its_estimate_fits_in_what_is_left():
    assert gpu_check.skip_note(30, False, elapsed_s=100, budget_s=170) is None  # 30 <= 70
    note = gpu_check.skip_note(30, False, elapsed_s=150, budget_s=170)
    assert note.startswith("skipped: about 30 s, 20 s of the 170 s budget left") and "--full" in note
    assert gpu_check.skip_note(30, True, elapsed_s=500, budget_s=170) is None  # essential: always
    assert gpu_check.skip_note(30, False, elapsed_s=500, budget_s=math.inf) is None  # --full: no budget
    # the pace of the earlier checks scales the estimate: twice as slow as guessed, 30 s need 60
    assert gpu_check.pace([(10, 20), (20, 40)]) == 2 and gpu_check.pace([]) == 1
    assert gpu_check.pace([(10, 0.1)]) == gpu_check.MIN_PACE  # a fast check: later ones still count half
    assert gpu_check.skip_note(30, False, elapsed_s=120, budget_s=170, scale=2) is not None  # 60 > 50
    assert gpu_check.skip_note(30, False, elapsed_s=150, budget_s=170, scale=0.5) is None  # 15 <= 20


def test_run_checks_skips_what_would_pass_the_budget_and_times_every_row():
    ran = []

    def make(name, rows):
        def run(ctx):
            ran.append(name)
            return rows

        return run

    checks = [Check("essential", 5, make("essential", [Row("e", "pass", "ok"), Row("e2", "ok", "1")]),
                    essential=True, cuda_only=False, paced=False),
              Check("cheap", 1, make("cheap", [Row("c", "ok", "1")]), cuda_only=False),
              Check("dear", 60, make("dear", [Row("d", "ok", "1")]), cuda_only=False),
              Check("gpu", 1, make("gpu", [Row("g", "ok", "1")])),
              Check("broken", 1, lambda ctx: 1 / 0, cuda_only=False)]
    ctx = Context("cpu", 1, budget_s=170, start=time.perf_counter() - 150)  # 150 s gone: 20 s left (dear: 30 s at least)
    rows = gpu_check.run_checks(checks, ctx)
    assert ran == ["essential", "cheap"]
    by = {r.check: r for r in rows}
    assert by["dear"].status == "skipped" and "budget" in by["dear"].detail
    assert by["gpu"].status == gpu_check.NEEDS_CUDA
    assert by["broken"].status == "FAIL" and "ZeroDivisionError" in by["broken"].detail
    assert by["e"].seconds is not None and by["e2"].seconds is None  # the check's time on its first row
    assert all(r.seconds is not None for r in rows if r.check != "e2")
    assert gpu_check.exit_status(rows) == 1
    assert gpu_check.exit_status([r for r in rows if r.check != "broken"]) == 0


def test_the_table_has_a_line_per_row_the_total_and_the_verdict():
    rows = [Row("a check", "pass", "0 (bit-for-bit)", "detail a", 1.25), Row("same run", "ok", "1.000", "", None),
            Row("gone", "skipped", "-", "skipped: about 60 s", 0.0)]
    text = gpu_check.format_table(rows, total_s=12.34, budget_s=170, header="summary")
    lines = text.splitlines()
    assert lines[0] == "summary" and lines[1].split()[:3] == ["check", "status", "value"]
    assert "a check" in lines[2] and "1.2" in lines[2] and "detail a" in lines[2]
    assert lines[3].split()[-1] == "^"  # the same run as the row above
    assert lines[-1] == "total 12.3 s (budget 170 s); no check failed"
    failed = gpu_check.format_table([Row("x", "FAIL", "error", "", 0.5)], 1.0, math.inf)
    assert failed.splitlines()[-1] == "total 1.0 s (no budget); 1 check(s) FAILED: x"


def test_the_sync_free_row_passes_only_when_the_cuda_tests_ran_and_passed():
    assert gpu_check.sync_free_verdict(0, "......\n6 passed in 12.3s\n") == (True, "6 passed in 12.3s")
    assert not gpu_check.sync_free_verdict(0, "SKIPPED [6] needs a CUDA device\n6 skipped in 1.0s")[0]
    assert not gpu_check.sync_free_verdict(1, "F\n1 failed, 2 passed in 3s")[0]
    assert gpu_check.sync_free_verdict(0, "") == (False, "(no output)")


def test_the_exactness_rows_judge_each_gap_against_its_tolerance():
    ok = gpu_check.exactness_rows("cuda", d_mtlab=3e-6, d_same=4e-7, d_loop=2e-6, moved=3e-3)
    assert [r.status for r in ok] == ["pass", "pass", "ok"]
    assert "tolerance 1.0e-05" in ok[0].detail and "TF32 off" in ok[0].detail
    # a loop whose own device gap is large widens both bounds (Adam's steps on near-zero gradients)
    wide = gpu_check.exactness_rows("cuda", d_mtlab=1.5e-4, d_same=5e-5, d_loop=1e-4, moved=3e-3)
    assert [r.status for r in wide] == ["pass", "pass", "ok"] and "tolerance 2.0e-04" in wide[0].detail
    bad = gpu_check.exactness_rows("cuda", d_mtlab=1e-3, d_same=1e-3, d_loop=1e-7, moved=3e-3)
    assert [r.status for r in bad] == ["FAIL", "FAIL", "ok"]
    same = gpu_check.exactness_rows("cpu", 0.0, 0.0, 0.0, 3e-3)
    assert same[0].value == same[1].value == "0 (bit-for-bit)"


def test_max_abs_diff_is_over_every_parameter_and_refuses_different_names():
    a = {"w": torch.zeros(3), "b": torch.zeros(2)}
    assert gpu_check.max_abs_diff(a, {"w": torch.tensor([0.0, -0.5, 0.1]), "b": torch.zeros(2)}) == 0.5
    with pytest.raises(ValueError, match="different parameters"):
        gpu_check.max_abs_diff(a, {"w": torch.zeros(3)})


def test_strict_float32_turns_tf32_off_and_restores_the_settings():
    b = torch.backends
    before = (b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, b.cudnn.deterministic, b.cudnn.benchmark)
    with gpu_check.strict_float32():
        assert (b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, b.cudnn.deterministic, b.cudnn.benchmark) == \
            (False, False, True, False)
    assert (b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, b.cudnn.deterministic, b.cudnn.benchmark) == before


def test_peers_rows_put_the_baseline_first_and_list_what_was_not_measured():
    rows = [{"case": "overhead", "system": "mtlab", "ms_per_step": 4.2, "ratio": 1.05, "spread": 0.01,
             "peak_mb": 1.5, "mem_ratio": 1.01, "note": ""},
            {"case": "overhead", "system": "loop", "ms_per_step": 4.0, "ratio": 1.0, "spread": 0.0,
             "peak_mb": 1.49, "mem_ratio": 1.0, "note": ""},
            {"case": "overhead", "system": "lightning", "note": "not installed"}]
    out = gpu_check.peers_rows("overhead bf16-mixed", rows)
    assert [r.check for r in out] == ["overhead bf16-mixed: the loop (baseline)", "overhead bf16-mixed: mtlab time / loop",
                                      "overhead bf16-mixed: mtlab peak GPU memory / loop", "overhead bf16-mixed: lightning"]
    assert out[1].value == "1.050" and "4.20 ms/step" in out[1].detail and out[2].value == "1.010"
    assert out[3].status == "skipped" and out[3].detail == "not installed"


def test_the_compile_row_reads_bench_compile_s_printed_row():
    compile_bench = importlib.import_module("compile")
    line = compile_bench.format_row({"case": "compute", "eager_ms": 3500.0, "compiled_ms": 3804.5, "ratio": 1.087,
                                     "spread": 0.052, "compile_s": 8.4, "graphs": 1})
    row = gpu_check.compile_row("compute", "torch 2.x, device cuda\nheader\n" + line + "\n")
    assert row.status == "ok" and row.value == "1.087" and "compiled in 8 s, 1 graph(s)" in row.detail
    broken = gpu_check.compile_row("compute", "Traceback ...\nRuntimeError: no triton")
    assert broken.status == "FAIL" and "no triton" in broken.detail


def test_the_default_run_puts_the_essential_checks_first():
    checks = gpu_check.default_checks()
    assert [c.essential for c in checks[:2]] == [True, True] and not any(c.essential for c in checks[2:])
    assert checks[0].name == gpu_check.SYNC_FREE and checks[1].name == "exactness vs CPU"
    assert not checks[1].cuda_only and all(c.cuda_only for c in checks if c is not checks[1])
    assert len(gpu_check.full_checks()) > len(checks)


@pytest.mark.slow
def test_the_exactness_rows_cpu_against_cpu_are_bit_for_bit_and_mtlab_is_within_tolerance_of_the_loop():
    rows = gpu_check.check_exactness(Context("cpu", 1, math.inf))
    assert [r.status for r in rows] == ["pass", "pass", "ok"]
    assert rows[0].value == "0 (bit-for-bit)" and rows[2].value == "0 (bit-for-bit)"


@pytest.mark.slow
def test_a_speed_check_gives_its_rows_from_bench_peers_run_case():
    rows = gpu_check.peers_check("overhead")(Context("cpu", 1, math.inf, steps=1))
    names = [r.check for r in rows]
    assert names[0] == "overhead: the loop (baseline)" and "overhead: mtlab time / loop" in names
    assert "overhead: mtlab peak GPU memory / loop" in names


@pytest.mark.slow
def test_the_cpu_rehearsal_prints_the_table_and_exits_0():
    out = subprocess.run([sys.executable, str(BENCH / "gpu_check.py"), "--device", "cpu"], capture_output=True,
                         text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    table = out.stdout[out.stdout.index("summary"):].splitlines()
    assert table[1].split()[:3] == ["check", "status", "value"]
    rows = {line.split("  ")[0]: line for line in table[2:-1]}
    assert "pass" in rows["exactness vs CPU: mtlab on cpu against on cpu, 3 steps"]
    assert gpu_check.NEEDS_CUDA in rows[gpu_check.SYNC_FREE]
    assert sum(gpu_check.NEEDS_CUDA in line for line in table) == len(gpu_check.default_checks()) - 1
    assert table[-1].startswith("total ") and table[-1].endswith("no check failed")


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal of a machine without CUDA")
def test_without_cuda_it_refuses_with_a_sentence_and_exit_status_2():
    out = subprocess.run([sys.executable, str(BENCH / "gpu_check.py")], capture_output=True, text=True, cwd=REPO,
                         timeout=120)
    assert out.returncode == 2 and "needs a CUDA device" in out.stderr and "nothing was run" in out.stderr
