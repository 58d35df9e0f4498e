"""Local servers for the slow tests (JupyterLab, Voila, process groups): a free port, and a server process
that is up before the test goes on and ended after it."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int) -> Callable[[], bool]:
    """Readiness by the TCP port alone (for Voila: each GET / would start a kernel)."""

    def ready() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False

    return ready


@contextlib.contextmanager
def server(name: str, cmd: list[str], ready: Callable[[], bool], log: Path, cwd: Path | None = None,
           env: dict[str, str] | None = None, start_s: float = 60) -> Iterator[subprocess.Popen]:
    """Starts ``cmd`` (stderr into ``log``), waits until ``ready()``; fails the test naming ``log`` when the
    process ends or ``start_s`` pass first; terminates the process (then kills it) on exit."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=log.open("w"))
    try:
        end = time.monotonic() + start_s
        while not ready():
            if proc.poll() is not None or time.monotonic() > end:
                pytest.fail(f"{name} did not start; see {log}")
            time.sleep(0.3)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
