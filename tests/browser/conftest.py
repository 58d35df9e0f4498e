"""The servers of the browser tests: JupyterLab (``lab``), Jupyter Notebook 7 (``notebook7``) and Voila
(``voila``), one of each per test, ended after it. Each test writes its notebooks into the served folder first."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers.paths import NOTEBOOKS
from helpers.servers import free_port, port_open, server

QUICKSTART = NOTEBOOKS / "01_quickstart.ipynb"


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[str]:
    """JupyterLab serving ``tmp_path / "lab"``, which holds a copy of the quickstart (the server may autosave
    outputs into it); its base URL."""
    pytest.importorskip("jupyterlab", reason="needs JupyterLab: pip install jupyterlab")
    pytest.importorskip("ipykernel", reason="needs ipykernel: pip install ipykernel")
    root = tmp_path / "lab"
    root.mkdir()
    shutil.copy(QUICKSTART, root / QUICKSTART.name)
    settings = tmp_path / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false", "checkForUpdates": false}')
    port = free_port()
    base = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            urllib.request.urlopen(f"{base}/api/status", timeout=2)
            return True
        except OSError:
            return False

    env = {**os.environ, "MTLAB_FAST": "1", "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings")}
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ServerApp.ip=127.0.0.1",
           f"--port={port}", "--IdentityProvider.token=", "--LabApp.expose_app_in_browser=True",
           f"--ServerApp.root_dir={root}"]
    with server("JupyterLab", cmd, ready, tmp_path / "lab.log", env=env):
        yield base


@pytest.fixture
def notebook7(tmp_path: Path) -> Iterator[str]:
    """Jupyter Notebook 7 serving ``tmp_path / "nb7"`` (the test writes its notebooks there); its base URL. The
    news toast is off as for JupyterLab (Notebook 7 reads the same settings)."""
    pytest.importorskip("notebook", minversion="7", reason="needs Jupyter Notebook 7: pip install 'notebook>=7'")
    pytest.importorskip("ipykernel", reason="needs ipykernel: pip install ipykernel")
    root = tmp_path / "nb7"
    root.mkdir()
    settings = tmp_path / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false", "checkForUpdates": false}')
    port = free_port()
    base = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            urllib.request.urlopen(f"{base}/api/status", timeout=2)
            return True
        except OSError:
            return False

    env = {**os.environ, "MTLAB_FAST": "1", "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings")}
    cmd = [sys.executable, "-m", "notebook", "--no-browser", "--allow-root", "--ServerApp.ip=127.0.0.1",
           f"--port={port}", "--IdentityProvider.token=", "--JupyterNotebookApp.expose_app_in_browser=True",
           f"--ServerApp.root_dir={root}"]
    with server("Jupyter Notebook", cmd, ready, tmp_path / "notebook7.log", env=env):
        yield base


@pytest.fixture
def voila(tmp_path: Path) -> Iterator[Callable[..., int]]:
    """``voila(*args)`` starts Voila (``MTLAB_FAST=1``) in ``tmp_path / "voila"``, where the test has written its
    notebooks, with ``args`` (a notebook to serve alone, or none: the folder) and returns its port."""
    pytest.importorskip("voila", reason="needs Voila: pip install voila")
    root = tmp_path / "voila"
    root.mkdir(exist_ok=True)
    with contextlib.ExitStack() as servers:

        def start(*args: str) -> int:
            port = free_port()
            cmd = [sys.executable, "-m", "voila", *args, "--no-browser", f"--port={port}", "--Voila.ip=127.0.0.1"]
            servers.enter_context(server("Voila", cmd, port_open(port), tmp_path / "voila.log", cwd=root,
                                         env={**os.environ, "MTLAB_FAST": "1"}))
            return port

        yield start
