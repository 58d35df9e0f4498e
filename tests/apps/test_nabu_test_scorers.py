"""Several scorers per test task (``scorers_names`` in ``test_evaluator.cfg``), as the original's test script runs
them: each scorer's section of ``scorer.cfg`` with its own references, its results in columns of their own."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.nabu import replace_in
from helpers.nabu import write_test_recipe

from mtlab.base.errors import ConfigError
from mtlab.nabu import import_nabu, make_sample_root
from mtlab.nabu.evaluation import format_table, make_test_root, read_test

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = "/esat/corpora/wsjMix/data/2speakers/wav8k/min/tt"


def write_two_scorer_recipe(folder: Path) -> Path:
    """task_dc scored twice: against s1, s2 (``task_dc``) and against s1 and the mixture (``task_dc_alt``)."""
    folder = write_test_recipe(folder)
    replace_in(folder, "test_evaluator.cfg", "usedbins = testusedbins\n",
               "usedbins = testusedbins\nscorers_names = task_dc task_dc_alt\n")
    with (folder / "scorer.cfg").open("a") as f:
        f.write("\n[task_dc_alt]\nscore_type = sdr\norg_src = testorgsrc_alt\nbase = testbase\n"
                "spkinfo = testspkinfo\n")
    with (folder / "database.conf").open("a") as f:
        f.write(f"\n[testorgsrc_alt]\ndatafiles = {ROOT}/allS_alt_wav.scp\n")
    return folder


def test_scorers_names_are_read_per_task(tmp_path: Path) -> None:
    folder = write_two_scorer_recipe(tmp_path / "TWO")
    tests = read_test(folder, tmp_path / "data")
    assert list(tests["task_dc"].scorers) == ["task_dc", "task_dc_alt"]
    assert list(tests["task_pit"].scorers) == ["task_pit"]  # without scorers_names: the task's own name
    alt = tests["task_dc"].scorers["task_dc_alt"]
    assert alt["org_src"]["datafiles"].endswith("tt/allS_alt_wav.scp")
    assert tests["task_dc"].scorers["task_dc"]["org_src"]["datafiles"].endswith("tt/allS_wav.scp")
    replace_in(folder, "test_evaluator.cfg", "scorers_names = task_dc task_dc_alt", "scorers_names = task_dc nope")
    with pytest.raises(ConfigError, match=r"scorer\.cfg: no \[nope\] section.*scorers_names"):
        read_test(folder, tmp_path / "data")


@pytest.mark.slow
def test_each_scorer_scores_against_its_own_references(tmp_path: Path) -> None:
    import mtlab
    from mtlab.apps.nabu_test import run_test
    from mtlab.data import read_list, read_wav
    from mtlab.nabu import plain_recipe
    from mtlab.separation.metrics import sdr
    from mtlab.training.checkpoint import save_checkpoint

    folder = write_two_scorer_recipe(tmp_path / "TWO")
    data = tmp_path / "data"
    recipe = import_nabu(folder, data_root=data)
    make_sample_root(recipe, limit=6)
    tests = read_test(folder, data)
    make_test_root(tests, limit=3)
    tt = Path(tests["task_dc"].task["linkedsets"]["set0"]["data"]["root"]) / "tt"
    mixtures, s1 = read_list(tt / "mix_wav.scp"), read_list(tt / "s1.scp")
    (tt / "allS_alt_wav.scp").write_text("".join(f"{n} {s1[n].resolve()} {m.resolve()}\n"
                                                 for n, m in mixtures.items()))
    exp = mtlab.from_recipe(plain_recipe(recipe))
    save_checkpoint(exp.trainer, exp.schedule, tmp_path / "exp" / "final.pt", recipe=exp.recipe)
    result = run_test(tmp_path / "exp", limit=3, recipe_dir=folder, data_root=data)
    rows = list(csv.DictReader((tmp_path / "exp" / "test" / "task_dc" / "scores.csv").open()))
    assert len(rows) == 3
    assert {"sdr", "sdri", "perm", "task_dc_alt.sdr", "task_dc_alt.sdri", "task_dc_alt.perm"} <= set(rows[0])
    summary = {r["task"]: r for r in result.summary}
    assert "task_dc [task_dc_alt]" in format_table(result.summary)
    assert "task_dc_alt.sdr" in summary["task_dc"] and "task_dc_alt.sdr" not in summary["task_pit"]
    alt_sdrs = []
    for row in rows:
        name = row["utterance"]
        written = torch.from_numpy(np.stack([read_wav(tmp_path / "exp" / "test" / "task_dc" / f"s{s}" / f"{name}.wav")
                                             .double().numpy() for s in (1, 2)]))
        n = written.shape[1]
        own = torch.from_numpy(np.stack([read_wav(read_list(tt / f"s{s}.scp")[name].resolve()).double().numpy()[:n]
                                         for s in (1, 2)]))
        alt = torch.from_numpy(np.stack([read_wav(p).double().numpy()[:n] for p in
                                         (s1[name].resolve(), mixtures[name].resolve())]))
        for prefix, refs in (("", own), ("task_dc_alt.", alt)):
            perm = [int(p) - 1 for p in row[f"{prefix}perm"].split()]
            assert sorted(perm) == [0, 1]
            mine = float(sdr(written[perm], refs).mean())
            assert float(row[f"{prefix}sdr"]) == pytest.approx(mine, abs=0.05), (prefix, name)
        alt_sdrs.append(float(row["task_dc_alt.sdr"]))
        assert float(row["task_dc_alt.sdr"]) != pytest.approx(float(row["sdr"]), abs=1e-3)
    assert float(summary["task_dc"]["task_dc_alt.sdr"]) == pytest.approx(np.mean(alt_sdrs), abs=1e-3)


ROOT3 = "/esat/corpora/wsjMix/data/3speakers/wav8k/min/tt"
TASK_PIT3 = """
[task_pit3]
requested_utts = 2
batch_size = 2
loss_type = pit_sig
evaluator = task_loss_evaluator
inputs = features
outputs = bin_est
nodes = n0 hidden cat bin_est
n0_model = main
n0_inputs = features
hidden_model = ff
hidden_inputs = features
cat_model = concat
cat_inputs = n0 hidden
bin_est_model = pitlayer
bin_est_inputs = cat
targets = multi_targets mix_to_mask
features = testspec3spk
multi_targets = testmultitargets3spk
mix_to_mask = testmixtomask3spk
"""


@pytest.mark.slow
def test_a_two_mask_model_on_three_speaker_test_data_is_refused_by_name(tmp_path: Path) -> None:
    """The 2-mask PIT model tested on 3-speaker mixtures (as SS/DBLSTM/MERL_PIT_2spk's task_3spk asks): the task is
    refused with its reason, the other tasks are tested."""
    import mtlab
    from mtlab.apps.nabu_test import run_test
    from mtlab.nabu import plain_recipe
    from mtlab.training.checkpoint import save_checkpoint

    folder = write_test_recipe(tmp_path / "PIT3")
    replace_in(folder, "test_evaluator.cfg", "tasks = task_dc task_pit", "tasks = task_dc task_pit task_pit3")
    with (folder / "test_evaluator.cfg").open("a") as f:
        f.write(TASK_PIT3)
    with (folder / "reconstructor.cfg").open("a") as f:
        f.write("\n[task_pit3]\nreconstruct_type = stackedmasks\norg_mix = testorgmix3spk\nnrs = 3\n"
                "activation = sigmoid\n")
    with (folder / "scorer.cfg").open("a") as f:
        f.write("\n[task_pit3]\nscore_type = sdr\norg_src = testorgsrc3spk\nbase = testbase3spk\n"
                "spkinfo = testspkinfo3spk\n")
    (folder / "multitarget3_processor.cfg").write_text(
        (folder / "multitarget_processor.cfg").read_text().replace("nrs = 2", "nrs = 3"))
    with (folder / "database.conf").open("a") as f:
        f.write(f"\n[testmultitargets3spk]\ndatafiles = {ROOT3}/allS_wav.scp\n"
                "processor_config = multitarget3_processor.cfg\n"
                f"\n[testmixtomask3spk]\ndatafiles = {ROOT3}/mix_wav.scp\nprocessor_config = mixtomask_processor.cfg\n"
                f"\n[testorgmix3spk]\ndatafiles = {ROOT3}/mix_wav.scp\nprocessor_config = rec_processor.cfg\n"
                f"\n[testorgsrc3spk]\ndatafiles = {ROOT3}/allS_wav.scp\n"
                f"\n[testbase3spk]\ndatafiles = {ROOT3}/mix_wav.scp\n"
                f"\n[testspkinfo3spk]\ndatafiles = {ROOT3}/utt_spkinfo.txt\n")
    data = tmp_path / "data"
    recipe = import_nabu(folder, data_root=data)
    make_sample_root(recipe, limit=6)
    tests = read_test(folder, data)
    assert tests["task_pit3"].task["linkedsets"]["set0"]["data"]["num_sources"] == 3
    make_test_root(tests, limit=3)
    exp = mtlab.from_recipe(plain_recipe(recipe))
    save_checkpoint(exp.trainer, exp.schedule, tmp_path / "exp" / "final.pt", recipe=exp.recipe)
    result = run_test(tmp_path / "exp", limit=2, recipe_dir=folder, data_root=data)
    rows = {r["task"]: r for r in result.summary}
    assert "error" not in rows["task_dc"] and "error" not in rows["task_pit"] and "sdr" in rows["task_pit"]
    refused = rows["task_pit3"].get("refused", "")
    assert "2 masks" in refused and "3 speakers" in refused and "test_evaluator.cfg [task_pit3]" in refused
    assert "error" not in rows["task_pit3"]
    assert not (tmp_path / "exp" / "test" / "task_pit3" / "s1").exists()
