"""History column names are built and read by ``mtlab.core.columns`` alone."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import mtlab
from mtlab.core.columns import (NOISE_PARTS, Column, noise_column, parse_column, set_column, set_key, split_key,
                                task_column)

MTLAB = Path(mtlab.__file__).parent
# A string literal that is a piece of a column name: an update's or the noise scale's prefix, a task's suffix.
PIECE = re.compile(r"^(cos|combine|weighting|direction_norm|gns|gns_trace|gns_g2|gns_minibatches)/"
                   r"|/(loss|weight|grad_norm|grad_norm_clipped|clip_fraction|minibatches|minibatches_per_step"
                   r"|batch_size)$")


def test_noise_columns_and_set_keys_round_trip() -> None:
    assert noise_column("a") == "gns/a" and parse_column("gns/a") == Column("gns", task="a")
    assert parse_column(noise_column("a", "enc")) == Column("gns", task="a", group="enc")
    for part in NOISE_PARTS:
        assert parse_column(noise_column("a", part=part)) == Column(part, task="a")
    assert split_key(set_key("a", "clean")) == ("a", "clean") and split_key("a") == ("a", "")
    assert parse_column(set_column("a", "clean", "loss")) == Column("loss", task="a", linkedset="clean")
    assert parse_column(task_column("a", "cos")) == Column("cos", task="a")  # a transform's statistic "cos"


def _pieces(path: Path, root: Path = MTLAB) -> list[str]:
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                  and node.body and isinstance(node.body[0], ast.Expr)}
    return [f"{path.relative_to(root)}:{node.lineno}: {node.value!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
            and PIECE.search(node.value)]


def test_no_module_of_the_core_training_or_ui_spells_a_column_name() -> None:
    found = [hit for layer in ("core", "training", "ui") for path in sorted((MTLAB / layer).rglob("*.py"))
             if path.name != "columns.py" for hit in _pieces(path)]
    assert not found, "build or parse these with mtlab.core.columns: " + "; ".join(found)


def test_the_check_sees_a_column_spelled_by_hand(tmp_path: Path) -> None:
    code = tmp_path / "m.py"
    code.write_text('"""A docstring may say a/loss and cos/enc/a,b."""\n'
                    'def f(r, t, c):\n    return r.get(f"{t}/loss"), c.startswith("cos/"), f"gns/{t}", f"{t}/{c}"\n')
    assert sorted(hit.split(": ")[1] for hit in _pieces(code, tmp_path)) == ["'/loss'", "'cos/'", "'gns/'"]
