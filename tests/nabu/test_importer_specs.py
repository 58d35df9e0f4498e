"""model.cfg's architectures: one spec function each, in ``mtlab.nabu.specs.ARCHITECTURES``."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest
import torch

from mtlab.base.errors import ConfigError
from mtlab.models import build_model
from mtlab.nabu.importer import Importer
from mtlab.nabu.specs import ARCHITECTURES, Section, Spec, concat_mismatch, model_spec

# The smallest section of each per-frame architecture with one input, as model.cfg writes it.
PER_FRAME: dict[str, dict[str, str]] = {
    "dblstm": {"num_units": "5", "num_layers": "2"},
    "dbresetlstm": {"num_units": "4", "num_layers": "2", "t_reset": "2 4", "group_size": "1 2"},
    "leaky_dblstm": {"num_units": "4", "num_layers": "1", "leak_factor": "0.5"},
    "leaky_dblstm_notrec": {"num_units": "4", "num_layers": "1", "leak_factor": "0.5"},
    "leaky_dblstm_iznotrec": {"num_units": "4", "num_layers": "1", "leak_factor": "0.5"},
    "dbrnn": {"num_units": "3", "num_layers": "2"},
    "linear": {"output_dims": "7"},
    "feedforward": {"num_units": "8", "num_layers": "2", "fac_per_layer": "0.5"},
    "capsnet": {"num_capsules": "3", "capsule_dim": "2", "routing_iters": "1", "num_layers": "1",
                "input_noise": "0", "dropout": "1.0"},
    "dbr_capsnet": {"num_capsules": "3", "capsule_dim": "2", "routing_iters": "1", "num_layers": "1",
                    "input_noise": "0", "dropout": "1.0"},
}


def strict(tmp_path: Path) -> Importer:
    return Importer(tmp_path, "data", strict=True)


@pytest.mark.parametrize("arch", sorted(PER_FRAME))
def test_each_spec_builds_a_model_whose_output_has_the_size_the_spec_gives(arch: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    spec, out = model_spec(strict(tmp_path), "m", {"architecture": arch, **PER_FRAME[arch]}, [6], [3])
    settings = dict(spec)
    model = build_model(settings.pop("type"), **settings)
    x, lengths = torch.randn(2, 5, 6), torch.tensor([5, 3])
    y = model(x, seq_lengths=lengths) if "seq_lengths" in inspect.signature(model.forward).parameters else model(x)
    assert y.shape[:2] == (2, 5) and y.shape[-1] == out


def test_every_architecture_is_one_function_and_the_refusal_lists_them_in_order(tmp_path: Path) -> None:
    assert all(callable(f) for f in ARCHITECTURES.values())
    assert list(ARCHITECTURES)[:3] == ["dblstm", "dbresetlstm", "dbresetlstm_insert_additional_input"]
    with pytest.raises(ConfigError, match="'transformer' has no mtlab implementation") as err:
        model_spec(strict(tmp_path), "m", {"architecture": "transformer"}, [6])
    assert f"(mtlab has {', '.join(ARCHITECTURES)})" in str(err.value)
    lenient = Importer(tmp_path, "data", strict=False)
    assert model_spec(lenient, "m", {"architecture": "transformer"}, [6]) == ({"type": "nabu:transformer"}, None)
    assert lenient.unsupported[0]["key"] == "[m] architecture"


def test_an_architecture_added_to_the_registry_is_read_with_no_other_change(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def pool(s: Section, input_dims: list[int | None], ranks: list[int] | None) -> Spec:
        s.trainable()
        spec: dict[str, Any] = {"type": "MeanPool", "input_dim": input_dims[0]}
        return s.finish(spec, input_dims[0], frozenset({"architecture", "trainable"}))

    monkeypatch.setitem(ARCHITECTURES, "pool", pool)
    assert model_spec(strict(tmp_path), "p", {"architecture": "pool"}, [9]) == (
        {"type": "MeanPool", "input_dim": 9}, 9)
    with pytest.raises(ConfigError, match=r"model.cfg: unknown key 'width' in \[p\]"):
        model_spec(strict(tmp_path), "p", {"architecture": "pool", "width": "3"}, [9])
    with pytest.raises(ConfigError, match=r"\[p\] trainable: frozen models"):
        model_spec(strict(tmp_path), "p", {"architecture": "pool", "trainable": "False"}, [9])


def test_section_values_name_the_file_section_and_key(tmp_path: Path) -> None:
    s = Section(strict(tmp_path), "blstm", {"num_units": "4 4 8", "dropout": "1.5", "layers": "2 2"}, "dblstm")
    assert s.num("layers", kind="int") == 2  # per-stage values that agree
    with pytest.raises(ConfigError, match=r"model.cfg: \[blstm\] num_units: '4 4 8': mtlab keeps one model"):
        s.num("num_units", kind="int")
    with pytest.raises(ConfigError, match=r"\[blstm\] dropout = 1.5: a keep probability in \(0, 1\]"):
        s.keep_to_drop("dropout")
    with pytest.raises(ConfigError, match=r"\[blstm\] needs 'num_layers' for architecture 'dblstm'"):
        s.num("num_layers", kind="int")
    assert str(tmp_path / "model.cfg") in str(s.error("x"))


def test_an_unknown_input_size_is_refused_after_the_keys_are_checked(tmp_path: Path) -> None:
    conf = {"architecture": "dblstm", "num_units": "4", "num_layers": "1"}
    with pytest.raises(ConfigError, match="unknown key 'colour'"):
        model_spec(strict(tmp_path), "m", {**conf, "colour": "red"}, [None])
    with pytest.raises(ConfigError, match=r"\[m\]: the size of its input is unknown"):
        model_spec(strict(tmp_path), "m", conf, [None])


def test_concat_joins_a_per_utterance_vector_only_when_it_is_expanded() -> None:
    assert concat_mismatch(True, 2, 3) is None and concat_mismatch(False, 3, 3) is None
    assert "must be expanded" in (concat_mismatch(False, 2, 3) or "")
    assert "only a per-utterance vector" in (concat_mismatch(True, 3, 3) or "")
    assert "cannot join them" in (concat_mismatch(False, 2, 4) or "")
