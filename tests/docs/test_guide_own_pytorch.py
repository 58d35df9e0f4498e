"""The guide "Bring your own PyTorch: optimizer, schedulers, freezing, knobs" (docs/guides/own_pytorch.md): its examples run, in order, as doctests."""

from __future__ import annotations

import doctest
import re
import warnings

import pytest

from helpers.paths import REPO

GUIDE = REPO / "docs" / "guides" / "own_pytorch.md"


@pytest.mark.slow  # a few seconds of CPU: the full suite runs it
def test_the_guides_examples_run(one_thread: None) -> None:
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)
    assert len(blocks) >= 8
    parser = doctest.DocTestParser()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    globs: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i, block in enumerate(blocks):
            test = parser.get_doctest(block, globs, f"own_pytorch.md block {i}", str(GUIDE), 0)
            runner.run(test, clear_globs=False)
            globs = test.globs  # a block goes on from the names the blocks before it made
    assert runner.failures == 0, f"{runner.failures} example(s) of {GUIDE.name} failed (see the output above)"
