"""The guides' examples, run as doctests: each ```python block of a page in order, a block going on from the
names the blocks before it made."""

from __future__ import annotations

import doctest
import re
import warnings
from pathlib import Path


def run_guide(page: Path, at_least: int) -> None:
    """Run every example of ``page`` (``at_least`` blocks, so a page that lost its examples fails too)."""
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
    assert len(blocks) >= at_least, f"{page.name}: {len(blocks)} example blocks, expected {at_least} or more"
    parser = doctest.DocTestParser()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    globs: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i, block in enumerate(blocks):
            test = parser.get_doctest(block, globs, f"{page.name} block {i}", str(page), 0)
            runner.run(test, clear_globs=False)
            globs = test.globs
    assert runner.failures == 0, f"{runner.failures} example(s) of {page.name} failed (see the output above)"
