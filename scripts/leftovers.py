"""What a test run left in the checkout, compared with what was there before it (``.ci/run``).

    python scripts/leftovers.py snapshot FILE   # before: every untracked, ignored or modified path, with its size and time
    python scripts/leftovers.py check FILE      # after: lists what is new, changed or gone since; exit 1 if anything

Files that were there before (an experiment folder the demo wrote, a virtual environment inside the checkout, an
edit not yet committed) are the user's and are left out; so are the caches that Python, mypy, ruff, pip's editable
install and the docs build write (``IGNORED``). Only the standard library and ``git`` are needed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

# Caches a run may write anywhere in the checkout, by one part of the path: Python's bytecode, mypy's and ruff's
# caches, the editable install's metadata, the docs build's (mkdocs-material's) cache at the top.
IGNORED_PARTS = ("__pycache__", ".mypy_cache", ".ruff_cache")
IGNORED_SUFFIXES = (".egg-info",)
IGNORED_TOP = (".cache",)

Fingerprint = tuple[str, int, int]  # git's status code, size, modification time (ns); -1, -1 for a folder


def ignored(path: str) -> bool:
    """A cache path that may appear (or change) during a run."""
    parts = Path(path).parts
    return (bool(parts) and parts[0] in IGNORED_TOP) or any(
        p in IGNORED_PARTS or p.endswith(IGNORED_SUFFIXES) for p in parts)


def status(root: Path) -> dict[str, Fingerprint]:
    """Every path ``git status`` lists in ``root`` (untracked and ignored files one by one, modified tracked
    files), caches left out, with what identifies its content."""
    out = subprocess.run(["git", "status", "--porcelain=v1", "-z", "--ignored", "--untracked-files=all", "--", "."],
                         cwd=root, capture_output=True, text=True, check=True).stdout
    entries: dict[str, Fingerprint] = {}
    records = out.split("\0")
    i = 0
    while i < len(records):
        record = records[i]
        i += 1
        if len(record) < 4:
            continue
        code, path = record[:2], record[3:]
        if code[0] in "RC":  # a rename or copy: the next record is the old path
            i += 1
        if ignored(path):
            continue
        full = root / path
        try:
            st = full.lstat()
            entries[path] = (code, st.st_size, st.st_mtime_ns) if not full.is_dir() else (code, -1, -1)
        except FileNotFoundError:  # deleted tracked file
            entries[path] = (code, -1, -1)
    return entries


def leftovers(before: dict[str, Fingerprint], after: dict[str, Fingerprint]) -> list[str]:
    """``git status``-like lines for what is new, changed or gone in ``after``."""
    lines = [f"{after[p][0]} {p}" + (" (changed)" if p in before else "")
             for p in sorted(after) if before.get(p) != after[p]]
    lines += [f"gone {p}" for p in sorted(before) if p not in after]
    return lines


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("snapshot", "check"):
        print(__doc__, file=sys.stderr)
        return 2
    command, file = argv[0], Path(argv[1])
    top = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=False)
    if top.returncode != 0:  # a source archive, not a clone: nothing to compare with
        print(f"leftovers.py {command}: not a git checkout, so the check that the tests leave it as they found it "
              "is skipped", file=sys.stderr)
        return 0
    root = Path(top.stdout.strip())
    now = status(root)
    if command == "snapshot":
        file.write_text(json.dumps(now))
        return 0
    before = {p: (f[0], f[1], f[2]) for p, f in json.loads(file.read_text()).items()}
    found = leftovers(before, now)
    if found:
        print("\n".join(found))
        print(f"the test run left the files above in the checkout ({root}); what was there before it is not listed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
