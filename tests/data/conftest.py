"""Fixtures for the data-layer tests."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.corpora import make_corpus


@pytest.fixture
def corpus(tmp_path: Path) -> Callable[..., Path]:
    """Factory: ``corpus(names, lengths=None)`` builds a tiny split under tmp_path and returns its folder."""

    def build(names: list[str] | None = None, lengths: list[int] | None = None) -> Path:
        return make_corpus(tmp_path, names or ["a", "b", "c"], lengths)

    return build


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: starts subprocesses (data workers); left out of the fast tier")
