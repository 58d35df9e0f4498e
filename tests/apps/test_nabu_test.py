"""``mtlab test EXPDIR``: an imported recipe's test loss, separated WAVs and scores, end to end on a small
recipe in the original's formats."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.nabu import replace_in

from mtlab.apps.cli import main
from mtlab.base.errors import ConfigError
from mtlab.nabu import import_nabu, make_sample_root
from mtlab.nabu.evaluation import make_test_root, read_test
from helpers.nabu import write_test_recipe

pytestmark = pytest.mark.usefixtures("one_thread")


def test_reading_the_test_configs_and_refusals(tmp_path: Path) -> None:
    folder = write_test_recipe(tmp_path / "MERL_TEST")
    tests = read_test(folder, tmp_path / "data")
    assert list(tests) == ["task_dc", "task_pit"]
    dc, pit = tests["task_dc"], tests["task_pit"]
    assert (dc.batch_size, dc.requested_utts, pit.requested_utts) == (2, 3, 2)
    assert dc.task["linkedsets"]["set0"]["data"]["split"] == "tt" and dc.task["loss"]["type"] == "deepclustering"
    assert dc.reconstructor["type"] == "deepclustering" and dc.reconstructor["org_mix"]["spectral"].window == "sine"
    assert pit.reconstructor["options"] == {"activation": "sigmoid"} and pit.reconstructor["store_output"]
    data = dc.task["linkedsets"]["set0"]["data"]
    assert dc.scorer["org_src"]["datafiles"] == str(Path(data["root"]) / "tt" / "allS_wav.scp")
    replace_in(folder, "reconstructor.cfg", "reconstruct_type = deepclustering", "reconstruct_type = pit_l41")
    with pytest.raises(ConfigError, match=r"reconstructor\.cfg: \[task_dc\] reconstruct_type = 'pit_l41': mtlab "
                                          r"reconstructs with deepclustering"):
        read_test(folder, tmp_path / "data")
    replace_in(folder, "reconstructor.cfg", "reconstruct_type = pit_l41", "reconstruct_type = deepclustering\n"
                                                                          "transpose_order = 1 0 2")
    with pytest.raises(ConfigError, match=r"reconstructor\.cfg: \[task_dc\] transpose_order: not a reconstructor"):
        read_test(folder, tmp_path / "data")
    replace_in(folder, "reconstructor.cfg", "transpose_order = 1 0 2", "")
    replace_in(folder, "scorer.cfg", "score_type = sdr\norg_src = testorgsrc\nbase = testbase\nspkinfo = testspkinfo"
               "\n\n[task_pit]", "score_type = pesq\norg_src = testorgsrc\nbase = testbase\nspkinfo = testspkinfo"
               "\n\n[task_pit]")
    with pytest.raises(ConfigError, match=r"scorer\.cfg: \[task_dc\] score_type = 'pesq': mtlab scores with sdr"):
        read_test(folder, tmp_path / "data")


@pytest.mark.slow
def test_train_then_test_writes_wavs_and_scores(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from mtlab.data import read_list, read_wav
    from mtlab.data.features import ORIGINAL
    from mtlab.separation.metrics import bss_eval, order_by_mean_sir, sdr
    from mtlab.separation.reconstruct import apply_and_resynthesize, stacked_masks

    folder = write_test_recipe(tmp_path / "MERL_TEST")
    data = tmp_path / "data"
    make_sample_root(import_nabu(folder, data_root=data), limit=8)
    make_test_root(read_test(folder, data), limit=4)
    expdir = tmp_path / "exp"
    assert main(["train", str(folder), "--data-root", str(data), "--expdir", str(expdir), "--steps", "1",
                 "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["test", str(expdir)]) == 0
    printed = capsys.readouterr().out
    assert "SDRi" in printed and "task_dc" in printed and "task_pit" in printed
    summary = list(csv.DictReader((expdir / "test" / "summary.csv").open()))
    assert [r["task"] for r in summary] == ["task_dc", "task_pit"]
    assert [r["utterances"] for r in summary] == ["3", "2"]  # requested_utts
    assert all(np.isfinite(float(r["loss"])) for r in summary)
    rows = list(csv.DictReader((expdir / "test" / "task_pit" / "scores.csv").open()))
    assert {"utterance", "sdr", "sdr_mix", "sdri", "si_sdr", "si_sdri", "stoi", "perm"} <= set(rows[0])
    tt = Path(read_test(folder, data)["task_pit"].task["linkedsets"]["set0"]["data"]["root"]) / "tt"
    for row in rows:  # the WAV is the stacked masks of the stored raw output, resynthesized as the original
        name = row["utterance"]
        raw = np.load(expdir / "test" / "task_pit" / "raw_output" / f"bin_est_{name}.npy")
        mixture = read_wav(read_list(tt / "mix_wav.scp")[name].resolve()).double().numpy() * 32768
        expected = apply_and_resynthesize(mixture, stacked_masks(raw, 2, "sigmoid"), ORIGINAL)
        written = np.stack([read_wav(expdir / "test" / "task_pit" / f"s{s}" / f"{name}.wav").double().numpy()
                            for s in (1, 2)])
        np.testing.assert_allclose(written, expected, atol=2 / 32768)
        refs = np.stack([read_wav(read_list(tt / f"s{s}.scp")[name].resolve()).double().numpy()[:written.shape[1]]
                         for s in (1, 2)])
        perm = [int(p) - 1 for p in row["perm"].split()]
        mine = sdr(torch.from_numpy(written[perm]), torch.from_numpy(refs)).mean()
        assert float(row["sdr"]) == pytest.approx(float(mine), abs=0.05)  # written at 16 bits, scored before
        mix = torch.from_numpy(mixture[:written.shape[1]] / 32768).expand(2, -1)
        assert float(row["sdr_mix"]) == pytest.approx(float(sdr(mix, torch.from_numpy(refs)).mean()), abs=1e-3)
        # the original's speaker order (bss_eval.py:542-543): the permutation of the largest mean SIR
        assert tuple(perm) == order_by_mean_sir(bss_eval(written, refs))
        assert {"sir", "sir_mix", "sar", "sar_mix"} <= set(row)
    assert len(list((expdir / "test" / "task_dc" / "s1").glob("*.wav"))) == 3
    original = list(csv.DictReader((expdir / "test" / "task_pit" / "summary_original.csv").open()))
    assert {(r["metric"], r["scenario"]) for r in original} == {(m, s) for m in ("SDR", "SIR", "SAR")
                                                                for s in ("SS", "base")}
    sdr_ss = next(r for r in original if (r["metric"], r["scenario"], r["mix_type"]) == ("SDR", "SS", "all"))
    assert float(sdr_ss["mean"]) == pytest.approx(np.mean([float(r["sdr"]) for r in rows]), abs=1e-3)  # CSV: 4 digits
    assert float(sdr_ss["median"]) == pytest.approx(np.median([float(r["sdr"]) for r in rows]), abs=1e-3)
    # the original's 32-bit float WAVs, on request
    assert main(["test", str(expdir), "--out", str(tmp_path / "f32"), "--wav-format", "float32", "--limit", "1"]) == 0
    from scipy.io import wavfile

    assert wavfile.read(next((tmp_path / "f32" / "task_pit" / "s1").glob("*.wav")))[1].dtype == np.float32


def test_postprocessors_are_noted_and_a_filled_folder_is_kept(tmp_path: Path) -> None:
    folder = write_test_recipe(tmp_path / "MERL_TEST")
    replace_in(folder, "test_evaluator.cfg", "requested_utts = 3\n", "requested_utts = 3\npostprocessors_names = ivec\n")
    tests = read_test(folder, tmp_path / "data")
    assert "postprocessors_names" in tests["task_dc"].notes[0] and not tests["task_pit"].notes
    tt = Path(tests["task_dc"].task["linkedsets"]["set0"]["data"]["root"]) / "tt"
    assert make_test_root(tests, limit=3) == [tt] and len((tt / "mix_wav.scp").read_text().splitlines()) == 3
    (tt / "mix_wav.scp").write_text((tt / "mix_wav.scp").read_text().splitlines()[0] + "\n")
    assert make_test_root(tests, limit=3) == []  # a folder holding its list (e.g. the training one) is kept
    assert len((tt / "mix_wav.scp").read_text().splitlines()) == 1


def test_each_test_task_gets_its_vector_list_in_a_shared_folder(tmp_path: Path) -> None:
    """Two test tasks read i-vectors of the same test folder from two lists (given and estimated ones)."""
    from helpers.nabu_ivectors import ROOT, SECTIONS, TASK, write_ivec_recipe

    folder = write_ivec_recipe(tmp_path / "IVEC")
    db = []
    for name, (listing, proc) in SECTIONS.items():
        db += [f"[test{name}]", f"datafiles = {ROOT}/tt/{listing}", f"processor_config = {proc}", ""]
    db += ["[testestivec]", f"datafiles = {ROOT}/est/pointers.scp", "processor_config = ivec_processor.cfg", ""]
    with (folder / "database.conf").open("a") as f:
        f.write("\n" + "\n".join(db))
    (folder / "test_evaluator.cfg").write_text(
        "[evaluator]\nevaluator = multi_task\ntasks = given estimated\nsegment_length = full\n\n"
        "[given]\nbatch_size = 2\n" + TASK.format(split="test") + "\n[estimated]\nbatch_size = 2\n"
        + TASK.format(split="test").replace("ivecs = testivec", "ivecs = testestivec"))
    tests = read_test(folder, tmp_path / "data")
    lists = [Path(t.task["linkedsets"]["set0"]["data"]["ivec"]["list"]) for t in tests.values()]
    assert lists[0] != lists[1]
    make_test_root(tests, limit=3)
    for path in lists:
        assert len(path.read_text().splitlines()) == 3, path
