"""mtlab's imports point down the layers, and no module reaches another module's private names."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest
from helpers.paths import MTLAB

from mtlab._layers import LAYERS, layer_of

PACKAGE = MTLAB

# The layers are the folders of mtlab/, in the order mtlab/_layers.py gives; top-level files (__init__,
# __main__, _layers) are the package's entry and sit above every layer.
ENTRY = {"", "__main__", "_layers"}


NON_MTLAB_OK = {"self", "cls", "torch", "np", "os", "sys", "signal", "_signal", "dist", "mp", "plt", "F", "nn", "pd"}


@functools.cache
def parse(path: Path) -> ast.Module:
    """The syntax tree of a file of mtlab (parsed once for all the tests here)."""
    return ast.parse(path.read_text(), filename=str(path))


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(parts)


def layer(module: str) -> int | None:
    top = module.split(".")[0]
    if top in ENTRY:
        return len(LAYERS)
    return layer_of(top)


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


def load_time_nodes(tree: ast.Module) -> list[ast.AST]:
    """The nodes that run when a module is loaded: not inside a function, nor under ``if TYPE_CHECKING:``."""
    out: list[ast.AST] = []
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
            continue
        out.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return out


def module_imports(path: Path, load_time: bool = False) -> list[tuple[str, str, str, int]]:
    """(importer, imported mtlab module, imported name or '', line) for each import in one file; only those
    that run when it is loaded with ``load_time``."""
    current = module_name(path)
    tree = parse(path)
    out = []
    for node in (load_time_nodes(tree) if load_time else ast.walk(tree)):
        if isinstance(node, ast.ImportFrom):
            target = resolve(current, node, path.name == "__init__.py")
            if target is None:
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}" if target else alias.name
                is_module = (PACKAGE / (sub.replace(".", "/") + ".py")).exists() or \
                    (PACKAGE / sub.replace(".", "/") / "__init__.py").exists()
                out.append((current, sub if is_module else target, alias.name, node.lineno))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("mtlab."):
                    out.append((current, alias.name[len("mtlab."):], "", node.lineno))
    return out


def edges() -> list[tuple[str, str, str, int]]:
    """(importer, imported mtlab module, imported name or '', line) for every import in mtlab/."""
    return [edge for path in sorted(PACKAGE.rglob("*.py")) for edge in module_imports(path)]


def test_every_folder_is_a_layer_and_every_module_is_in_a_folder() -> None:
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    listed = {f for _, group, _ in LAYERS for f in group}
    assert folders == listed, f"folders not in mtlab/_layers.py: {sorted(folders - listed)}; " \
                              f"listed but absent: {sorted(listed - folders)}"
    loose = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ENTRY | {"__init__"})
    assert not loose, f"modules outside the layer folders: {loose}"


@pytest.mark.slow  # about a second of CPU or more: the full suite runs it, the quick check does not
def test_plugin_strings_name_modules_that_exist_in_a_layer_above() -> None:
    """A plug-in named by string (``add_plugin("combine", "mtlab.core.combine")``) is imported when its registry
    is first read: the name must resolve to a module file, and a registry may only name its own layer or one
    above it (a plug-in extends a lower layer; a string naming a lower module would be a hidden import)."""
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        current = module_name(path)
        for node in ast.walk(parse(path)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and re.fullmatch(r"mtlab(\.[a-z_]+)+", node.value):
                rel = node.value[len("mtlab."):].replace(".", "/")
                if not ((PACKAGE / f"{rel}.py").exists() or (PACKAGE / rel / "__init__.py").exists()):
                    bad.append(f"{current}:{node.lineno} names {node.value}, which is no module")
                elif (layer(node.value[len("mtlab."):]) or 0) < (layer(current) or 0):
                    bad.append(f"{current}:{node.lineno} names {node.value}, a lower layer, by string")
    assert not bad, "\n".join(bad)


def test_readme_architecture_table_matches_the_layers() -> None:
    design = (PACKAGE.parent / "docs" / "design.md").read_text()
    section = design.split("## The layers", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| layer") and not line.startswith("| call")]
    table = [(r[0], tuple(re.findall(r"`(\w+)/`", r[1]))) for r in rows if len(r) >= 2 and "`" in r[1] and "/`" in r[1]]
    assert table == [(name, folders) for name, folders, _ in LAYERS], \
        "docs/design.md's table of layers differs from mtlab/_layers.py:\n" + "\n".join(map(str, table))


@pytest.mark.slow  # about a second of CPU or more: the full suite runs it, the quick check does not
def test_modules_and_classes_stay_readable() -> None:
    """No module over 600 lines and no class over 300 lines outside the domain packages (data, separation,
    nabu, ui); docs/design.md names any exception and why."""
    domains = {"data", "separation", "nabu", "ui"}
    readme = (PACKAGE.parent / "docs" / "design.md").read_text()
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] in domains:
            continue
        text = path.read_text()
        if text.count("\n") > 600 and f"`{rel.as_posix()}`" not in readme:
            bad.append(f"{rel}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > 300 \
                    and f"`{node.name}`" not in readme:
                bad.append(f"{rel}: class {node.name} has {node.end_lineno - node.lineno + 1} lines")
    assert not bad, "\n".join(bad)


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
    """A ``_name`` is its module's own, also for a module of the same folder (make it public, or move the
    code that needs it)."""
    bad = [f"{importer}:{line} imports {name} from {imported}" for importer, imported, name, line in edges()
           if name.startswith("_") and not name.startswith("__") and importer != imported]
    assert not bad, "\n".join(bad)


def test_no_module_reads_private_attributes_of_other_objects() -> None:
    """``obj._name`` on anything but self/cls (or a third-party module) is a reach into another's internals;
    so is ``self.other._name``."""
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = parse(path)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
                continue
            root = node.value
            while isinstance(root, (ast.Attribute, ast.Call, ast.Subscript)):
                root = root.func if isinstance(root, ast.Call) else root.value
            own = (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")) or (
                isinstance(node.value, ast.Call) and ast.unparse(node.value.func) == "super"  # self's own base class
            )
            third_party = isinstance(root, ast.Name) and root.id in NON_MTLAB_OK - {"self", "cls"}
            if not (own or third_party):
                bad.append(f"{path.relative_to(PACKAGE)}:{node.lineno} .{node.attr} of {ast.unparse(node.value)}")
    assert not bad, "\n".join(bad)


@pytest.mark.slow
def test_the_core_imports_without_jupyter_or_the_data_package() -> None:
    import subprocess
    import sys

    code = ("import sys, mtlab; t = mtlab.Trainer; "
            "bad = [m for m in ('ipywidgets', 'matplotlib', 'IPython', 'mtlab.data', 'mtlab.separation', 'mtlab.training.loop', "
            "'mtlab.apps.recipe', 'mtlab.ui', 'pandas') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PACKAGE.parent)
    assert res.returncode == 0, res.stdout + res.stderr


def load_time_edges() -> dict[str, set[str]]:
    """Module -> the mtlab modules it imports when it is loaded."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        graph[module_name(path)] = {imported for _, imported, _, _ in module_imports(path, load_time=True)}
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    seen: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:  # depth first; 1 = on the stack, 2 = done
        seen[node] = 1
        for nxt in sorted(graph.get(node, set())):
            if seen.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt):], nxt])
            elif nxt not in seen:
                visit(nxt, [*stack, nxt])
        seen[node] = 2

    for module in sorted(graph):
        if module not in seen:
            visit(module, [module])
    return cycles


def test_cycle_finder_finds_a_cycle() -> None:
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set(), "c": {"b"}}) == []


def test_no_two_modules_import_each_other_counting_every_import() -> None:
    """Counting imports inside functions and under ``if TYPE_CHECKING:`` too: no cycle, so no module pair that
    imports each other (a lazy import hides a cycle from the load-time check below, not from the design)."""
    graph: dict[str, set[str]] = {}
    for importer, imported, _, _ in edges():
        if importer and imported and importer != imported:
            graph.setdefault(importer, set()).add(imported)
    cycles = find_cycles(graph)
    assert not cycles, "modules that import each other:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_import_cycles() -> None:
    cycles = find_cycles(load_time_edges())
    assert not cycles, "import cycles at load time:\n" + "\n".join(" -> ".join(c) for c in cycles)


# In-place methods of lists, dicts, sets and tensors: calling one on an accumulator's field changes it.
MUTATORS = {"append", "extend", "insert", "remove", "pop", "popitem", "clear", "update", "setdefault", "add",
            "discard", "sort", "reverse", "copy_", "zero_", "fill_", "add_", "sub_", "mul_", "div_", "clamp_",
            "resize_", "set_"}


def field_changes(tree: ast.AST, fields: set[str]) -> list[tuple[int, str]]:
    """(line, code) of each change to a field of an object other than self/cls: an assignment (``acc.phase =
    ...``), a subscript store or delete (``acc.set_totals[k] = ...``) and a mutating call (``acc.records.clear()``)."""
    def foreign(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr in fields \
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))

    def accumulator(node: ast.AST) -> bool:
        # Without types, an object is taken for an accumulator by how mtlab names one: acc, a, st, state,
        # accs[...], _accs[...] or trainer.state(...). (Other classes have fields called records or stats too.)
        if isinstance(node, ast.Name):
            return node.id in ("acc", "a", "st", "state") or node.id.startswith("acc")
        if isinstance(node, ast.Subscript):
            inner = node.value
            return (isinstance(inner, ast.Name) and "accs" in inner.id) or \
                (isinstance(inner, ast.Attribute) and "accs" in inner.attr)
        return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "state"

    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)) and foreign(node):
            out.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)) and foreign(node.value) \
                and accumulator(node.value.value):
            out.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS \
                and foreign(node.func.value) and accumulator(node.func.value.value):
            out.append((node.lineno, ast.unparse(node)))
    return out


def test_the_field_check_sees_assignments_subscript_stores_and_mutating_calls() -> None:
    code = ("acc.phase = 1\nacc.set_totals['a'] = t\ndel acc.set_totals['a']\nacc.records.clear()\n"
            "acc.totals.zero_()\ntr.state('a').records.append(r)\nself._accs[n].stats['x'] = v\n"
            "self.phase = 2\nself.records.clear()\nacc.norms()\nx = acc.records[0]\nstore.records.append(r)\n")
    found = [line for line, _ in field_changes(ast.parse(code), {"phase", "set_totals", "records", "totals", "stats"})]
    assert found == [1, 2, 3, 4, 5, 6, 7]


def test_only_the_accumulator_assigns_its_fields() -> None:
    """Whoever holds state owns it: other modules change an accumulator through its methods (``advance``,
    ``mark_applied``, ``take_reduced``...), never by assigning its fields, storing into them
    (``acc.set_totals[k] = ...``) or calling their in-place methods (``acc.records.clear()``)."""
    source = (PACKAGE / "core" / "accumulator.py").read_text()
    fields = {node.attr for node in ast.walk(ast.parse(source))
              if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
              and isinstance(node.value, ast.Name) and node.value.id == "self"}
    fields |= {"totals", "set_totals"}  # read-only properties, summed from the records when first read
    assert {"phase", "position", "clip_fraction", "totals", "set_totals", "minibatches"} <= fields
    bad = [f"{path.relative_to(PACKAGE)}:{line} changes {code}" for path in sorted(PACKAGE.rglob("*.py"))
           if path != PACKAGE / "core" / "accumulator.py" for line, code in field_changes(parse(path), fields)]
    assert not bad, "\n".join(bad)
