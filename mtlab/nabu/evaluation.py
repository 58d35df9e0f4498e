"""An imported recipe's test, as the original's ``run test`` does it: the test loss, separation, scores.

Examples:
    >>> # an experiment trained from an original recipe
    >>> result = mtlab.apps.nabu_test.run_test("exp/dc")  # doctest: +SKIP
    >>> # per task: utterances, test loss, SDR, SDR improvement, ...
    >>> result.summary  # doctest: +SKIP

``test_evaluator.cfg`` names the test tasks (their graphs, losses and test data); each task's loss is summed
over the test utterances (the first ``requested_utts``) and divided by its summed normalizer, as validation
is. ``reconstructor.cfg`` says how each task's outputs become separated signals
(:data:`mtlab.separation.reconstruct.RECONSTRUCTORS`: deep-clustering k-means, attractors, stacked masks),
``scorer.cfg`` how they are scored (``sdr``, ``sdr_snr``). Per task, under the output folder (``EXPDIR/test``):

- ``<task>/s1 ... sN/<utterance>.wav``: the separated signals (16-bit, peak 1 as the original scales them; with
  ``wav_format="float32"`` 32-bit float as the original writes them),
  always written, as the original does; ``store_output = True`` adds ``raw_output/<output>_<utterance>.npy``;
  ``store_masks = True`` adds ``masks/<utterance>.npy``;
- ``<task>/scores.csv``: per utterance, BSS-eval's SDR, SIR and SAR (512 taps) of the separated signals, of the
  mixture and the improvements, SI-SDR and STOI beside them (PESQ when asked), each the mean over the speakers, and
  the speaker order matched to the references: by mean SIR as the original's ``bss_eval.py:542-543``
  (``order="si_sdr"``: by SI-SDR, as mtlab's own evaluation);
- ``<task>/summary_original.csv``: the original's summary (``scorer.py:262-316``): SDR, SIR and SAR of the
  separated signals (``SS``) and of the mixture (``base``) with mean, std and median, over all utterances and per
  mixture type (``all_m``, ``all_f``, ``same_gen``, ``diff_gen``) where the scorer's ``spkinfo`` list exists;
- ``summary.csv``: per task, the test loss and the means of those columns.

``scorers_names`` in a test task's section names the ``scorer.cfg`` sections that score it (the original's default:
the task's own name). Each scores the same separated signals against the references of its own ``org_src`` list
(``name s1.wav ... sN.wav``; where the list does not exist, the folder's ``s1.scp`` ... ``sN.scp``): the task's own
scorer gives the plain columns, another one its columns with its name before them (``<scorer>.sdr``, ...), in
``scores.csv`` and ``summary.csv``, and a line ``task [scorer]`` of its own in the printed table.

Audio is read as the original reads it (int16 values); the mixture's spectrum is the reconstructor's
``org_mix`` processor's (``rec_processor.cfg``), the references are the sources ``s1 ... sN`` of the test
folder, cut to the snipped length as the original's score processor cuts them. Unlike the original,
``sdr_snr``'s noise terms are not computed (it is scored as ``sdr``; the summary says so).
"""

from __future__ import annotations

import csv
import math
from configparser import ConfigParser
import struct
import wave
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TYPE_CHECKING

import numpy as np
import torch

from ..base.errors import ConfigError, MtlabError
from .database import SAMPLE_RATE, DataSections, processor_path
from .importer import Importer, build_task
from .ini import read_ini, section, section_kind, words

if TYPE_CHECKING:
    from ..core.trainer import Trainer

RECONSTRUCTOR_KEYS = ("reconstruct_type", "org_mix", "usedbins", "nrs", "store_output", "activation",
                      "output_activation", "noise_threshold_for_kmeans", "min_kmeans_perc", "store_masks")
SCORER_KEYS = ("score_type", "org_src", "base", "spkinfo", "noise", "nrs")
SCORERS = ("sdr", "sdr_snr")
METRICS = ("sdr", "si_sdr", "stoi")


class TestRefused(ConfigError):
    """A test task the trained model cannot run as its configs ask (reported as refused, the other tasks go on)."""


@dataclass
class EvalTask:
    """One test task: its mtlab task table, batch size and utterance limit, reconstructor and scorer."""

    name: str
    task: dict[str, Any]
    batch_size: int
    requested_utts: int | None
    reconstructor: dict[str, Any] | None = None
    scorers: dict[str, dict[str, Any]] = field(default_factory=dict)  # scorer.cfg section name -> scorer
    notes: list[str] = field(default_factory=list)
    refused: str | None = None  # why the task is not run (then ``task`` is empty)
    handler: dict[str, Any] | None = None  # speaker verification: speaker_verification_handler.cfg's section
    sv_scorers: dict[str, dict[str, Any]] = field(default_factory=dict)  # speaker_verification_scorer.cfg sections
    keep_masks: bool = False  # a speaker-verification task reads this task's masks, used bins and speaker order

    @property
    def scorer(self) -> dict[str, Any] | None:
        """The first scorer (the task's own section of ``scorer.cfg`` unless ``scorers_names`` says otherwise)."""
        return next(iter(self.scorers.values()), None)


@dataclass
class EvalResult:
    """What :func:`evaluate_tests` gives: per-task summary rows, per-task utterance rows, the output folder."""

    summary: list[dict[str, Any]]
    utterances: dict[str, list[dict[str, Any]]]
    out: Path
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------- reading the configs
def read_test(recipe_dir: str | Path, data_root: str | Path) -> dict[str, EvalTask]:
    """The test tasks of an original recipe folder (``test_evaluator.cfg``, ``reconstructor.cfg``,
    ``scorer.cfg``), data paths re-rooted under ``data_root``. A setting mtlab cannot honour is a ConfigError
    naming the file and the key."""
    folder = Path(recipe_dir)
    imp = Importer(folder, str(data_root), strict=True)
    path = folder / "test_evaluator.cfg"
    parser = read_ini(path)
    ev = section(parser, "evaluator", path)
    if ev.get("evaluator") != "multi_task":
        raise ConfigError(f"{path}: [evaluator] evaluator = {ev.get('evaluator')!r}: mtlab tests with the original's "
                          "multi_task evaluator (each task's loss)")
    if ev.get("segment_length", "full") != "full":
        raise ConfigError(f"{path}: [evaluator] segment_length = {ev['segment_length']!r}: mtlab tests whole "
                          "utterances ('full')")
    data = DataSections(imp, imp.data_root)
    db, globalvars, reroot = data.parser, data.globalvars, data.reroot  # the other configs' paths and values
    losses = read_ini(folder / "loss.cfg", required=False)
    rparser = read_ini(folder / "reconstructor.cfg", required=False)
    sparser = read_ini(folder / "scorer.cfg", required=False)
    out: dict[str, EvalTask] = {}
    for tname in words(ev.get("tasks", "")):
        conf = section(parser, tname, path)
        handling = conf.pop("output_handling_type", "reconstructor")
        if handling not in ("reconstructor", "speaker_verification"):  # test.py:44-71 knows these two
            raise ConfigError(f"{path}: [{tname}] output_handling_type = {handling!r}: the original's test script "
                              "knows reconstructor and speaker_verification")
        post = conf.pop("postprocessors_names", None)  # i-vector extraction after the test: not run here
        scorers_names = words(conf.pop("scorers_names", "")) or [tname]  # the original's default: the task's name
        if conf.get("evaluator", "task_loss_evaluator") != "task_loss_evaluator":
            raise ConfigError(f"{path}: [{tname}] evaluator = {conf['evaluator']!r}: mtlab evaluates a test task "
                              "with its loss (task_loss_evaluator)")
        orig = imp.task("test_evaluator.cfg", tname, conf, data, evaluator=True)
        if handling == "speaker_verification" and orig["loss_type"] in ("dummy", "dummy_loss"):
            for lset in orig["linkedsets"].values():  # the dummy loss reads no target (dummy_loss.py)
                for target in orig["targets"]:
                    if target not in orig["inputs"]:
                        lset["sections"].pop(target, None)
            orig["targets"] = []
        table, _ = build_task(imp, tname, orig, None, losses, {})
        batch = orig.get("batch_size") or int(ev.get("batch_size", "1"))
        requested = orig.get("requested_utts") or (int(ev["requested_utts"]) if "requested_utts" in ev else None)
        test = EvalTask(tname, table, batch, requested)
        if post:
            test.notes.append(f"postprocessors {post!r} (test_evaluator.cfg [{tname}] postprocessors_names) are not "
                              "run: mtlab extracts no i-vectors")
        if handling == "speaker_verification":
            _verification(imp, folder, test, scorers_names, db, globalvars, reroot)
            out[tname] = test
            continue
        if rparser is not None and rparser.has_section(tname):
            rpath = folder / "reconstructor.cfg"
            test.reconstructor = _reconstructor(imp, rpath, tname, section(rparser, tname, rpath), db, globalvars,
                                                reroot)
        spath = folder / "scorer.cfg"
        for name in scorers_names:
            if sparser is None or not sparser.has_section(name):
                if name == tname and len(scorers_names) == 1:
                    continue  # no scorer for this task: test loss and separation only
                raise ConfigError(f"{spath}: no [{name}] section, named by test_evaluator.cfg [{tname}] "
                                  f"scorers_names; sections: {', '.join(sparser.sections()) if sparser else 'none'}")
            test.scorers[name] = _scorer(imp, spath, name, section(sparser, name, spath), db, globalvars, reroot)
        out[tname] = test
    if not out:
        raise ConfigError(f"{path}: [evaluator] tasks names no task")
    return out


def _verification(imp: Importer, folder: Path, test: EvalTask, scorers_names: list[str], db: ConfigParser,
                  globalvars: Mapping[str, str], reroot: Callable[[str], str]) -> None:
    """A speaker-verification test task's handler and scorers (test.py:58-67: speaker_verification_handler.cfg and
    speaker_verification_scorer.cfg, sections by the task's name and its scorers_names)."""
    from .verification import read_handler, read_sv_scorer

    hpath, spath = folder / "speaker_verification_handler.cfg", folder / "speaker_verification_scorer.cfg"
    hparser, sparser = read_ini(hpath, required=False), read_ini(spath, required=False)
    if hparser is None or not hparser.has_section(test.name):
        raise ConfigError(f"{hpath}: no [{test.name}] section for the speaker-verification test task (the original "
                          "reads it)")

    def reader(file: Path, name: str) -> Callable[[str, str], dict[str, Any]]:
        return lambda key, value: _list_section(imp, file, f"[{name}] {key}", value, db, globalvars, reroot,
                                                processor=False)

    test.handler = read_handler(hpath, test.name, section(hparser, test.name, hpath), reader(hpath, test.name))
    for name in scorers_names:
        if sparser is None or not sparser.has_section(name):
            raise ConfigError(f"{spath}: no [{name}] section, named by test_evaluator.cfg [{test.name}] scorers_names "
                              "(or the task's own name)")
        test.sv_scorers[name] = read_sv_scorer(spath, name, section(sparser, name, spath), reader(spath, name))


def _list_section(imp: Importer, file: Path, key: str, name: str, db: ConfigParser, globalvars: Mapping[str, str],
                  reroot: Callable[[str], str], processor: bool = True) -> dict[str, Any]:
    """A database section a reconstructor or scorer names: its re-rooted list and processor settings."""
    from ..data.features import Spectral

    names = words(name)
    if len(names) != 1:
        raise ConfigError(f"{file}: {key} = {name!r}: mtlab reads one database section here")
    if not db.has_section(names[0]):
        raise ConfigError(f"{file}: {key} = {name!r}: no such section in database.conf")
    conf = {k: (globalvars.get(k, v) if v.strip() == "globalvars" else v).strip() for k, v in db.items(names[0])}
    if "datafiles" not in conf:
        raise ConfigError(f"{imp.folder / 'database.conf'}: [{names[0]}] needs datafiles")
    out: dict[str, Any] = {"section": names[0], "datafiles": reroot(conf["datafiles"])}
    if processor and "processor_config" in conf:
        proc_path = processor_path(imp.folder, conf["processor_config"])
        if not proc_path.is_file():
            raise ConfigError(f"{imp.folder / 'database.conf'}: [{names[0]}] processor_config = "
                              f"{conf['processor_config']!r} is neither in the recipe folder nor below the recipes' root")
        proc = section(read_ini(proc_path), "processor", proc_path)
        if "winlen" in proc:
            out["spectral"] = Spectral.from_processor_config(proc, SAMPLE_RATE, origin=str(proc_path))
        out["processor"] = proc
    return out


def _reconstructor(imp: Importer, file: Path, tname: str, conf: Mapping[str, str], db: ConfigParser,
                   globalvars: Mapping[str, str], reroot: Callable[[str], str]) -> dict[str, Any]:
    from ..separation.reconstruct import ACTIVATIONS, RECONSTRUCTORS

    kind = section_kind(file, f"[{tname}]", conf, "reconstruct_type", tuple(RECONSTRUCTORS), "reconstructs with",
                        RECONSTRUCTOR_KEYS, "reconstructor", ("org_mix", "nrs"))
    out: dict[str, Any] = {"type": kind, "nrs": imp.value(file.name, f"[{tname}] nrs", "int", conf["nrs"]),
                           "store_output": conf.get("store_output", "False") == "True",
                           "store_masks": conf.get("store_masks", "False") == "True", "options": {}}
    out["org_mix"] = _list_section(imp, file, f"[{tname}] org_mix", conf["org_mix"], db, globalvars, reroot)
    if "spectral" not in out["org_mix"]:
        raise ConfigError(f"{file}: [{tname}] org_mix = {conf['org_mix']!r}: its processor gives no STFT settings "
                          "(winlen, winstep, winfunc, nfft)")
    activation = conf.get("activation", conf.get("output_activation"))
    if activation is not None:
        if activation not in ACTIVATIONS:
            raise ConfigError(f"{file}: [{tname}] activation = {activation!r}; the original knows {', '.join(ACTIVATIONS)}")
        out["options"]["activation"] = activation
    for key in ("noise_threshold_for_kmeans", "min_kmeans_perc"):
        if key in conf:
            out["options"][key] = imp.value(file.name, f"[{tname}] {key}", "float", conf[key])
    return out


def _scorer(imp: Importer, file: Path, tname: str, conf: Mapping[str, str], db: ConfigParser,
            globalvars: Mapping[str, str], reroot: Callable[[str], str]) -> dict[str, Any]:
    kind = section_kind(file, f"[{tname}]", conf, "score_type", SCORERS, "scores with", SCORER_KEYS, "scorer",
                        ("org_src", "base"))
    out = {"type": kind, "org_src": _list_section(imp, file, f"[{tname}] org_src", conf["org_src"], db, globalvars,
                                                  reroot, processor=False),
           "base": _list_section(imp, file, f"[{tname}] base", conf["base"], db, globalvars, reroot, processor=False)}
    if "spkinfo" in conf and db.has_section(conf["spkinfo"].strip()):  # the mixture types of the summary
        out["spkinfo"] = _list_section(imp, file, f"[{tname}] spkinfo", conf["spkinfo"], db, globalvars, reroot,
                                       processor=False)
    return out


# ---------------------------------------------------------------------------------- test data from the samples
def make_test_root(tests: Mapping[str, EvalTask], samples: str | Path | None = None,
                   limit: int | None = None) -> list[Path]:
    """Fill each test task's data folders from the sample corpus's ``test`` split (see ``make_sample_root``), with
    the vector lists of tasks that read i-vectors; a folder that holds its mixture list already is left as it is."""
    from ..data import data_samples_dir
    from .samples import SAMPLE_SOURCES, fill_split, write_input_lists, write_spkinfo, write_vectors

    source = Path(samples) if samples is not None else data_samples_dir()
    made = []
    for test in tests.values():
        for lset in test.task.get("linkedsets", {}).values():
            data = lset["data"]
            folder = Path(data["root"]) / data["split"]
            name = data.get("linkedset", "wav")
            # a folder filled already (by the training data: a recipe may test on its training folder, or by
            # another test task) is used as it is
            if not (folder / f"mix_{name}.scp").is_file():
                fill_split(folder, source / "test", name, limit, data.get("num_sources", SAMPLE_SOURCES))
                made.append(folder)
            if "ivec" in data and not Path(data["ivec"]["list"]).is_file():  # the task's test i-vector list
                made.append(write_vectors(folder, name, data["ivec"]))
            made += write_input_lists(folder, data.get("feature_inputs", {}), data.get("num_sources", SAMPLE_SOURCES))
        nrs = test.reconstructor["nrs"] if test.reconstructor else None
        for scorer in test.scorers.values():
            listed = Path(scorer["org_src"]["datafiles"])
            if nrs and not listed.is_file() and (listed.parent / f"s{nrs}.scp").is_file():
                write_references(listed, nrs)  # inside a folder made above (or the training one)
            if "spkinfo" in scorer and not Path(scorer["spkinfo"]["datafiles"]).is_file() \
                    and (listed.parent / "spk.txt").is_file():
                write_spkinfo(Path(scorer["spkinfo"]["datafiles"]), listed.parent / "spk.txt", source)
        for scorer in test.sv_scorers.values():  # speaker verification: the speakers of the task's own folder
            spk = [Path(ls["data"]["root"]) / ls["data"]["split"] / "spk.txt"
                   for ls in test.task.get("linkedsets", {}).values()]
            target = Path(scorer["spkinfo"]["datafiles"])
            if spk and spk[0].is_file() and not target.is_file():
                write_spkinfo(target, spk[0], source)
    return made


def write_references(path: Path, nrs: int) -> Path:
    """A scorer's ``org_src`` list in the original's format (``name s1.wav ... s<nrs>.wav``, absolute paths), made
    from the ``s1.scp`` ... ``s<nrs>.scp`` beside it; returns ``path``."""
    from ..data import read_list

    sources = [read_list(path.parent / f"s{s}.scp") for s in range(1, nrs + 1)]
    path.write_text("".join(f"{name} {' '.join(str(lst[name].resolve().absolute()) for lst in sources)}\n"
                            for name in sources[0] if all(name in lst for lst in sources)))
    return path


# ---------------------------------------------------------------------------------- running
def _read_int16(path: Path) -> np.ndarray:
    from ..data import read_wav

    return read_wav(path).double().numpy() * 32768.0  # the int16 values, as the original reads them


WAV_FORMATS = ("int16", "float32")  # mtlab's default 16-bit PCM; the original's 32-bit float (reconstructor.py:166-173)


def _write_wav(path: Path, signal: np.ndarray, wav_format: str = "int16") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if wav_format == "float32":  # IEEE float (format 3), as scipy.io.wavfile.write writes the original's float32
        data = np.asarray(signal, "<f4").tobytes()
        fmt = struct.pack("<HHIIHH", 3, 1, SAMPLE_RATE, SAMPLE_RATE * 4, 4, 32)
        path.write_bytes(b"RIFF" + struct.pack("<I", 4 + 8 + len(fmt) + 8 + len(data)) + b"WAVE" + b"fmt " +
                         struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data)
        return
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes(np.clip(np.round(signal * 32767.0), -32768, 32767).astype("<i2").tobytes())


def open_test(expdir: str | Path, checkpoint: str = "final", recipe_dir: str | Path | None = None,
              data_root: str | Path | None = None) -> tuple[Path, dict[str, Any], dict[str, EvalTask]]:
    """(checkpoint path, the recipe it carries, the test tasks of its original recipe folder)."""
    from ..training.checkpoint import load_safe

    expdir = Path(expdir)
    ckpt = Path(checkpoint) if checkpoint not in ("final", "best") else expdir / f"{checkpoint}.pt"
    if not ckpt.is_file():
        raise ConfigError(f"{ckpt}: no checkpoint; train first (mtlab train RECIPE_DIR --expdir {expdir})")
    recipe = load_safe(ckpt).get("recipe")
    if not isinstance(recipe, Mapping):
        raise ConfigError(f"{ckpt} carries no recipe; test a checkpoint that mtlab train wrote")
    nabu: Mapping[str, Any] = recipe.get("nabu") or {}
    if not nabu and recipe_dir is None:
        raise ConfigError(f"{ckpt}: its recipe was not imported from an original recipe folder; give the folder "
                          "whose test_evaluator.cfg to run (--recipe DIR)")
    if not nabu and data_root is None:
        raise ConfigError(f"{ckpt}: its recipe was not imported from an original recipe folder, so it names no data "
                          "root; give the folder database.conf's paths go under (--data-root DIR)")
    folder = Path(recipe_dir or nabu["recipe_dir"])
    root = Path(data_root or nabu["data_root"])
    return ckpt, dict(recipe), read_test(folder, root)


def stats_for_test(recipe: Mapping[str, Any], tests: Mapping[str, EvalTask],
               key: Callable[[Mapping[str, Any], str], str]) -> dict[str, Any]:
    """The experiment's feature statistics, with each test linked set's under ``key(data, linkedset)``: the
    original normalizes test features with the training features' (meanandvar_dir), so a test folder of its
    own gets those of the training task of the same name (else the first one)."""
    stats = dict(recipe.get("stats", {}))
    trained = recipe.get("tasks", {})
    for name, test in tests.items():
        if test.refused:
            continue
        source = trained.get(name) or next(iter(trained.values()), None)
        if source is None:
            continue
        sname, sspec = next(iter(source["linkedsets"].items()))
        train_key = key(sspec["data"], sname)
        for lname, lset in test.task["linkedsets"].items():
            if key(lset["data"], lname) not in stats and train_key in stats:
                stats[key(lset["data"], lname)] = stats[train_key]
    return stats


def evaluate_tests(trainer: Trainer | None, tests: Mapping[str, EvalTask], out: Path, limit: int | None = None,
                   pesq: bool = False, seed: int = 0, echo: Callable[[str], None] | None = None,
                   order: str = "sir", wav_format: str = "int16") -> EvalResult:
    """Run the test tasks on ``trainer`` (built from their recipe, holding the trained weights); see the module
    doc. ``limit`` caps the utterances per task (after ``requested_utts``); ``pesq`` adds PESQ; ``seed`` seeds
    the k-means runs; ``order`` matches estimates to references (``"sir"``: the original's mean SIR, or
    ``"si_sdr"``); ``wav_format``: ``"int16"`` or the original's ``"float32"``."""
    from ..separation.metrics import ORDERS

    if order not in ORDERS or wav_format not in WAV_FORMATS:
        raise ConfigError(f"evaluate_tests: order {order!r} (valid: {', '.join(ORDERS)}), wav_format {wav_format!r} "
                          f"(valid: {', '.join(WAV_FORMATS)})")
    out.mkdir(parents=True, exist_ok=True)
    for test in tests.values():
        if test.handler is not None and "task_for_masks" in test.handler:
            source = tests.get(test.handler["task_for_masks"])
            if source is None or source.reconstructor is None:
                raise ConfigError(f"speaker_verification_handler.cfg [{test.name}] task_for_masks = "
                                  f"{test.handler['task_for_masks']!r}: not a separation test task of this test "
                                  f"({', '.join(n for n, t in tests.items() if t.reconstructor)})")
            source.keep_masks = True
    metrics = (*METRICS, "pesq") if pesq else METRICS
    result = EvalResult([], {}, out)
    say = echo or (lambda _: None)
    rng = np.random.RandomState(seed)
    for tname, test in tests.items():
        result.notes.extend(f"{tname}: {note}" for note in test.notes)
        if test.refused:
            result.summary.append({"task": tname, "refused": test.refused})
            result.notes.append(f"{tname}: refused: {test.refused}")
            say(f"{tname}: refused: {test.refused}")
            continue
        if trainer is None:
            raise ConfigError(f"test task {tname!r}: evaluate_tests needs the trainer built from the test recipe "
                              "(None only when every task is refused)")
        try:
            if test.handler is not None:
                summary = _verify_task(trainer, tname, test, limit, out, tests, seed, result.notes)
                result.summary.append(summary)
                say(f"{tname}: speaker verification, EER " + ", ".join(
                    f"{v:.2%} ({k.split('.')[0] if '.' in k else tname})" for k, v in summary.items()
                    if k.endswith("eer")))
                continue
            summary, rows = _test_task(trainer, tname, test, limit, rng, metrics, out, order, wav_format)
        except TestRefused as exc:  # what the configs ask cannot be run on this model (nor in the original)
            result.summary.append({"task": tname, "refused": str(exc)})
            result.notes.append(f"{tname}: refused: {exc}")
            say(f"{tname}: refused: {exc}")
            continue
        except MtlabError as exc:  # a test task the model cannot run (the original stopped there) is reported
            summary, rows = {"task": tname, "error": str(exc)}, []
            result.notes.append(f"{tname}: failed: {exc}")
            say(f"{tname}: failed: {exc}")
            result.summary.append(summary)
            continue
        for sname, scorer in test.scorers.items():
            if scorer["type"] == "sdr_snr":
                result.notes.append(f"{tname}: scorer {sname} score_type sdr_snr scored as sdr (its noise terms are "
                                    "not computed)")
        if test.reconstructor is None:
            result.notes.append(f"{tname}: no [{tname}] in reconstructor.cfg: test loss only")
        result.summary.append(summary)
        result.utterances[tname] = rows
        say(f"{tname}: test loss {summary['loss']:.4g}" + (f", {len(rows)} utterances separated and scored"
                                                          if rows else ""))
    _write_csv(out / "summary.csv", result.summary)
    return result


def _test_task(trainer: Trainer, tname: str, test: EvalTask, limit: int | None, rng: np.random.RandomState,
               metrics: tuple[str, ...], out: Path, order: str = "sir", wav_format: str = "int16"
               ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One test task: its summary row and its utterance rows (see :func:`evaluate_tests`)."""
    from ..base.batching import collate
    from ..tasks.forward import eval_mode
    from ..separation.reconstruct import RECONSTRUCTORS, apply_and_resynthesize, reconstruct

    plan, task = trainer.plans[tname], trainer.tasks[tname]
    rows: list[dict[str, Any]] = []
    sums = [0.0, 0.0]
    rec = test.reconstructor
    for lname, lset in task.linkedsets.items():
        lset_data = test.task["linkedsets"].get(lname, {}).get("data", {})
        ds = lset.examples
        n = len(ds) if test.requested_utts is None else min(len(ds), test.requested_utts)
        n = n if limit is None else min(n, limit)
        names = getattr(ds, "names", None)
        if rec is not None and names is None:
            raise ConfigError(f"test task {tname!r}: its data gives no utterance names to find the audio by")
        for start in range(0, n, test.batch_size):
            index = list(range(start, min(n, start + test.batch_size)))
            with eval_mode(trainer.models), torch.no_grad():
                batch = collate([ds[i] for i in index])
                if start == 0:
                    _check_masks(plan, batch, tname, test, lset_data)
                r = plan.loss(batch, keep_outputs=True)
            sums[0] += float(r.loss_sum)
            sums[1] += float(r.normalizer)
            if rec is None or names is None:  # no names without a reconstructor: raised above
                continue
            kept = RECONSTRUCTORS[rec["type"]]
            for j, i in enumerate(index):
                outputs = {k: r.outputs[k][j, :ds.lengths[i]].double().cpu().numpy() for k in kept}
                rows.append(_separate(tname, test, names[i], outputs, rng, metrics, out,
                                      apply_and_resynthesize, reconstruct, order, wav_format))
    loss = sums[0] / sums[1] if sums[1] else math.nan
    summary: dict[str, Any] = {"task": tname, "utterances": len(rows) if rec is not None else None, "loss": loss}
    if rows:
        for key in rows[0]:
            if key != "utterance" and not key.endswith("perm"):
                summary[key] = float(np.mean([row[key] for row in rows]))
        _write_csv(out / tname / "scores.csv", rows)
        if "sir" in rows[0]:
            _write_csv(out / tname / "summary_original.csv", original_summary(rows, _spkinfo(test, rows)))
    return summary, rows


def _verify_task(trainer: Trainer, tname: str, test: EvalTask, limit: int | None, out: Path,
                 tests: Mapping[str, EvalTask], seed: int, notes: list[str]) -> dict[str, Any]:
    """A speaker-verification test task (see :mod:`mtlab.nabu.verification`): its loss, the handled vector of each
    utterance (``<task>/data/<utterance>.npy``) and each scorer's equal error rate; its summary row."""
    from ..base.batching import collate
    from ..tasks.forward import eval_mode
    from .verification import attractors_from_embeddings, ivectors, score_eer

    handler = test.handler
    assert handler is not None
    plan, task = trainer.plans[tname], trainer.tasks[tname]
    task_dir = out / tname
    (task_dir / "data").mkdir(parents=True, exist_ok=True)
    perms: dict[str, list[int]] = {}
    if handler["type"] == "attractor_from_embeddings":
        source = handler["task_for_masks"]
        scores = out / source / "scores.csv"
        if not scores.is_file():
            raise ConfigError(f"test task {tname!r}: the separation task {source!r} wrote no scores ({scores}); "
                              "it must run and be scored first (the original reads its masks and speaker order)")
        with scores.open() as f:
            perms = {row["utterance"]: [int(p) - 1 for p in row["perm"].split()] for row in csv.DictReader(f)}
    vectors: dict[str, np.ndarray] = {}
    sums = [0.0, 0.0]
    for lset in task.linkedsets.values():
        ds = lset.examples
        n = len(ds) if test.requested_utts is None else min(len(ds), test.requested_utts)
        n = n if limit is None else min(n, limit)
        names = getattr(ds, "names", None)
        if names is None:
            raise ConfigError(f"test task {tname!r}: its data gives no utterance names")
        for start in range(0, n, test.batch_size):
            index = list(range(start, min(n, start + test.batch_size)))
            with eval_mode(trainer.models), torch.no_grad():
                r = plan.loss(collate([ds[i] for i in index]), keep_outputs=True)
            sums[0] += float(r.loss_sum)
            sums[1] += float(r.normalizer)
            if handler["output"] not in r.outputs:
                raise ConfigError(f"speaker_verification_handler.cfg [{tname}]: the task's graph gives no output "
                                  f"{handler['output']!r} (it gives {', '.join(r.outputs)})")
            for j, i in enumerate(index):
                name = names[i]
                value = r.outputs[handler["output"]][j].double().cpu().numpy()
                if handler["type"] == "attractor_from_embeddings":
                    if name not in perms:
                        raise ConfigError(f"test task {tname!r}: utterance {name!r} was not separated by "
                                          f"{handler['task_for_masks']!r}; test as many utterances there")
                    source_dir = out / handler["task_for_masks"]
                    vec = attractors_from_embeddings(value[:ds.lengths[i]], np.load(source_dir / "masks" / f"{name}.npy"),
                                                     np.load(source_dir / "usedbins" / f"{name}.npy"), perms[name],
                                                     handler)
                else:
                    vec = ivectors(value, handler)
                np.save(task_dir / "data" / f"{name}.npy", vec)
                if handler["store_output"]:
                    (task_dir / "raw_output").mkdir(exist_ok=True)
                    np.save(task_dir / "raw_output" / f"{handler['output']}_{name}.npy", value)
                vectors[name] = vec
    summary: dict[str, Any] = {"task": tname, "utterances": len(vectors),
                               "loss": sums[0] / sums[1] if sums[1] else math.nan}
    local: list[str] = []
    for sname, scorer in test.sv_scorers.items():
        res = score_eer(task_dir, sname, scorer, vectors, seed, local)
        prefix = "" if sname == tname else f"{sname}."
        summary[f"{prefix}eer"] = res["eer"]
    notes.extend(f"{tname}: {note}" for note in local)
    return summary


def _check_masks(plan: Any, batch: Any, tname: str, test: EvalTask, data: Mapping[str, Any]) -> None:
    """Refuse a mask-estimating test task (``pit``, ``direct`` loss) whose model gives another number of masks than
    the test data has speakers: a 2-mask model on 3-speaker mixtures has no third estimate to score or to put in
    the loss (the original fails on it too). Scoring 2 estimates against 2 of the 3 references would be another
    protocol than the recipe's (its loss and its reconstructor's nrs ask for 3), so it is not made up here."""
    loss = test.task.get("loss", {})
    if loss.get("type") not in ("pit", "direct"):
        return
    out = plan.forward(batch).outputs.get(loss.get("output", ""))
    if out is None:
        return
    bins = data.get("spectral", {}).get("n_fft", 256) // 2 + 1
    speakers = data.get("num_sources", 2)
    masks = out.shape[-1] if out.dim() == 4 else out.shape[-1] / bins
    if masks != speakers:
        shown = int(masks) if float(masks).is_integer() else f"{out.shape[-1]} / {bins}"
        nrs = f", reconstructor.cfg [{tname}] nrs = {test.reconstructor['nrs']}" if test.reconstructor else ""
        raise TestRefused(f"test_evaluator.cfg [{tname}]: the model gives {shown} masks (output {loss.get('output')!r} "
                          f"has {out.shape[-1]} values per frame, {bins} bins each) but the test data has {speakers} "
                          f"speakers (its target processors' nrs{nrs}); a mask model separates as many speakers as "
                          "it has masks, so this test cannot run (the original fails on it too)")


def _separate(tname: str, test: EvalTask, name: str, outputs: dict[str, np.ndarray], rng: np.random.RandomState,
              metrics: tuple[str, ...], out: Path, resynth: Callable[..., np.ndarray],
              reconstruct: Callable[..., np.ndarray], order: str = "sir", wav_format: str = "int16") -> dict[str, Any]:
    """Reconstruct, write and score one utterance; returns its row."""
    from ..data import read_list
    from ..data.features import used_bins
    from ..separation.metrics import score

    rec = test.reconstructor
    assert rec is not None
    spectral = rec["org_mix"]["spectral"]
    mix_list = read_list(rec["org_mix"]["datafiles"])
    if name not in mix_list:
        raise ConfigError(f"{rec['org_mix']['datafiles']}: no utterance {name!r} (the reconstructor's org_mix "
                          f"[{rec['org_mix']['section']}] must list the test task's utterances)")
    mixture = _read_int16(mix_list[name].resolve())
    usedbins = used_bins(spectral.magnitude(torch.from_numpy(mixture / 32768.0))).numpy()
    masks = reconstruct(rec["type"], outputs, rec["nrs"], usedbins, rng, rec["options"])
    estimates = resynth(mixture, masks, spectral)
    task_dir = out / tname
    for s, signal in enumerate(estimates):
        _write_wav(task_dir / f"s{s + 1}" / f"{name}.wav", signal, wav_format)
    if rec["store_output"]:
        (task_dir / "raw_output").mkdir(parents=True, exist_ok=True)
        for key, value in outputs.items():
            np.save(task_dir / "raw_output" / f"{key}_{name}.npy", value)
    if rec["store_masks"] or test.keep_masks:
        (task_dir / "masks").mkdir(parents=True, exist_ok=True)
        np.save(task_dir / "masks" / f"{name}.npy", masks)
    if test.keep_masks:  # a speaker-verification task weights its embeddings by them (with the used bins)
        (task_dir / "usedbins").mkdir(parents=True, exist_ok=True)
        np.save(task_dir / "usedbins" / f"{name}.npy", usedbins)
    row: dict[str, Any] = {"utterance": name}
    n = estimates.shape[1]
    for sname, scorer in test.scorers.items():
        refs = _references(scorer, name, rec["nrs"])
        base_list = read_list(scorer["base"]["datafiles"])
        base = _read_int16(base_list[name].resolve()) if name in base_list else mixture
        sc = score(torch.from_numpy(estimates), torch.from_numpy(np.stack([r[:n] for r in refs])),
                   torch.from_numpy(base[:n]), metrics, SAMPLE_RATE, order=order)
        # the task's own scorer (the original's default) gives the plain columns, another its name before them
        prefix = "" if sname == tname else f"{sname}."
        row.update({f"{prefix}{k}": v for k, v in sc.row().items()})
        row[f"{prefix}perm"] = " ".join(str(p + 1) for p in sc.perm)
    return row


MIX_TYPES = ("all_m", "all_f", "same_gen", "diff_gen")  # the original's (scorer.py:81)
STATISTICS = ("mean", "std", "median")  # scorer.py:19, get_statistics: np.mean, np.std (ddof 0), np.median


def mix_types(genders: list[str]) -> list[str]:
    """The original's mixture types of one utterance from its speakers' genders (``scorer.py:249-258``)."""
    if all(g == "M" for g in genders):
        return ["all_m", "same_gen"]
    if all(g == "F" for g in genders):
        return ["all_f", "same_gen"]
    return ["diff_gen"]


def original_summary(rows: list[dict[str, Any]], genders: Mapping[str, list[str]] | None) -> list[dict[str, Any]]:
    """The original's ``Scorer.summarize`` (``scorer.py:262-316``): for SDR, SIR and SAR of the separated signals
    (``SS``) and of the mixture (``base``), each utterance's mean over its speakers, then mean, std and median over
    all utterances and over each mixture type (from ``genders``: utterance -> speakers' genders; without them, all
    only). One row per metric, scenario and utterance group."""
    out = []
    groups = {"all": [r["utterance"] for r in rows]}
    if genders is not None:
        for kind in MIX_TYPES:
            groups[kind] = [r["utterance"] for r in rows if kind in mix_types(genders.get(r["utterance"], []))]
    values = {(m, scen): {r["utterance"]: r[m if scen == "SS" else f"{m}_mix"] for r in rows}
              for m in ("sdr", "sir", "sar") for scen in ("SS", "base")}
    for (metric, scen), per_utt in values.items():
        for group, utts in groups.items():
            data = np.array([per_utt[u] for u in utts], dtype=np.float64)
            stats = {"mean": np.mean(data), "std": np.std(data), "median": np.median(data)} if len(data) else \
                {k: math.nan for k in STATISTICS}
            out.append({"metric": metric.upper(), "scenario": scen, "mix_type": group, "utterances": len(data),
                        **{k: float(v) for k, v in stats.items()}})
    return out


def read_spkinfo(path: Path) -> dict[str, list[str]]:
    """utterance -> its speakers' genders from the original's ``utt_spkinfo`` list: ``name x id1 g1 id2 g2 ...``
    (``scorer.py:71-77`` keeps the fields after the second; ``scorer.py:241-245`` reads id, gender pairs)."""
    out = {}
    for line in path.read_text().splitlines():
        fields = line.strip().split(" ")
        if len(fields) >= 4:
            out[fields[0]] = fields[3::2]
    return out


def _spkinfo(test: EvalTask, rows: list[dict[str, Any]]) -> dict[str, list[str]] | None:
    """The genders of the task's scorer's ``spkinfo`` list, where it names one that exists and covers the rows."""
    scorer = test.scorer
    info = scorer.get("spkinfo") if scorer else None
    if not info or not Path(info["datafiles"]).is_file():
        return None
    genders = read_spkinfo(Path(info["datafiles"]))
    return genders if all(r["utterance"] in genders for r in rows) else None


def _references(scorer: Mapping[str, Any], name: str, nrs: int) -> list[np.ndarray]:
    """The reference signals of one utterance: the ``nrs`` paths of its line in the scorer's ``org_src`` list
    (the original's ``name s1.wav s2.wav ...``), or, where that list does not exist, the folder's ``s1.scp`` ...
    ``s<nrs>.scp``."""
    from ..data import read_list

    listed = Path(scorer["org_src"]["datafiles"])
    section_name = scorer["org_src"]["section"]
    if listed.is_file():
        entry = read_list(listed).get(name)
        if entry is None:
            raise ConfigError(f"{listed}: no utterance {name!r} (the scorer's org_src [{section_name}] must list the "
                              "test task's utterances)")
        if len(entry.fields) != nrs:
            raise ConfigError(f"{entry.where}: {len(entry.fields)} reference signals, the reconstructor's nrs is {nrs} "
                              f"(the scorer's org_src [{section_name}] lists one path per speaker)")
        return [_read_int16(p if p.is_absolute() else listed.parent / p) for p in map(Path, entry.fields)]
    refs = []
    for s in range(1, nrs + 1):
        entry = read_list(listed.parent / f"s{s}.scp").get(name)
        if entry is None:
            raise ConfigError(f"{listed.parent / f's{s}.scp'}: no utterance {name!r} (the scorer's org_src "
                              f"[{section_name}] folder holds the sources s1 ... s{nrs})")
        refs.append(_read_int16(entry.resolve()))
    return refs


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    keys = list(dict.fromkeys(k for row in rows for k in row))
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, keys)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in row.items()})


COLUMNS = (("task", "task", "{}"), ("utts", "utterances", "{}"), ("test loss", "loss", "{:.4g}"),
           ("SDR", "sdr", "{:.2f}"), ("SDR mix", "sdr_mix", "{:.2f}"), ("SDRi", "sdri", "{:.2f}"),
           ("SIR", "sir", "{:.2f}"), ("SAR", "sar", "{:.2f}"), ("EER", "eer", "{:.2%}"),
           ("SI-SDRi", "si_sdri", "{:.2f}"), ("STOI", "stoi", "{:.3f}"), ("PESQ", "pesq", "{:.2f}"))


def _scorer_lines(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        out.append(row)
        scorers = dict.fromkeys(k.split(".", 1)[0] for k in row if "." in k)
        for scorer in scorers:
            out.append({"task": f"{row['task']} [{scorer}]", "utterances": row.get("utterances"),
                        **{k.split(".", 1)[1]: v for k, v in row.items() if k.startswith(f"{scorer}.")}})
    return out


def format_table(rows: list[dict[str, Any]], header: bool = True) -> str:
    """A short fixed-width table of summary rows (the columns a row has); a task's other scorers (columns
    ``<scorer>.<metric>``) get a line each, ``task [scorer]``."""
    rows = _scorer_lines(rows)
    cols = [(title, key, fmt) for title, key, fmt in COLUMNS if any(r.get(key) is not None for r in rows)] \
        if header or rows else []
    width = max([len(str(r["task"])) for r in rows] + [4])
    lines = []
    if header:
        lines.append("  ".join(f"{t:<{width}}" if k == "task" else f"{t:>9}" for t, k, _ in cols))
    for r in rows:
        cells = []
        for _title, key, fmt in cols:
            value = r.get(key)
            text = "-" if value is None else fmt.format(value)
            cells.append(f"{text:<{width}}" if key == "task" else f"{text:>9}")
        lines.append("  ".join(cells))
    return "\n".join(lines)

