"""The checkout's folders, for tests and helpers wherever their file sits (moving a test file moves no path)."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]  # tests/
REPO = TESTS.parent  # the checkout
MTLAB = REPO / "mtlab"
NOTEBOOKS = REPO / "notebooks"
RECIPES = REPO / "recipes"
SCRIPTS = REPO / "scripts"
BENCH = REPO / "bench"  # the benchmark scripts (tests/bench/ imports them by path)
DATA_SAMPLES = REPO / "data_samples"
TF_FIXTURE = TESTS / "nabu_tf_fixture"  # the original's TensorFlow checkpoints, written by its make_*.py
PUBLIC_API = TESTS / "public_api_0.2.json"


def _shared_nabu() -> Path:
    """The original system's checkout (Nabu-MSSS): ``shared/nabu`` in the checkout or next to it or to one of
    its parent folders (CI checks it out next to the repository; a worktree sits one folder further down)."""
    for folder in (REPO, *REPO.parents):
        candidate = folder / "shared" / "nabu"
        if candidate.is_dir():
            return candidate
    return REPO.parent / "shared" / "nabu"  # absent: the tests that need it skip with a reason


SHARED_NABU = _shared_nabu()
NABU_RECIPES = SHARED_NABU / "config" / "recipes"
