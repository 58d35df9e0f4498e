"""mtlab's imports point down the layers, and no module reaches another module's private names."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "mtlab"

# Lower numbers are further down. A module may import its own layer or any layer below it.
LAYERS: dict[str, int] = {
    # foundations
    "errors": 0, "batching": 0, "gradops": 0, "registry": 0, "report": 0,
    # describing work
    "graph": 1, "task": 1, "sampling": 1, "forward": 1, "models": 1, "losses": 1,
    # the step core
    "accumulator": 2, "transforms": 2, "update": 2, "events": 2, "history": 2, "checkpoint": 2, "trainer": 2,
    # the shell
    "plots": 3, "loop": 3, "expdir": 3, "distributed": 3, "checkpointing": 3, "debug": 3, "loggers": 3, "combine": 3, "weighting": 3,
    # domains
    "data": 4, "separation": 4,
    # applications on top: recipes, importers, launchers, CLI, notebook UI
    "recipe": 5, "nabu": 5, "launch": 5, "cli": 5, "ui": 5, "__main__": 5,
}
NON_MTLAB_OK = {"self", "cls", "torch", "np", "os", "sys", "signal", "_signal", "dist", "mp", "plt", "F", "nn", "pd"}


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(parts)


def layer(module: str) -> int | None:
    top = module.split(".")[0]
    return LAYERS.get(top)


def resolve(current: str, node: ast.ImportFrom, is_package: bool) -> str | None:
    """The mtlab-relative module a (relative or absolute) ``from ... import`` names."""
    if node.level == 0:
        mod = node.module or ""
        return mod[len("mtlab."):] if mod.startswith("mtlab.") else ("" if mod == "mtlab" else None)
    base = current.split(".") if current else []
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
    return ".".join([*base, node.module] if node.module else base)


def edges() -> list[tuple[str, str, str, int]]:
    """(importer, imported mtlab module, imported name or '', line) for every import in mtlab/."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        current = module_name(path)
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                target = resolve(current, node, path.name == "__init__.py")
                if target is None:
                    continue
                for alias in node.names:
                    sub = f"{target}.{alias.name}" if target else alias.name
                    named = sub if layer(sub) is not None and (PACKAGE / sub.replace(".", "/")).exists() \
                        or (PACKAGE / (sub.replace(".", "/") + ".py")).exists() else target
                    out.append((current, named, alias.name, node.lineno))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("mtlab."):
                        out.append((current, alias.name[len("mtlab."):], "", node.lineno))
    return out


def test_every_module_has_a_layer() -> None:
    missing = sorted({module_name(p).split(".")[0] for p in PACKAGE.rglob("*.py")} - set(LAYERS) - {""})
    assert not missing, f"modules without a layer in tests/test_layering.py: {missing}"


def test_imports_point_down() -> None:
    upward = []
    for importer, imported, _, line in edges():
        if not importer or not imported:
            continue  # the package's own __init__ loads submodules lazily
        a, b = layer(importer), layer(imported)
        if a is not None and b is not None and b > a:
            upward.append(f"{importer}:{line} imports {imported} (layer {a} -> {b})")
    assert not upward, "imports that point up:\n" + "\n".join(upward)


def test_no_module_imports_another_modules_private_names() -> None:
    bad = [f"{importer}:{line} imports {name} from {imported}" for importer, imported, name, line in edges()
           if name.startswith("_") and not name.startswith("__") and importer.split(".")[0] != imported.split(".")[0]]
    assert not bad, "\n".join(bad)


def test_no_module_reads_private_attributes_of_other_objects() -> None:
    """``obj._name`` on anything but self/cls (or a third-party module) is a reach into another's internals;
    so is ``self.other._name``."""
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
                continue
            root = node.value
            while isinstance(root, (ast.Attribute, ast.Call, ast.Subscript)):
                root = root.func if isinstance(root, ast.Call) else root.value
            own = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            third_party = isinstance(root, ast.Name) and root.id in NON_MTLAB_OK - {"self", "cls"}
            if not (own or third_party):
                bad.append(f"{path.relative_to(PACKAGE)}:{node.lineno} .{node.attr} of {ast.unparse(node.value)}")
    assert not bad, "\n".join(bad)


def test_the_core_imports_without_jupyter_or_the_data_package() -> None:
    import subprocess
    import sys

    code = ("import sys, mtlab; t = mtlab.Trainer; "
            "bad = [m for m in ('ipywidgets', 'matplotlib', 'IPython', 'mtlab.data', 'mtlab.separation', 'mtlab.loop', "
            "'mtlab.recipe', 'mtlab.ui') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PACKAGE.parent)
    assert res.returncode == 0, res.stdout + res.stderr
