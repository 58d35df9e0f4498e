"""The documentation site, built once per test session (``mkdocs build --strict`` into a temporary folder),
for the tests that read it or serve it."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from helpers.paths import REPO as ROOT


@functools.cache
def built_site() -> Path:
    """The site folder; a failed strict build fails the test with mkdocs' warnings. ``MTLAB_DOCS_SITE`` names a
    site already built strictly from this checkout (``.ci/run`` builds one before the tests)."""
    given = os.environ.get("MTLAB_DOCS_SITE")
    if given and (Path(given) / "index.html").exists():
        return Path(given)
    pytest.importorskip("mkdocs", reason="the docs need the docs extra: pip install -e '.[docs]'")
    pytest.importorskip("mkdocstrings", reason="the docs need the docs extra: pip install -e '.[docs]'")
    out = Path(tempfile.mkdtemp(prefix="mtlab_site_"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
           "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return out
