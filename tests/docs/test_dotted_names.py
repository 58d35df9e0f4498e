"""Every dotted ``mtlab.…`` name the README and the docs give resolves: a module, or an attribute of one."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
from helpers.campaign import record
from helpers.paths import REPO

NAME = re.compile(r"(?<![\w./-])mtlab(?:\.[A-Za-z_]\w*)+")
FILES = (".md", ".toml", ".py", ".json", ".txt", ".cfg", ".yml", ".yaml", ".ipynb", ".png", ".git")  # not names


def documented_names(files: list[Path]) -> dict[str, list[str]]:
    """``mtlab.…`` names written in ``files`` -> where (file:line), file names such as ``mtlab.md`` left out."""
    found: dict[str, list[str]] = {}
    for path in files:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            for match in NAME.finditer(line):
                name = match.group(0)
                if not name.endswith(FILES):
                    found.setdefault(name, []).append(f"{path.relative_to(REPO)}:{number}")
    return found


def resolves(name: str) -> bool:
    """The longest importable module prefix of ``name``, then attributes down to its end."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError as exc:
            if exc.name is not None and not name.startswith(exc.name):
                raise  # a module that exists failed to import something it needs: not a naming problem
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_the_checker_refuses_a_name_that_does_not_exist():
    assert resolves("mtlab.data.shardwriter.write_shards") and resolves("mtlab.Trainer")
    assert not resolves("mtlab.data.shards.write_shards") and not resolves("mtlab.no_such_module.x")


@pytest.mark.slow  # imports every module the docs name (the dashboard's too): a few seconds
def test_every_dotted_mtlab_name_in_the_readme_and_the_docs_resolves():
    found = documented_names([REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))])
    assert len(found) > 20, sorted(found)  # the docs name many; a pattern that matched nothing checks nothing
    missing = {name: where for name, where in found.items() if not resolves(name)}
    record("documented module paths import: every dotted name in the docs", not missing)
    assert not missing, missing
