"""Running the notebooks from tests: the notebook tools, imported only by the tests that need them."""

from __future__ import annotations

import pytest


def notebook_tools() -> tuple:
    """nbformat and nbclient, imported by the tests that run notebooks (importing nbformat loads jsonschema's
    format checkers, seconds of CPU that every collection of the suite would pay at module level)."""
    nbformat = pytest.importorskip("nbformat", reason="notebook tests need nbformat (pip install nbformat)")
    nbclient = pytest.importorskip("nbclient", reason="notebook tests need nbclient (pip install nbclient)")
    pytest.importorskip("ipykernel", reason="notebook tests need ipykernel in this environment (pip install ipykernel)")
    pytest.importorskip("ipywidgets", reason="the notebooks need mtlab[notebook]: pip install 'mtlab[notebook]'")
    return nbformat, nbclient
