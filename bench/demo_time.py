"""The main job's cost: ``python -m mtlab demo`` (the README's first command after the install) run as a newcomer
runs it, in a fresh folder, timed from outside: wall time, CPU time (the process and its children) and the
machine's load beside it. Also the longest silence on its output (the demo must never go quiet for long).

    python bench/demo_time.py            # the demo as shipped
    python bench/demo_time.py --full     # the whole recipe (mtlab demo --full)
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="time `mtlab demo --full` (the whole recipe)")
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as folder:
        cmd = [sys.executable, "-m", "mtlab", "demo", "--expdir", str(Path(folder) / "demo"), *(["--full"] * args.full)]
        env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        t0 = time.monotonic()
        last, silence = t0, 0.0
        with subprocess.Popen(cmd, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as proc:
            assert proc.stdout is not None
            while proc.stdout.read1(4096):  # type: ignore[attr-defined]
                now = time.monotonic()
                silence, last = max(silence, now - last), now
            code = proc.wait()
        wall = time.monotonic() - t0
        silence = max(silence, time.monotonic() - last)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = usage.ru_utime + usage.ru_stime
    print(f"{' '.join(['mtlab', 'demo', *(['--full'] * args.full)])}: exit {code}, {wall:.1f} s wall, {cpu:.1f} s CPU, "
          f"longest silence {silence:.1f} s; load {load_before:.2f} before, {os.getloadavg()[0]:.2f} after, "
          f"{os.cpu_count()} CPUs")
    sys.exit(code)


if __name__ == "__main__":
    main()
