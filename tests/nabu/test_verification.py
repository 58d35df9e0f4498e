"""Speaker-verification test tasks (``output_handling_type = speaker_verification``) as the original's test script
runs them (``nabu/scripts/test.py:44-71, 161-172, 305-314`` at revision 5e862cb): the handlers and the EER scorer
against transcriptions of the original's code as written, and a recipe's test end to end."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import numpy as np
import pytest
from helpers.nabu import replace_in
from helpers.nabu import write_test_recipe

from mtlab.base.errors import ConfigError
from mtlab.nabu.evaluation import read_test
from mtlab.nabu.verification import (attractors_from_embeddings, draw_trials, equal_error_rate, ivectors,
                                     read_spkinfo, score_eer, trial_errors)

pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------ the original's code, transcribed line by line
def original_attractors(handled_output, masks, usedbins, permutation, emb_dim, thr_for_mask, binary_masks,
                        rescale_masks, normalization):
    """AttractorFromEmbeddings.handle_output, attractor_from_embeddings.py:62-91 (masks read from its file)."""
    handled_output = np.reshape(handled_output, [np.shape(handled_output)[0], -1, emb_dim])
    masks = masks * np.expand_dims(usedbins, 0)
    masks = np.expand_dims(masks, -1)
    if thr_for_mask:
        binary = masks >= thr_for_mask
        if binary_masks:
            masks = binary
        else:
            masks = masks * binary
            if rescale_masks:
                masks[binary] = masks[binary] - np.min(masks[binary])
                masks[binary] = masks[binary] / np.max(masks[binary])
    handled_output = np.expand_dims(handled_output, 0)
    attractors = np.sum(handled_output * masks, axis=(1, 2)) / np.sum(masks, axis=(1, 2))
    attractors = attractors[permutation]
    if normalization:
        attractors = attractors / (np.linalg.norm(attractors, axis=-1, keepdims=True) + 1e-10)
    return attractors


def original_create_enr_vecs(utt_spkinfo, num_trials, nrS, rng, gender_specific_trials="all",
                             only_competing_spk=False):
    """EERFromIvecs.create_enr_vecs' trial drawing, equal_error_rate_from_ivecs.py:113-192 (``random`` -> rng)."""
    all_utt_names = list(utt_spkinfo.keys())
    mix2spk, spk2mix, spk2gender = {}, {}, {}
    for utt_name in all_utt_names:
        dataline_split = utt_spkinfo[utt_name].strip("\n").split(" ")
        mix_spk_ids = dataline_split[::2]
        mix_spk_genders = dataline_split[1::2]
        mix2spk[utt_name] = mix_spk_ids
        for spk_ind, spk_id in enumerate(mix_spk_ids):
            if spk_id in spk2mix:
                spk2mix[spk_id].append([utt_name, spk_ind])
            else:
                spk2mix[spk_id] = [[utt_name, spk_ind]]
            if spk_id not in spk2gender.keys():
                spk2gender[spk_id] = mix_spk_genders[spk_ind]
    all_spks = spk2mix.keys()
    all_enr_vec_pointers, all_target_labels = {}, {}
    for utt_name in all_utt_names:
        mix_spk_ids = mix2spk[utt_name]
        other_spk = list(set(all_spks) - set(mix_spk_ids))
        pointers_mix, labels_mix = [], []
        for spk_id in mix_spk_ids:
            spk_gender = spk2gender[spk_id]
            if (spk_gender == "F" and gender_specific_trials == "only_m") or \
                    (spk_gender == "M" and gender_specific_trials == "only_f"):
                pointers_mix.append([])
                labels_mix.append([])
                continue
            options = [tmp for tmp in spk2mix[spk_id] if tmp[0] != utt_name]
            if len(options) < num_trials:
                pos, pos_labels = options, np.ones(len(options), dtype=bool)
            else:
                pos, pos_labels = rng.sample(options, num_trials), np.ones(num_trials, dtype=bool)
            neg = []
            if not only_competing_spk:
                while len(neg) < num_trials:
                    random_utt_name = rng.choice(all_utt_names)
                    random_spk_ind = rng.randint(0, nrS - 1)
                    ids = mix2spk[random_utt_name]
                    spk_id_of_random_utt = ids[random_spk_ind]
                    valid = all([i in other_spk for i in ids])
                    g = spk2gender[spk_id_of_random_utt]
                    valid = valid and not (g == "F" and gender_specific_trials == "only_m") and not \
                        (g == "M" and gender_specific_trials == "only_f")
                    valid = valid and not (gender_specific_trials in ["same_gen", "same_gender"] and spk_gender != g)
                    valid = valid and not (gender_specific_trials in ["diff_gen", "diff_gender"] and spk_gender == g)
                    if valid:
                        neg.append([random_utt_name, random_spk_ind])
            else:
                competing = list(set(mix_spk_ids) - set([spk_id]))
                available = [p for c in competing for p in spk2mix[c]]
                rng.shuffle(available)
                for p in available:
                    g = spk2gender[mix2spk[p[0]][p[1]]]
                    valid = not (g == "F" and gender_specific_trials == "only_m") and not \
                        (g == "M" and gender_specific_trials == "only_f")
                    valid = valid and not (gender_specific_trials in ["same_gen", "same_gender"] and spk_gender != g)
                    valid = valid and not (gender_specific_trials in ["diff_gen", "diff_gender"] and spk_gender == g)
                    if valid:
                        neg.append(p)
                        if len(neg) >= num_trials:
                            break
            pointers_mix.append(pos + neg)
            labels_mix.append(np.concatenate([pos_labels, np.zeros(len(neg), dtype=bool)]))
        all_enr_vec_pointers[utt_name] = pointers_mix
        all_target_labels[utt_name] = labels_mix
    return all_enr_vec_pointers, all_target_labels


def original_eer(all_outputs, pointers, labels, nrS, thr_range, mvn):
    """_get_score (:194-236), summarize (:238-263) and get_eer (:298-325) of equal_error_rate_from_ivecs.py."""
    num_ground_trues = num_ground_falses = 0
    num_false_negative = np.zeros(np.shape(thr_range))
    num_false_positive = np.zeros(np.shape(thr_range))
    for utt, mix_pointers in pointers.items():
        handled_output = all_outputs[utt]
        for spk_ind in range(nrS):
            enr = [all_outputs[p[0]][p[1]] for p in mix_pointers[spk_ind]]
            labels_spk = labels[utt][spk_ind]
            if len(enr) == 0:
                continue
            cos_sims = np.dot(enr, handled_output[spk_ind])
            if mvn:
                if mvn == "all":
                    mean, std = np.mean(cos_sims), np.std(cos_sims)
                else:
                    mean, std = np.mean(cos_sims[labels_spk != 1]), np.std(cos_sims[labels_spk != 1])
                cos_sims = (cos_sims - mean) / std
            binary = [[c > thr for thr in thr_range] for c in cos_sims]
            false = np.logical_not(np.equal(binary, np.expand_dims(labels_spk, -1)))
            for tar_ind, tar in enumerate(labels_spk):
                if tar:
                    num_ground_trues += 1
                    num_false_negative += false[tar_ind]
                else:
                    num_ground_falses += 1
                    num_false_positive += false[tar_ind]
    fnr, fpr = num_false_negative / num_ground_trues, num_false_positive / num_ground_falses
    for ind in range(len(fnr)):
        if fpr[ind] < fnr[ind]:
            x1, y1, x2, y2 = fnr[ind - 1], fpr[ind - 1], fnr[ind], fpr[ind]
            return ((x2 - x1) * y1 - (y2 - y1) * x1) / ((x2 - x1) - (y2 - y1)), ind
    raise AssertionError("no EER")


# ------------------------------------------------------------------ tests
@pytest.mark.parametrize("thr,binary,rescale,norm", [(None, False, False, True), (0.5, True, False, False),
                                                     (0.5, False, True, True), (0.3, False, False, True)])
def test_attractors_from_embeddings_as_the_original(thr, binary, rescale, norm) -> None:
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((7, 5 * 4))
    masks = rng.random((2, 7, 5))
    usedbins = rng.random((7, 5)) > 0.3
    handler = {"emb_dim": 4, "normalization": norm,
               **({"thr_for_mask": thr, "binary_masks": binary, "rescale_masks": rescale} if thr else {})}
    for perm in ([0, 1], [1, 0]):
        ours = attractors_from_embeddings(emb, masks.copy(), usedbins, perm, handler)
        theirs = original_attractors(emb, masks.copy(), usedbins, perm, 4, thr or False, binary, rescale, norm)
        np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-12)
    vec = rng.standard_normal((2, 6))
    np.testing.assert_allclose(ivectors(vec, {"normalization": True}),
                               vec / (np.linalg.norm(vec, axis=-1, keepdims=True) + 1e-10))


def spkinfo_lines(n: int = 14, speakers: int = 7) -> dict[str, str]:
    rng = np.random.default_rng(3)
    genders = {s: "MF"[s % 2] for s in range(speakers)}
    out = {}
    for i in range(n):
        a, b = (int(x) for x in rng.choice(speakers, 2, replace=False))
        out[f"mix{i:02d}"] = f"{a} {genders[a]} {b} {genders[b]}"
    return out


@pytest.mark.parametrize("gender,competing,mvn", [("all", False, False), ("all", False, "all"),
                                                  ("same_gen", False, "non-target only"), ("only_m", False, False),
                                                  ("all", True, False)])
def test_trials_and_equal_error_rate_as_the_original(tmp_path: Path, gender, competing, mvn) -> None:
    info = spkinfo_lines()
    (tmp_path / "spkinfo").write_text("".join(f"{n} 2 {v}\n" for n, v in info.items()))
    names = list(info)
    assert {n: " ".join(v) for n, v in read_spkinfo(tmp_path / "spkinfo").items()} == info
    scorer = {"nrs": 2, "trials": 3, "gender": gender, "only_competing": competing, "mvn": mvn,
              "thresholds": np.arange(-3, 3.01, 0.01) if mvn else np.arange(-1, 1.01, 0.01),
              "spkinfo": {"datafiles": str(tmp_path / "spkinfo"), "section": "testspkinfo"},
              "load_trial_list": None, "store_trial_list": True, "make_figure": True}
    pointers, labels = draw_trials({n: v.split() for n, v in info.items()}, names, scorer, random.Random(5))
    want_p, want_l = original_create_enr_vecs(info, 3, 2, random.Random(5), gender, competing)
    assert pointers == want_p
    assert all(np.array_equal(a, b) for n in names for a, b in zip(labels[n], want_l[n]))
    rng = np.random.default_rng(1)
    vectors = {n: rng.standard_normal((2, 4)) for n in names}
    vectors = {n: v / np.linalg.norm(v, axis=-1, keepdims=True) for n, v in vectors.items()}
    eer, ind = original_eer(vectors, want_p, want_l, 2, scorer["thresholds"], mvn)
    fnr, fpr, _ = trial_errors(vectors, pointers, labels, scorer)
    assert equal_error_rate(fnr, fpr) == (pytest.approx(eer, abs=1e-12), ind)
    result = score_eer(tmp_path, "sv", scorer, vectors, 5, [])
    assert result["eer"] == pytest.approx(eer, abs=1e-12) and result["thr"] == pytest.approx(scorer["thresholds"][ind])
    stored = json.loads((tmp_path / "trials_sv.json").read_text())
    assert stored["enr_vec_pointers"] == want_p  # the original's trials_<scorer>.json
    assert json.loads((tmp_path / "results_sv_eer_from_ivec_summary.json").read_text())["eer"] == result["eer"]
    curve = list(csv.DictReader((tmp_path / "eer_curve_sv.csv").open()))
    assert len(curve) == len(scorer["thresholds"])
    # a trial list written earlier (the original's load_trial_list) gives the same trials and EER
    scorer2 = {**scorer, "load_trial_list": str(tmp_path / "trials_sv.json"), "store_trial_list": False}
    assert score_eer(tmp_path, "sv2", scorer2, vectors, 99, [])["eer"] == pytest.approx(eer, abs=1e-12)


def test_sample_speakers_get_their_voices_gender(tmp_path: Path) -> None:
    from mtlab.data import data_samples_dir
    from mtlab.nabu.samples import speaker_genders, write_spkinfo

    genders = speaker_genders(data_samples_dir())
    voices = dict(line.split("\t")[:2] for line in (data_samples_dir() / "speakers.tsv").read_text().splitlines()[1:])
    assert {str(k): v for k, v in genders.items()} == {k: "F" if "+f" in v else "M" for k, v in voices.items()}
    assert set(genders.values()) == {"M", "F"}
    (tmp_path / "spk.txt").write_text("a 0 1\nb 3 2\n")
    write_spkinfo(tmp_path / "info", tmp_path / "spk.txt", data_samples_dir())
    assert (tmp_path / "info").read_text() == f"a 2 0 {genders[0]} 1 {genders[1]}\nb 2 3 {genders[3]} 2 {genders[2]}\n"


def test_the_equal_error_rate_needs_crossing_rates() -> None:
    with pytest.raises(ConfigError, match="widen thr_range downwards"):
        equal_error_rate(np.array([0.5, 1.0]), np.array([0.2, 0.0]))
    with pytest.raises(ConfigError, match="never cross"):
        equal_error_rate(np.array([0.0, 0.1]), np.array([1.0, 0.9]))


SV_TASK = """
[task_sv]
requested_utts = 12
batch_size = 4
loss_type = dummy
evaluator = task_loss_evaluator
output_handling_type = speaker_verification
inputs = features
outputs = bin_emb
nodes = n0 bin_emb
n0_model = main
n0_inputs = features
bin_emb_model = outlayer
bin_emb_inputs = n0
features = testspec
targets = dummy_targets
dummy_targets = testspec
scorers_names = task_sv task_sv_mvn
"""
SV_HANDLER = """[task_sv]
speaker_verification_handler_type = attractor_from_embeddings
store_output = False
input_features = testspec
usedbins = testusedbins
task_for_masks = task_dc
score_type_for_perm = sdr
output_names = bin_emb
normalization = True
nrs = 2
emb_dim = 3
thr_for_mask = 0.5
binary_masks = True
"""
SV_SCORER = """[task_sv]
score_type = eer_from_ivec
input_features = testspec
nrs = 2
thr_range = -1 1.01 0.01
make_figure = True
spkinfo = testspkinfo
num_trials_per_mix_per_spk = 3
load_trial_list = /esat/trials_5.json

[task_sv_mvn]
score_type = eer_from_ivec
input_features = testspec
nrs = 2
thr_range = -3 3.01 0.01
spkinfo = testspkinfo
num_trials_per_mix_per_spk = 3
mvn_score_per_mix_spk = all
"""


def write_sv_recipe(folder: Path) -> Path:
    folder = write_test_recipe(folder)
    replace_in(folder, "test_evaluator.cfg", "tasks = task_dc task_pit", "tasks = task_dc task_sv")
    replace_in(folder, "test_evaluator.cfg", "requested_utts = 3\n", "requested_utts = 12\n")
    with (folder / "test_evaluator.cfg").open("a") as f:
        f.write(SV_TASK)
    (folder / "speaker_verification_handler.cfg").write_text(SV_HANDLER)
    (folder / "speaker_verification_scorer.cfg").write_text(SV_SCORER)
    with (folder / "loss.cfg").open("a") as f:
        f.write("\n[dummy]\nloss_type = dummy\n")  # as the DANet recipes' loss.cfg
    return folder


def test_reading_speaker_verification_tasks_and_their_errors(tmp_path: Path) -> None:
    folder = write_sv_recipe(tmp_path / "SV")
    tests = read_test(folder, tmp_path / "data")
    sv = tests["task_sv"]
    assert sv.refused is None and sv.handler["type"] == "attractor_from_embeddings" and sv.task["loss"]["type"] == "dummy"
    assert list(sv.sv_scorers) == ["task_sv", "task_sv_mvn"] and sv.sv_scorers["task_sv_mvn"]["mvn"] == "all"
    assert sv.sv_scorers["task_sv"]["spkinfo"]["datafiles"].endswith("tt/utt_spkinfo.txt")
    replace_in(folder, "speaker_verification_handler.cfg", "= attractor_from_embeddings", "= averager")
    with pytest.raises(ConfigError, match=r"speaker_verification_handler\.cfg: \[task_sv\] speaker_verification_"
                                          r"handler_type = 'averager': mtlab handles attractor_from_embeddings"):
        read_test(folder, tmp_path / "data")
    (folder / "speaker_verification_handler.cfg").unlink()
    with pytest.raises(ConfigError, match=r"speaker_verification_handler\.cfg: no \[task_sv\] section"):
        read_test(folder, tmp_path / "data")


@pytest.mark.slow
def test_a_recipe_with_speaker_verification_tests_fully(tmp_path: Path) -> None:
    """The separation task writes its masks and speaker order; the verification task turns the embeddings into
    attractors with them and scores trials with both scorers (equal to the transcribed original on the files)."""
    import mtlab
    from mtlab.apps.nabu_test import run_test
    from mtlab.nabu import import_nabu, make_sample_root, plain_recipe
    from mtlab.nabu.evaluation import make_test_root
    from mtlab.training.checkpoint import save_checkpoint

    folder = write_sv_recipe(tmp_path / "SV")
    data = tmp_path / "data"
    recipe = import_nabu(folder, data_root=data)
    make_sample_root(recipe, limit=6)
    tests = read_test(folder, data)
    make_test_root(tests, limit=12)
    exp = mtlab.from_recipe(plain_recipe(recipe))
    save_checkpoint(exp.trainer, exp.schedule, tmp_path / "exp" / "final.pt", recipe=exp.recipe)
    result = run_test(tmp_path / "exp", limit=12, recipe_dir=folder, data_root=data)
    summary = {r["task"]: r for r in result.summary}
    assert "error" not in summary["task_sv"] and "refused" not in summary["task_sv"], summary
    assert summary["task_sv"]["utterances"] == 12 and summary["task_sv"]["loss"] == 0.0  # the dummy loss
    out = tmp_path / "exp" / "test"
    perms = {r["utterance"]: [int(p) - 1 for p in r["perm"].split()]
             for r in csv.DictReader((out / "task_dc" / "scores.csv").open())}
    info = {n: " ".join(v) for n, v in read_spkinfo(Path(tests["task_sv"].sv_scorers["task_sv"]["spkinfo"]
                                                         ["datafiles"])).items()}
    vectors = {}
    for name in perms:
        vectors[name] = np.load(out / "task_sv" / "data" / f"{name}.npy")
        assert vectors[name].shape == (2, 3)
        np.testing.assert_allclose(np.linalg.norm(vectors[name], axis=-1), 1, atol=1e-6)
    assert any("load_trial_list /esat/trials_5.json does not exist" in n for n in result.notes)
    # the speaker-information list written from the samples' voices gives the original's summary its mixture types
    kinds = {r["mix_type"]: int(r["utterances"]) for r in csv.DictReader((out / "task_dc" / "summary_original.csv").open())
             if r["metric"] == "SDR" and r["scenario"] == "SS"}
    assert kinds["all"] == 12 and kinds["diff_gen"] + kinds["same_gen"] == 12 and kinds["all_m"] + kinds["all_f"] == \
        kinds["same_gen"]
    for sname, key, thr, mvn in (("task_sv", "eer", np.arange(-1, 1.01, 0.01), False),
                                 ("task_sv_mvn", "task_sv_mvn.eer", np.arange(-3, 3.01, 0.01), "all")):
        trials = json.loads((out / "task_sv" / f"trials_{sname}.json").read_text())
        labels = {n: [np.array(v, dtype=bool) for v in lab] for n, lab in trials["target_labels"].items()}
        eer, _ = original_eer(vectors, trials["enr_vec_pointers"], labels, 2, thr, mvn)
        assert summary["task_sv"][key] == pytest.approx(eer, abs=1e-9)
        assert set(trials["enr_vec_pointers"]) == set(info) & set(perms)
