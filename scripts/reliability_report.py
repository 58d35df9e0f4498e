"""Run the fault campaign and print how many cases of each kind were tried and whether all held.

    python scripts/reliability_report.py
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUITES = ["tests/integration/test_reliability.py", "tests/integration/test_properties.py",
          "tests/training/test_loop_interrupts.py", "tests/integration/test_bad_luck.py",
          "tests/integration/test_bad_luck_data.py", "tests/integration/test_bad_luck_runs.py",
          "tests/integration/test_bad_luck_args.py", "tests/docs/test_dotted_names.py"]
# Kinds of case the campaign must try (a prefix of each kind's name): a suite that stops recording one fails.
EXPECTED = ("refused stepwise call", "refused step()", "refused mtlab.run step", "composite refusal",
            "exception inside", "damaged checkpoint", "foreign checkpoint", "non-UTF-8 list", "float-WAV list",
            "non-finite value injected", "disk full while saving", "data file deleted mid-run",
            # round 4: bad luck (tests/integration/test_bad_luck.py, test_bad_luck_data.py)
            "Ctrl-C while final.pt is written", "skip with no readable file left", "half-loaded state refused",
            "regenerated corpus, stale header lengths", "DataError in a DataLoader worker", "DataError mid-stream",
            "documented module paths import", "message:", "exit code:", "wrong loss target", "busy machine",
            "honest progress",
            # round 5 (tests/integration/test_bad_luck_runs.py, test_bad_luck_args.py, tests/docs/test_dotted_names.py)
            "resume chooses:", "kill then resume:", "folder holds a run:", "damaged journal:",
            "disk full while journal.jsonl is written", "replay: progress and verdict", "option checked:",
            "noise scale:", "documented module paths import: every dotted name", "Ctrl-C inside")


def main() -> int:
    with tempfile.TemporaryDirectory() as d:
        log = Path(d) / "campaign.tsv"
        env = {**os.environ, "MTLAB_CAMPAIGN_LOG": str(log)}
        extra = [s for s in ("tests/training/test_schedule.py", "tests/apps/test_recipe.py", "tests/ui/test_view.py")
                 if (ROOT / s).exists()]
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SUITES, *extra],
                              cwd=ROOT, env=env, capture_output=True, text=True)
        rows = log.read_text().splitlines() if log.exists() else []
    counts: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for line in rows:
        kind, held = line.rsplit("\t", 1)
        counts[kind][0] += 1
        counts[kind][1] += int(held)
    width = max([len(k) for k in counts] + [10])
    print(f"{'kind of case':<{width}}  {'tried':>6}  {'held':>6}")
    for kind in sorted(counts):
        tried, held = counts[kind]
        print(f"{kind:<{width}}  {tried:>6}  {held:>6}")
    total = sum(c[0] for c in counts.values())
    held = sum(c[1] for c in counts.values())
    print(f"{'total':<{width}}  {total:>6}  {held:>6}")
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-500:]
    print(f"pytest: {summary}")
    missing = [k for k in EXPECTED if not any(kind.startswith(k) for kind in counts)]
    if missing:
        print(f"kinds never tried: {missing}")
    ok = proc.returncode == 0 and total == held and not missing
    print("ALL HELD" if ok else "SOME CASES FAILED: see pytest output above")
    if not ok:
        print(proc.stdout[-4000:])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
