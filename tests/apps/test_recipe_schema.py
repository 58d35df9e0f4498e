"""Every key of the recipe schema, fed a wrong type or a wrong value: `mtlab train` stops before anything runs with
one mtlab error that names the file, the key, what is allowed and the fix, and writes nothing."""

from __future__ import annotations

import copy
import inspect
import tomllib
from pathlib import Path
from typing import Any

import pytest
from helpers.recipes import TINY_TOML
from hypothesis import HealthCheck, given, settings, strategies as st

from mtlab.apps.cli import main
from mtlab.base.errors import ConfigError
from mtlab.apps.settings import DATA_KEYS, LINKEDSET_KEYS, NODE_KEYS, TASK_KEYS, TRAINER_KEYS
from mtlab.models import MODELS
from mtlab.nabu.toml import toml_text

BASE = tomllib.loads(TINY_TOML.format(root="corpus", num_steps=4, valid_frequency=2))
WRONG_TYPES = {"int": ["8", 2.5, True, [1], {"a": 1}], "float": ["0.1", True, [1.0], {"a": 1}],
               "bool": ["true", 1, [True], {"a": 1}], "str": [3, True, ["cpu"], {"a": 1}],
               "names": [3, True, [1], {"a": 1}], "floats": ["1 2", [True], 3, {"a": 1}],
               "clip": ["1", True, [1.0], {"a": 1}], "tries": ["3", 2.5, True, [3]], "stages": ["x", 3, [1], {"a": 1}]}


def wrong_values(key: str) -> list[Any]:
    spec = TRAINER_KEYS[key]
    out: list[Any] = {"names": [[]], "floats": [[], [-1.0]], "stages": [[], [{"segment_length": 0}]]}.get(spec.kind, [])
    if spec.minimum is not None and spec.kind in ("int", "tries", "float", "clip"):
        out += [-1, spec.minimum if spec.strict else spec.minimum - 1]
    if spec.choices:
        out.append("gpu")
    if key == "device":
        out += ["gpu", "cuda:x"]
    return out


# (where in the recipe, key, bad value) for every table kind: trainer settings, models, tasks, nodes, linked sets, data
TRAINER_CASES = [("trainer", k, v) for k, spec in TRAINER_KEYS.items() for v in WRONG_TYPES[spec.kind] + wrong_values(k)]
MODEL_CASES = [(f"models.{name}", p.name, v) for name, kind in (("enc", "BLSTM"), ("spk_head", "Linear"))
               for p in inspect.signature(MODELS[kind]).parameters.values() if p.annotation is not p.empty
               for v in ("2", [], {"a": 1}, 0 if p.default != 0 else -1, -3)
               if not (str(p.annotation).strip("'") == "float" and v in (0,))]
TASK_CASES = [("tasks.spk", k, v) for k in TASK_KEYS
              for v in {"inputs": [3, [], [1], "nonsense"], "targets": [3, [], [1], "nonsense"], "outputs": [3, [], [1]],
                        "nodes": ["h", [], [1], [{"name": "h", "model": "enc"}], [{"name": "h", "inputs": ["features"]}]],
                        "loss": ["crossentropy", {"type": 3}, {"type": "nonsense"}, {"type": "crossentropy", "x": 1}],
                        "linkedsets": ["clean", {}, {"clean": 3}], "weight": ["1", -1, True],
                        "batch_size": [0, "8", 2.5], "numbuckets": [0, "2"], "trainset_frac": [0, 2, "x"]}[k]]
NODE_CASES = [("tasks.spk.nodes.0", k, v) for k in NODE_KEYS for v in
              {"name": [3, ""], "model": [3, "nonsense"], "inputs": [3, [1]], "outputs": [3, [1]]}[k]]
SET_CASES = [("tasks.spk.linkedsets.clean", k, v) for k in LINKEDSET_KEYS for v in
             {"weight": ["1", -1, [1]], "data": ["path/to/list.scp", 3, {}], "valid": [3, "dev", [1]]}[k]]
DATA_CASES = [("tasks.spk.linkedsets.clean.data", k, v) for k in DATA_KEYS for v in
              {"corpus": [3, "nonsense"], "root": [3, ""], "split": [3, ""], "linkedset": [3, ""],
               "spectral": ["x", {"nonsense": 1}], "ivec": ["x", {"nonsense": 1}], "mvn": [3, "x"],
               "num_sources": [0, "2"], "stream": ["yes", 1], "num_workers": [-1, "2"], "on_bad_data": [3, "x"],
               "stats_utterances": [0, "5"], "dynamic_mix": ["x", 3], "feature_inputs": ["x", {"a": 3}],
               "layout": [3, "x"]}[k]]
CASES = TRAINER_CASES + MODEL_CASES + TASK_CASES + NODE_CASES + SET_CASES + DATA_CASES


def with_value(where: str, key: str, value: Any) -> dict[str, Any]:
    recipe = copy.deepcopy(BASE)
    table: Any = recipe
    for part in where.split("."):
        table = table[int(part)] if part.isdigit() else table[part]
    table[key] = value
    return recipe


def check(tmp: Path, where: str, key: str, value: Any, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp / "corpus").mkdir(exist_ok=True)
    recipe = tmp / "mine.toml"
    recipe.write_text(toml_text(with_value(where, key, value)))
    exp = tmp / "exp"
    code = main(["train", str(recipe), "--expdir", str(exp), "--steps", "1", "--threads", "1"])
    err = capsys.readouterr().err
    assert code == 2, f"{where} {key} = {value!r} was not refused: {err}"
    assert err.count("\n") == 1 and "Traceback" not in err, err  # one line
    assert str(recipe) in err and key in err, f"{where} {key} = {value!r}: {err}"
    assert any(w in err for w in ("valid:", "must be", "needs", "write e.g.", "keep one", "give ")), err
    assert not exp.exists(), f"{where} {key} = {value!r} wrote {exp}"


def test_the_cases_cover_every_key_of_the_schema() -> None:
    covered = {(where.split(".")[0] if where != "tasks.spk" else "task", key) for where, key, _ in CASES}
    assert {("trainer", k) for k in TRAINER_KEYS} <= covered
    assert {("task", k) for k in TASK_KEYS} <= covered
    assert {k for _, k, _ in NODE_CASES} == set(NODE_KEYS) and {k for _, k, _ in DATA_CASES} == set(DATA_KEYS)


@pytest.mark.slow
def test_every_key_with_a_wrong_type_or_value_is_named_before_anything_runs(
        tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]) -> None:
    """All of CASES (about 350: every key of every table kind, each with wrong types and wrong values)."""
    for case in CASES:
        check(tmp_path_factory.mktemp("recipe"), *case, capsys=capsys)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(sorted(TRAINER_KEYS)), value=st.one_of(
    st.text(max_size=5), st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=2), st.integers(),
                                                                             min_size=1, max_size=2)))
def test_any_string_list_or_table_where_a_setting_is_due(key: str, value: Any, tmp_path_factory: pytest.TempPathFactory,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Drawn values of the wrong kind for a [trainer] setting, beyond the cases listed: refused the same way, or
    (a string for a string setting, a list for a list) accepted only when the setting allows it."""
    from mtlab.apps.settings import check_value

    try:
        check_value(key, TRAINER_KEYS[key], value, "x.toml", "[trainer]")
    except Exception as exc:  # noqa: BLE001 (any other exception is the failure this test looks for)
        assert isinstance(exc, ConfigError), f"{key} = {value!r}: {type(exc).__name__}: {exc}"
        assert "x.toml: [trainer] " + key in str(exc) and "Traceback" not in str(exc)
        return
    assert TRAINER_KEYS[key].kind in ("str", "names", "floats", "stages"), f"{key} = {value!r} was accepted"


@pytest.mark.parametrize("where,key,value,expect", [
    ("trainer", "device", "gpu", "valid: auto"),
    ("models.enc", "hidden", 0, "an integer >= 1"),
    ("models.spk_head", "out_features", "2", "write e.g. out_features = 64"),
    ("tasks.spk.linkedsets.clean", "data", "path/to/list.scp", "write e.g. data = { root"),
    ("tasks.spk", "targets", "spk_nonsense", "unknown data key 'spk_nonsense'"),
    ("tasks.spk", "nodes", [], "write e.g. nodes = [{ name"),
    ("trainer", "num_epochs", 3, "keep one of them"),
])
def test_the_mistakes_an_outsider_met(where: str, key: str, value: Any, expect: str, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "corpus").mkdir()
    recipe = tmp_path / "mine.toml"
    recipe.write_text(toml_text(with_value(where, key, value)))
    assert main(["train", str(recipe), "--expdir", str(tmp_path / "exp"), "--threads", "1"]) == 2
    err = capsys.readouterr().err
    assert expect in err and "{{" not in err, err
    assert not (tmp_path / "exp").exists()


def test_a_string_of_one_target_is_one_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """targets = "spk" is the list ["spk"], not ['s', 'p', 'k'] (the loss's target check read it so)."""
    from mtlab.apps.recipe import resolve_recipe

    recipe = resolve_recipe(with_value("tasks.spk", "targets", "spk"), base=tmp_path)
    assert recipe["tasks"]["spk"]["targets"] == ["spk"]
