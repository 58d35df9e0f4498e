"""The guide "Bring your own PyTorch: data and models" (docs/guides/own_data.md): its examples run, in order, as
doctests."""

from __future__ import annotations

from helpers.guides import run_guide
from helpers.paths import REPO


def test_the_guides_examples_run(one_thread: None) -> None:
    run_guide(REPO / "docs" / "guides" / "own_data.md", at_least=8)
