"""The guide "Bring your own PyTorch: optimizer, schedulers, freezing, knobs" (docs/guides/own_pytorch.md): its
examples run, in order, as doctests."""

from __future__ import annotations

import pytest

from helpers.guides import run_guide
from helpers.paths import REPO


@pytest.mark.slow  # a few seconds of CPU: the full suite runs it
def test_the_guides_examples_run(one_thread: None) -> None:
    run_guide(REPO / "docs" / "guides" / "own_pytorch.md", at_least=8)
