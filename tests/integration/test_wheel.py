"""The built wheel carries the sample corpus, the recipes and the ``py.typed`` marker (PEP 561): installed into a
fresh virtual environment, ``mtlab demo --steps 2`` runs from another directory (about 30 s: build, install, two
steps), whether the tests run in a virtual environment or not."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from helpers.paths import REPO

pytestmark = pytest.mark.slow  # builds and installs a wheel in a subprocess



def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 120) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def outer_site_dirs() -> list[str]:
    """This interpreter's package folders (torch is there), whether it runs in a venv or not."""
    return [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()]


@pytest.mark.slow
def test_wheel_installs_and_runs_the_demo_elsewhere(tmp_path: Path) -> None:
    pytest.importorskip("setuptools", reason="building the wheel without isolation needs setuptools")
    env = {k: v for k, v in os.environ.items() if k not in ("MTLAB_DATA", "PYTHONPATH", "VIRTUAL_ENV")}
    env.update(OMP_NUM_THREADS="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    # Build from a copy of the project's files, so the checkout gets no build/ folder.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for name in ("mtlab", "data_samples", "recipes"):
        shutil.copytree(REPO / name, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"),
         str(src)], tmp_path, env, timeout=180)
    (wheel,) = (tmp_path / "dist").glob("mtlab-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    caches = (".samples.npz", ".stats.json")  # written beside the lists by streamed loading; not corpus files
    shipped = {str(p.relative_to(REPO)) for p in (REPO / "data_samples").rglob("*")
               if p.is_file() and not p.name.endswith(caches)}
    assert {f"mtlab/{p}" for p in shipped} <= names, "the wheel misses sample files"
    assert "mtlab/recipes/demo.toml" in names
    assert "mtlab/py.typed" in names, "no PEP 561 marker: type checkers in users' projects would ignore mtlab's hints"

    # A fresh environment that reuses this interpreter's packages (torch, pip) but not the checkout. Inside a
    # venv, ``-m venv --system-site-packages`` would see the BASE interpreter's packages only (often no
    # torch), so the new venv gets this environment's package folders through a .pth file.
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], tmp_path, env)
    python = venv / "bin" / "python"
    purelib = run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path, env)
    (Path(purelib.strip()) / "outer_environment.pth").write_text("\n".join(outer_site_dirs()) + "\n")
    run([str(python), "-m", "pip", "install", "--no-index", "--no-deps", "--force-reinstall", str(wheel)],
        tmp_path, env, timeout=180)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = run([str(python), "-c", "import mtlab, mtlab.data as d; print(mtlab.__file__); print(d.data_samples_dir())"],
                elsewhere, env).split()
    assert all(line.startswith(str(venv)) for line in where), where
    out = run([str(venv / "bin" / "mtlab"), "demo", "--steps", "2", "--no-progress"], elsewhere, env, timeout=240)
    assert (elsewhere / "exp" / "demo" / "final.pt").is_file(), out
    assert "experiment folder" in out
