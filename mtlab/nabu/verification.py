"""Speaker-verification test tasks of an original recipe, as the original's test script runs them.

A test task with ``output_handling_type = speaker_verification`` (``nabu/scripts/test.py:44-71, 161-172,
305-314`` at the original's revision 5e862cb) is handled by ``speaker_verification_handler.cfg`` and scored by
``speaker_verification_scorer.cfg`` instead of the reconstructor and scorer:

- the **handler** turns each utterance's outputs into one vector per speaker, stored as
  ``<task>/data/<utterance>.npy``: ``attractor_from_embeddings`` (``attractor_from_embeddings.py``) averages the
  speaker embeddings over the time-frequency bins under each speaker's mask of the separation task
  ``task_for_masks`` (its masks times the used bins, optionally thresholded, binarised or rescaled), puts the
  speakers in the order the separation task's scorer matched them to the references and length-normalises;
  ``ivector_extractor`` (``ivector_extractor.py``) takes the model's attractor output, length-normalised;
- the **scorer** ``eer_from_ivec`` (``equal_error_rate_from_ivecs.py``) draws, for every speaker of every
  mixture, target trials (the same speaker in other mixtures) and non-target trials (speakers of mixtures that
  share no speaker with it, or the competing speaker), scores each trial by the dot product of the two vectors
  (optionally mean-variance normalised per mixture speaker), counts false negatives and positives over the
  thresholds ``thr_range`` and reports the equal error rate where the two rates cross (``get_eer``).

Differences: the original draws its trials with Python's unseeded ``random``; mtlab draws the same way from
``random.Random(seed)`` so a test is repeatable; a ``load_trial_list`` file that does not exist here is noted
and the trials are drawn instead; the original draws trials over every utterance of the ``spkinfo`` list, mtlab
over the utterances the test handled (the same when every test utterance is run); ``make_figure`` writes the
error-rate curve as ``eer_curve_<scorer>.csv`` (the core draws no figures).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..base.errors import ConfigError
from .ini import section_kind

HANDLERS = ("attractor_from_embeddings", "ivector_extractor")
HANDLER_KEYS = ("speaker_verification_handler_type", "store_output", "input_features", "usedbins", "task_for_masks",
                "score_type_for_perm", "normalization", "nrs", "emb_dim", "thr_for_mask", "binary_masks",
                "rescale_masks", "output_names", "cut_to_seq_length")
SV_SCORERS = ("eer_from_ivec",)
SV_SCORER_KEYS = ("score_type", "input_features", "nrs", "thr_range", "make_figure", "spkinfo",
                  "num_trials_per_mix_per_spk", "load_trial_list", "mvn_score_per_mix_spk", "store_trial_list",
                  "gender_specific_trials", "only_competing_spk", "load_enr_vecs")
BASE_OUTPUTS = {"attractor_from_embeddings": "speaker_bin_embeddings", "ivector_extractor": "attractor"}


def read_handler(file: Path, tname: str, conf: Mapping[str, str], section_list: Callable[[str, str], dict[str, Any]]
                 ) -> dict[str, Any]:
    """A task's ``speaker_verification_handler.cfg`` section; ``section_list(key, value)`` reads a database section."""
    kind = section_kind(file, f"[{tname}]", conf, "speaker_verification_handler_type", HANDLERS, "handles",
                        HANDLER_KEYS, "speaker-verification handler", ("nrs",))
    outputs = conf.get("output_names", BASE_OUTPUTS[kind]).split()
    if len(outputs) != 1:
        raise ConfigError(f"{file}: [{tname}] output_names = {conf['output_names']!r}: the original expects one")
    out: dict[str, Any] = {"type": kind, "nrs": int(conf["nrs"]), "output": outputs[0],
                           "normalization": conf.get("normalization", "True") == "True",
                           "store_output": conf.get("store_output", "False") == "True"}
    if kind == "attractor_from_embeddings":
        for key in ("emb_dim", "task_for_masks", "score_type_for_perm", "usedbins"):
            if key not in conf:
                raise ConfigError(f"{file}: [{tname}] needs {key} (the original's attractor_from_embeddings reads it)")
        if conf["task_for_masks"] in ("here", "None", tname):
            raise ConfigError(f"{file}: [{tname}] task_for_masks = {conf['task_for_masks']!r}: the original has no "
                              "such case either (NotImplementedError); name the separation test task")
        out.update(emb_dim=int(conf["emb_dim"]), task_for_masks=conf["task_for_masks"],
                   score_type_for_perm=conf["score_type_for_perm"])
        section_list("usedbins", conf["usedbins"])  # must exist in database.conf, as the original reads it
        if "thr_for_mask" in conf:
            out["thr_for_mask"] = float(conf["thr_for_mask"])
            out["binary_masks"] = conf.get("binary_masks") == "True"
            out["rescale_masks"] = not out["binary_masks"] and conf.get("rescale_masks") == "True"
    return out


def read_sv_scorer(file: Path, sname: str, conf: Mapping[str, str],
                   section_list: Callable[[str, str], dict[str, Any]]) -> dict[str, Any]:
    """A ``speaker_verification_scorer.cfg`` section."""
    kind = section_kind(file, f"[{sname}]", conf, "score_type", SV_SCORERS, "scores speaker verification with",
                        SV_SCORER_KEYS, "speaker-verification scorer", ("nrs", "thr_range", "spkinfo",
                                                                        "num_trials_per_mix_per_spk"))
    if conf.get("load_enr_vecs", "None") != "None":
        raise ConfigError(f"{file}: [{sname}] load_enr_vecs = {conf['load_enr_vecs']!r}: mtlab enrols with the "
                          "test's own vectors (load_enr_vecs = None)")
    start, stop, step = (float(x) for x in conf["thr_range"].split())
    mvn = conf.get("mvn_score_per_mix_spk", "False")
    if mvn not in ("False", "True", "all", "non-target only"):
        raise ConfigError(f"{file}: [{sname}] mvn_score_per_mix_spk = {mvn!r}; the original knows False, True, all, "
                          "non-target only")
    gender = conf.get("gender_specific_trials", "all")
    if gender not in ("all", "only_m", "only_f", "same_gen", "same_gender", "diff_gen", "diff_gender"):
        raise ConfigError(f"{file}: [{sname}] gender_specific_trials = {gender!r}")
    load = conf.get("load_trial_list", "None")
    return {"type": kind, "nrs": int(conf["nrs"]), "thresholds": np.arange(start, stop, step),
            "spkinfo": section_list("spkinfo", conf["spkinfo"]), "trials": int(conf["num_trials_per_mix_per_spk"]),
            "mvn": {"False": False, "True": "all"}.get(mvn, mvn), "gender": gender,
            "only_competing": conf.get("only_competing_spk") == "True",
            "load_trial_list": None if load == "None" else load,
            "store_trial_list": conf.get("store_trial_list", "True") == "True",  # when drawn here, not loaded
            "make_figure": conf.get("make_figure") == "True"}


# ---------------------------------------------------------------------------------- handlers
def attractors_from_embeddings(embeddings: np.ndarray, masks: np.ndarray, usedbins: np.ndarray, perm: list[int],
                               handler: Mapping[str, Any]) -> np.ndarray:
    """``AttractorFromEmbeddings.handle_output`` (attractor_from_embeddings.py:62-91): ``embeddings [T, F*D]``,
    the separation task's ``masks [S, T, F]`` and ``usedbins [T, F]``, its speaker order ``perm``; ``[S, D]``."""
    emb = embeddings.reshape(embeddings.shape[0], -1, handler["emb_dim"])
    m = (masks * usedbins[None])[..., None]
    if "thr_for_mask" in handler:
        binary = m >= handler["thr_for_mask"]
        if handler["binary_masks"]:
            m = binary
        else:
            m = m * binary
            if handler["rescale_masks"]:
                m[binary] = m[binary] - np.min(m[binary])
                m[binary] = m[binary] / np.max(m[binary])
    attractors = np.sum(emb[None] * m, axis=(1, 2)) / np.sum(m, axis=(1, 2))
    attractors = attractors[perm]
    return _normalize(attractors) if handler["normalization"] else attractors


def _normalize(vectors: np.ndarray) -> np.ndarray:
    return vectors / (np.linalg.norm(vectors, axis=-1, keepdims=True) + 1e-10)


def ivectors(output: np.ndarray, handler: Mapping[str, Any]) -> np.ndarray:
    """``IvectorExtractor.handle_output`` (ivector_extractor.py:29-34): the attractor output, length-normalised."""
    return _normalize(output) if handler["normalization"] else output


# ---------------------------------------------------------------------------------- the EER scorer
def read_spkinfo(path: Path) -> dict[str, list[str]]:
    """``name <field> id1 gender1 id2 gender2 ...`` -> ``{name: [id1, gender1, ...]}`` (the third word on)."""
    if not path.is_file():
        raise ConfigError(f"{path}: no speaker-information list (the scorer's spkinfo); lines 'name N id1 gender1 "
                          "id2 gender2 ...'")
    out = {}
    for line in path.read_text().splitlines():
        words = line.strip().split(" ")
        if words and words[0]:
            out[words[0]] = words[2:]
    return out


def draw_trials(spkinfo: Mapping[str, list[str]], names: list[str], scorer: Mapping[str, Any], rng: random.Random
                ) -> tuple[dict[str, list[list[list[Any]]]], dict[str, list[np.ndarray]]]:
    """``EERFromIvecs.create_enr_vecs``' trial lists (equal_error_rate_from_ivecs.py:94-192) over ``names``:
    per mixture and speaker, the enrolment pointers ``[utterance, speaker index]`` and their target labels."""
    nrs, count, gender_rule = scorer["nrs"], scorer["trials"], scorer["gender"]
    mix2spk: dict[str, list[str]] = {}
    spk2mix: dict[str, list[list[Any]]] = {}
    spk2gender: dict[str, str] = {}
    for name in names:
        ids, genders = spkinfo[name][::2], spkinfo[name][1::2]
        mix2spk[name] = ids
        for index, sid in enumerate(ids):
            spk2mix.setdefault(sid, []).append([name, index])
            spk2gender.setdefault(sid, genders[index])
    all_spks = list(spk2mix)

    def allowed(spk_gender: str, other: str) -> bool:
        return not (other == "F" and gender_rule == "only_m") and not (other == "M" and gender_rule == "only_f") \
            and not (gender_rule in ("same_gen", "same_gender") and spk_gender != other) \
            and not (gender_rule in ("diff_gen", "diff_gender") and spk_gender == other)

    pointers: dict[str, list[list[list[Any]]]] = {}
    labels: dict[str, list[np.ndarray]] = {}
    for name in names:
        ids = mix2spk[name]
        other_spk = set(all_spks) - set(ids)
        mix_pointers: list[list[list[Any]]] = []
        mix_labels: list[np.ndarray] = []
        for sid in ids:
            gender = spk2gender[sid]
            if (gender == "F" and gender_rule == "only_m") or (gender == "M" and gender_rule == "only_f"):
                mix_pointers.append([])
                mix_labels.append(np.zeros(0, dtype=bool))
                continue
            options = [p for p in spk2mix[sid] if p[0] != name]
            pos = options if len(options) < count else rng.sample(options, count)
            neg: list[list[Any]] = []
            if not scorer["only_competing"]:
                candidates = [n for n in names if all(s in other_spk for s in mix2spk[n])]
                if not any(allowed(gender, spk2gender[s]) for n in candidates for s in mix2spk[n]):
                    raise ConfigError(f"no non-target trial can be drawn for speaker {sid} of {name!r} under "
                                      f"gender_specific_trials = {gender_rule!r} among {len(names)} utterances (the "
                                      "original would loop for ever); test more utterances")
                while len(neg) < count:
                    rand_name = rng.choice(names)
                    rand_index = rng.randint(0, nrs - 1)
                    rand_ids = mix2spk[rand_name]
                    if all(s in other_spk for s in rand_ids) and allowed(gender, spk2gender[rand_ids[rand_index]]):
                        neg.append([rand_name, rand_index])
            else:
                competing = list(set(ids) - {sid})
                available = [p for c in competing for p in spk2mix[c]]
                rng.shuffle(available)
                for p in available:
                    if allowed(gender, spk2gender[mix2spk[p[0]][p[1]]]):
                        neg.append(p)
                        if len(neg) >= count:
                            break
            mix_pointers.append(pos + neg)
            mix_labels.append(np.concatenate([np.ones(len(pos), dtype=bool), np.zeros(len(neg), dtype=bool)]))
        pointers[name], labels[name] = mix_pointers, mix_labels
    return pointers, labels


def trial_errors(vectors: Mapping[str, np.ndarray], pointers: Mapping[str, list[list[list[Any]]]],
                 labels: Mapping[str, list[np.ndarray]], scorer: Mapping[str, Any]) -> tuple[np.ndarray, ...]:
    """``_get_score`` and ``summarize`` (equal_error_rate_from_ivecs.py:194-276): the false-negative and
    false-positive rates per threshold, and the counts of target and non-target trials."""
    thr = scorer["thresholds"]
    trues = falses = 0
    false_neg = np.zeros(thr.shape)
    false_pos = np.zeros(thr.shape)
    for name, mix_pointers in pointers.items():
        for s in range(scorer["nrs"]):
            if not len(mix_pointers[s]):
                continue
            enrol = np.stack([vectors[p[0]][p[1]] for p in mix_pointers[s]])
            target = np.asarray(labels[name][s], dtype=bool)
            sims = enrol @ vectors[name][s]
            if scorer["mvn"]:
                pool = sims if scorer["mvn"] == "all" else sims[~target]
                with np.errstate(divide="ignore", invalid="ignore"):  # one non-target trial: as the original, NaN
                    sims = (sims - np.mean(pool)) / np.std(pool)
            wrong = (sims[:, None] > thr[None, :]) != target[:, None]
            false_neg += wrong[target].sum(0)
            false_pos += wrong[~target].sum(0)
            trues += int(target.sum())
            falses += int((~target).sum())
    if not trues or not falses:
        raise ConfigError(f"{trues} target and {falses} non-target trials: an equal error rate needs both; test more "
                          "utterances (the speakers must recur across mixtures)")
    return false_neg / trues, false_pos / falses, np.array([trues, falses])


def equal_error_rate(false_neg: np.ndarray, false_pos: np.ndarray) -> tuple[float, int]:
    """``get_eer`` (equal_error_rate_from_ivecs.py:298-325): the crossing of the two rates, interpolated between the
    thresholds around it; ``(eer, index of the threshold after the crossing)``."""
    if false_pos[0] < false_neg[0]:
        raise ConfigError("the error rates start crossed (more false negatives than false positives at the lowest "
                          "threshold): widen thr_range downwards")
    for ind in range(len(false_neg)):
        if false_pos[ind] < false_neg[ind]:
            x1, y1, x2, y2 = false_neg[ind - 1], false_pos[ind - 1], false_neg[ind], false_pos[ind]
            return float(((x2 - x1) * y1 - (y2 - y1) * x1) / ((x2 - x1) - (y2 - y1))), ind
    raise ConfigError("the error rates never cross within thr_range: widen thr_range upwards")


def score_eer(task_dir: Path, sname: str, scorer: Mapping[str, Any], vectors: Mapping[str, np.ndarray], seed: int,
              notes: list[str]) -> dict[str, Any]:
    """One ``eer_from_ivec`` scorer over the handled vectors: draws (or loads) the trials, writes
    ``trials_<scorer>.json`` (``store_trial_list``), ``results_<scorer>_eer_from_ivec_summary.json`` and, with
    ``make_figure``, ``eer_curve_<scorer>.csv``; returns ``{"eer": ..., "thr": ...}``."""
    spkinfo = read_spkinfo(Path(scorer["spkinfo"]["datafiles"]))
    names = [n for n in vectors if n in spkinfo]
    missing = [n for n in vectors if n not in spkinfo]
    if missing:
        raise ConfigError(f"{scorer['spkinfo']['datafiles']}: no speaker information for {missing[0]!r} (and "
                          f"{len(missing) - 1} more); the scorer's spkinfo must list every test utterance")
    if len(spkinfo) > len(names):
        notes.append(f"scorer {sname}: trials among the {len(names)} handled utterances (the spkinfo list has "
                     f"{len(spkinfo)}; the original handles all of them)")
    loaded = scorer["load_trial_list"]
    drawn = not (loaded and Path(loaded).is_file())
    if not drawn:
        dump = json.loads(Path(loaded).read_text())
        pointers = {n: dump["enr_vec_pointers"][n] for n in names}
        labels = {n: [np.array(v, dtype=bool) for v in dump["target_labels"][n]] for n in names}
    else:
        if loaded:
            notes.append(f"scorer {sname}: load_trial_list {loaded} does not exist here; trials drawn as the "
                         "original draws them (seeded)")
        pointers, labels = draw_trials(spkinfo, names, scorer, random.Random(seed))
    if drawn and scorer["store_trial_list"]:
        (task_dir / f"trials_{sname}.json").write_text(json.dumps(
            {"enr_vec_pointers": pointers, "target_labels": {n: [v.astype(int).tolist() for v in lab]
                                                             for n, lab in labels.items()}}))
    false_neg, false_pos, counts = trial_errors(vectors, pointers, labels, scorer)
    eer, ind = equal_error_rate(false_neg, false_pos)
    result = {"eer": eer, "thr": float(scorer["thresholds"][ind]), "target_trials": int(counts[0]),
              "nontarget_trials": int(counts[1])}
    (task_dir / f"results_{sname}_eer_from_ivec_summary.json").write_text(json.dumps(result))
    if scorer["make_figure"]:
        rows = ["threshold,false_positive_rate,false_negative_rate"]
        rows += [f"{t:.6g},{fp:.6g},{fn:.6g}" for t, fp, fn in zip(scorer["thresholds"], false_pos, false_neg)]
        (task_dir / f"eer_curve_{sname}.csv").write_text("\n".join(rows) + "\n")
    if not math.isfinite(eer):
        raise ConfigError(f"scorer {sname}: the equal error rate is not finite")
    return result
