"""``mtlab import-nabu`` and ``mtlab train RECIPE_DIR --data-root`` on a small recipe in the original's formats."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from helpers.nabu import replace_in, write_recipe

from mtlab.apps.cli import main
from mtlab.nabu import import_nabu, make_sample_root

pytestmark = pytest.mark.usefixtures("one_thread")


def test_import_nabu_writes_the_toml_and_refuses_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = write_recipe(tmp_path / "MERL_TEST")
    out = tmp_path / "recipe.toml"
    assert main(["import-nabu", str(folder), "-o", str(out), "--data-root", "/corpora"]) == 0
    assert tomllib.loads(out.read_text()) == import_nabu(folder, data_root="/corpora")
    assert "2 task(s), 5 model(s)" in capsys.readouterr().out
    replace_in(folder, "model.cfg", "layer_norm = False", "layer_norm = True")
    assert main(["import-nabu", str(folder), "-o", str(out)]) == 2
    assert "model.cfg: [main] layer_norm: mtlab's BLSTM has no layer normalization" in capsys.readouterr().err
    assert main(["import-nabu", str(folder), "-o", str(out), "--lenient"]) == 0
    assert tomllib.loads(out.read_text())["nabu"]["unsupported"][0]["key"] == "[main] layer_norm"


@pytest.mark.slow
def test_train_an_original_recipe_folder_with_a_data_root(tmp_path: Path) -> None:
    folder = write_recipe(tmp_path / "MERL_TEST")
    replace_in(folder, "trainer.cfg", "init_file = /models/previous/network.ckpt", "")
    replace_in(folder, "trainer.cfg", "valid_frequency = 5", "valid_frequency = 0")  # keep the run short
    make_sample_root(import_nabu(folder, data_root=tmp_path / "data"), limit=12)
    expdir = tmp_path / "exp"
    code = main(["train", str(folder), "--data-root", str(tmp_path / "data"), "--expdir", str(expdir),
                 "--steps", "1", "--no-progress"])
    assert code == 0 and (expdir / "final.pt").is_file()


@pytest.mark.slow  # about a second of CPU or more: the full suite runs it, the quick check does not
def test_a_full_size_recipe_says_its_cost_before_training_and_shrink_caps_it(tmp_path: Path,
                                                                             capsys: pytest.CaptureFixture) -> None:
    folder = write_recipe(tmp_path / "MERL_TEST")
    replace_in(folder, "trainer.cfg", "init_file = /models/previous/network.ckpt", "")
    replace_in(folder, "trainer.cfg", "valid_frequency = 5", "valid_frequency = 0")
    replace_in(folder, "model.cfg", "num_units = 8", "num_units = 600")  # the original's full size
    make_sample_root(import_nabu(folder, data_root=tmp_path / "data"), limit=12)
    train = ["train", str(folder), "--data-root", str(tmp_path / "data"), "--steps", "0", "--no-progress"]
    assert main([*train, "--expdir", str(tmp_path / "full")]) == 0
    out = capsys.readouterr().out
    warning = next(line for line in out.splitlines() if line.startswith("large model"))
    for part in ("M parameters", "on the CPU", "GB", "minutes per step", "--shrink 32", "GPU"):
        assert part in warning, warning
    assert main([*train, "--expdir", str(tmp_path / "small"), "--shrink", "32"]) == 0
    out = capsys.readouterr().out
    assert "large model" not in out and "--shrink 32: hidden sizes capped at 32" in out
    with pytest.raises(SystemExit):
        main([*train, "--expdir", str(tmp_path / "bad"), "--shrink", "0"])
