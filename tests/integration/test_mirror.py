"""The tests mirror the package: ``tests/<layer>/test_<module>.py`` (or ``test_<module>_<topic>.py``) tests
``mtlab/<layer>/<module>.py``; the whole system's tests sit in the few folders named below (tests/README.md).
No test file sits flat in tests/, none names a module that does not exist, and none imports another."""

from __future__ import annotations

import ast
import re

from helpers.paths import BENCH, MTLAB, SCRIPTS, TESTS

# Folders of tests that are not a layer of mtlab: what each file tests is the system, not one module.
SYSTEM_FOLDERS = {
    "integration": "the whole system: properties, fault campaigns, layering, public API, the wheel",
    "docs": "the documentation and the notebooks",
    "browser": "the dashboard and the site in a real browser",
    "scripts": "scripts/<name>.py, as test_<name>.py",
    "bench": "bench/<name>.py, as test_<name>.py",
}
NO_TESTS = {"helpers", "nabu_tf_fixture"}  # support code and data: no test files
# Test files of a layer folder whose name names no module of that layer, each with its reason (keep short).
EXCEPTIONS: dict[str, str] = {
    # "ui/test_example.py": "why no module name fits",
}


IMPORT_LIKE = re.compile(r"^\s*(from|import)\s+(\.*test_|tests\b|conftest\b)", re.M)


def layers() -> dict[str, set[str]]:
    """mtlab's layer folders and the modules in each (``__init__`` as the layer's own name)."""
    out = {}
    for folder in MTLAB.iterdir():
        if (folder / "__init__.py").is_file():
            out[folder.name] = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"} | {folder.name}
    return out


def names_a_module(stem: str, modules: set[str]) -> bool:
    """``test_<module>`` or ``test_<module>_<topic>`` for one of ``modules``."""
    name = stem.removeprefix("test_")
    return any(name == m or name.startswith(m + "_") for m in modules)


def test_every_test_file_sits_in_a_layer_or_system_folder_and_names_what_it_tests() -> None:
    known = layers()
    scripts = {p.stem for p in SCRIPTS.glob("*.py")}
    benches = {p.stem for p in BENCH.glob("*.py")}
    wrong = []
    for path in sorted(TESTS.rglob("test_*.py")):
        rel = path.relative_to(TESTS)
        key = rel.as_posix()
        if len(rel.parts) != 2:
            wrong.append(f"{key}: a test file sits in tests/<folder>/, one level down")
            continue
        folder = rel.parts[0]
        if key in EXCEPTIONS:
            continue
        if folder in known:
            if not names_a_module(path.stem, known[folder]):
                wrong.append(f"{key}: names no module of mtlab/{folder}/ (test_<module>.py or test_<module>_<topic>.py)")
        elif folder == "scripts":
            if path.stem.removeprefix("test_") not in scripts:
                wrong.append(f"{key}: names no script of scripts/")
        elif folder == "bench":
            if path.stem.removeprefix("test_") not in benches:
                wrong.append(f"{key}: names no script of bench/")
        elif folder not in SYSTEM_FOLDERS:
            wrong.append(f"{key}: tests/{folder}/ is neither a layer of mtlab nor one of {sorted(SYSTEM_FOLDERS)}")
    assert not wrong, "test files out of place (see tests/README.md):\n" + "\n".join(wrong)


def test_the_exceptions_are_still_needed() -> None:
    known = layers()
    stale = [key for key in EXCEPTIONS if not (TESTS / key).is_file()
             or names_a_module(key.split("/")[1][:-3], known.get(key.split("/")[0], set()))]
    assert not stale, f"drop these from EXCEPTIONS (gone, or now named after a module): {stale}"


def test_every_test_folder_is_a_package() -> None:
    """Two folders may hold test files of one name (tests/models/test_cnn.py, tests/nabu/test_cnn.py): pytest
    imports them as ``tests.models.test_cnn`` and ``tests.nabu.test_cnn`` only when each folder is a package."""
    folders = {p.parent for p in TESTS.rglob("test_*.py")} | {TESTS}
    missing = sorted(str(f.relative_to(TESTS.parent)) for f in folders if not (f / "__init__.py").is_file())
    assert not missing, f"add an empty __init__.py to: {missing}"
    assert not set(TESTS.glob("test_*.py")), "no test file directly in tests/"
    assert not [d for d in NO_TESTS if list((TESTS / d).glob("test_*.py"))]


def test_no_test_module_imports_another() -> None:
    """Shared code lives in tests/helpers/ (``from helpers.<theme> import ...``), fixtures in a conftest.py."""
    wrong = []
    for path in sorted(TESTS.rglob("*.py")):
        text = path.read_text()
        if not IMPORT_LIKE.search(text):  # most files: no line that could be such an import
            continue
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, ast.ImportFrom):  # relative too: ``from .test_x import y`` is another test file
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top.startswith("test_") or top in {"tests", "conftest"}:
                    wrong.append(f"{path.relative_to(TESTS)}:{node.lineno}: imports {name}")
    assert not wrong, "import from helpers/ instead (one name wherever the file sits):\n" + "\n".join(wrong)
