"""scripts/leftovers.py, the end of ``.ci/run``: what the README's first command (the demo) wrote before the tests
is the user's, what appears or changes during them is the tests'."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.paths import REPO, SCRIPTS

SCRIPT = SCRIPTS / "leftovers.py"


def git(repo: Path, *args: str) -> None:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True)


def leftovers(repo: Path, command: str, snapshot: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), command, str(snapshot)], cwd=repo, capture_output=True,
                          text=True, timeout=60, check=False)


@pytest.mark.slow  # git in a subprocess
def test_what_the_demo_wrote_before_the_tests_is_not_blamed_on_them(tmp_path: Path) -> None:
    repo = tmp_path / "clone"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / ".gitignore").write_text((REPO / ".gitignore").read_text())  # the project's own: /exp/ is ignored
    (repo / "README.md").write_text("readme\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "start")
    # The README's first command: `python -m mtlab demo` writes exp/demo; the user has an edit of their own.
    (repo / "exp" / "demo").mkdir(parents=True)
    (repo / "exp" / "demo" / "final.pt").write_bytes(b"demo checkpoint")
    (repo / "notes.txt").write_text("mine\n")
    snapshot = tmp_path / "before.json"
    assert leftovers(repo, "snapshot", snapshot).returncode == 0

    # A clean test run: only caches appear (bytecode, the docs build's .cache/, an editable install's egg-info).
    for cache in ("pkg/__pycache__/m.cpython-311.pyc", ".cache/plugin/x", "mtlab.egg-info/PKG-INFO",
                  ".mypy_cache/3.11/x.json"):
        (repo / cache).parent.mkdir(parents=True, exist_ok=True)
        (repo / cache).write_text("cache")
    clean = leftovers(repo, "check", snapshot)
    assert clean.returncode == 0, clean.stdout + clean.stderr

    # A test that writes into the checkout: a new file beside the demo's, one changed, a tracked file edited.
    (repo / "exp" / "test-run").mkdir()
    (repo / "exp" / "test-run" / "history.csv").write_text("step\n")
    (repo / "exp" / "demo" / "final.pt").write_bytes(b"overwritten by a test")
    (repo / "README.md").write_text("changed\n")
    dirty = leftovers(repo, "check", snapshot)
    assert dirty.returncode == 1
    listed = dirty.stdout.splitlines()
    assert "!! exp/test-run/history.csv" in listed
    assert "!! exp/demo/final.pt (changed)" in listed
    assert " M README.md" in listed
    assert not [line for line in listed if "notes.txt" in line or "cache" in line], listed
    assert "left the files above in the checkout" in dirty.stdout


def test_ci_run_takes_the_snapshot_before_installing_and_checks_after_both_tiers() -> None:
    """The order in .ci/run: snapshot, install, docs build, the two tiers, check (read from the script)."""
    lines = (REPO / ".ci" / "run").read_text().splitlines()

    def first(pattern: str) -> int:
        found = [i for i, line in enumerate(lines) if re.search(pattern, line) and not line.lstrip().startswith("#")]
        assert found, f".ci/run has no line matching {pattern!r}"
        return found[0]

    assert (first(r"scripts/leftovers\.py snapshot") < first(r"pip install") < first(r"mkdocs build")
            < first(r'"fast tier"') < first(r'"slow tier"') < first(r"scripts/leftovers\.py check"))
