"""database.conf and the processor configs it names: each data section as mtlab's data key, its re-rooted list
and the STFT settings of its processor."""

from __future__ import annotations

import os
from configparser import ConfigParser
from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from ..base.errors import ConfigError
from .ini import SpecReader, read_ini, section, words

SAMPLE_RATE = 8000  # the original recipes' corpora (wav8k)

# What each original processor computes, as mtlab's data key (mtlab.data.TARGET_KEYS and "features").
PROCESSOR_KEYS: dict[tuple[str, str], str] = {
    ("audio_feat_processor", "logspec"): "features",
    ("onehotperfeature_target_processor", "magspec"): "binary_targets",
    ("scorelabelperfeature_processor", "magspec"): "usedbins",
    ("multi_target_processor", "magspec"): "src_mag",
    ("audio_signal_processor", "magspec"): "mix_mag",
    ("strlabel2index_processor", ""): "spk_pair",
    ("matrix2vector_processor", ""): "ivec",
}
VECTOR_MVN = {"global": "global", "None": "none"}  # matrix2vector_processor's mvn_type -> mtlab's VectorList mvn
FEATURE_MVN = {"local": "local", "none": "none", "None": "none"}  # audio_feat_processor's mvn_type -> data mvn
# Processor configs some recipes name but the repository lacks, with the settings every copy it has holds
# (the mixture magnitude of the DANet and PIT losses: all 8 single-channel mixtomask_processor.cfg agree).
DEFAULT_PROCESSORS: dict[str, dict[str, str]] = {
    "mixtomask_processor.cfg": {"processor": "audio_signal_processor", "feature": "magspec", "winlen": "0.032",
                                "winstep": "0.008", "winfunc": "cosine", "nfft": "256", "preemph": "0.0",
                                "include_energy": "False"},
}



def database(folder: Path) -> tuple[ConfigParser, str, dict[str, str]]:
    """(parser, file name, [globalvars]) of the recipe folder's database.conf (or database.cfg)."""
    for name in ("database.conf", "database.cfg"):
        parser = read_ini(folder / name, required=False)
        if parser is not None:
            globalvars = section(parser, "globalvars", folder / name) if parser.has_section("globalvars") \
                else {}
            return parser, name, globalvars
    raise ConfigError(f"{folder}: no database.conf (or database.cfg); the original reads its data "
                      "sections from it")


def rerooter(parser: ConfigParser, data_root: str) -> Callable[[str], str]:
    """Map an original absolute data path to the same path below ``data_root``: the common folder of
    every ``datafiles`` in database.conf is replaced by the data root."""
    paths = [PurePosixPath(v.strip()) for s in parser.sections() for k, v in parser.items(s)
             if k == "datafiles" and v.strip().startswith("/") and " " not in v.strip()]
    common = PurePosixPath(os.path.commonpath([str(p.parent) for p in paths])) if paths else PurePosixPath("/")

    def reroot(path: str) -> str:
        p = PurePosixPath(path)
        if not p.is_absolute():
            return str(Path(data_root) / p)
        return str(Path(data_root) / p.relative_to(common)) if p.is_relative_to(common) else \
            str(Path(data_root) / p.relative_to("/"))
    return reroot


def processor_path(folder: Path, given: str) -> Path:
    """A processor config the original names from its own root (``config/recipes/...``): the file of
    that name in the recipe folder, else the same path below the folder holding ``config/``."""
    local = folder / PurePosixPath(given).name
    if local.is_file():
        return local
    parts = folder.resolve().parts
    for i in range(len(parts) - 1, 0, -1):
        if parts[i] == "config":
            candidate = Path(*parts[:i]) / given
            if candidate.is_file():
                return candidate
    return local


def data_section(imp: SpecReader, parser: ConfigParser, file: str, globalvars: Mapping[str, str], name: str,
                 reroot: Callable[[str], str]) -> dict[str, Any] | None:
    """One database section: re-rooted list, processor settings, mtlab data key and STFT settings."""
    from ..data.features import Spectral

    if not parser.has_section(name):
        raise ConfigError(f"{imp.folder / file}: no [{name}] section, named by a task; sections: "
                          f"{', '.join(parser.sections())}")
    conf = {k: (globalvars.get(k, v) if v.strip() == "globalvars" else v).strip() for k, v in parser.items(name)}
    for need in ("datafiles", "processor_config"):
        if need not in conf:
            continued = [k for k, v in conf.items() if f"\n{need}" in v]
            hint = (f"; an indented '{need} = ...' line continues the value of {continued[0]!r} "
                    "(in the original's ConfigParser too)") if continued else ""
            imp.refuse(file, f"[{name}] {need}", f"missing, so the original could not load this section "
                                                  f"either{hint}")
            return None
    proc_path = processor_path(imp.folder, conf["processor_config"])
    proc_file = proc_path.name if proc_path.parent == imp.folder else str(proc_path)
    default = DEFAULT_PROCESSORS.get(proc_path.name)
    if not proc_path.is_file() and default is None:
        imp.refuse(file, f"[{name}] processor_config", f"{conf['processor_config']!r} is neither in the recipe "
                                                        "folder nor below the recipes' root")
        return None
    if proc_path.is_file():
        proc = section(read_ini(proc_path), "processor", proc_path)
    else:
        proc = dict(default or {})
        imp.defaults.append(f"[{name}] processor_config: {conf['processor_config']!r} is absent; the settings of "
                             f"every {proc_path.name} in the original's repository are used")
    kind, feature = proc.get("processor", ""), proc.get("feature", "")
    key = PROCESSOR_KEYS.get((kind, feature), PROCESSOR_KEYS.get((kind, "")))
    out: dict[str, Any] = {"datafiles": reroot(conf["datafiles"]), "processor_config": proc_file,
                           "processor": proc}
    if key is not None:
        out["key"] = key
    if "segment_lengths" in conf:
        out["segment_lengths"] = words(conf["segment_lengths"])
    if key is None:
        imp.refuse(proc_file, "[processor] processor", f"{kind!r} (feature {feature!r}) computes data mtlab's "
                    f"corpus loader does not produce (it gives {', '.join(sorted(set(PROCESSOR_KEYS.values())))})")
        return out
    if "nrs" in proc and key != "ivec":
        out["nrs"] = sources(imp, proc_file, proc)
    if key == "features" and proc.get("mvn_type", "global") != "global":
        if proc["mvn_type"] in FEATURE_MVN:
            out["mvn"] = FEATURE_MVN[proc["mvn_type"]]
        else:
            imp.refuse(proc_file, "[processor] mvn_type", f"{proc['mvn_type']!r}: mtlab normalizes features with "
                        f"the training set's global mean and variance, per utterance or not at all "
                        f"({', '.join(['global', *FEATURE_MVN])})")
    if key == "ivec":
        return vector_section(imp, proc_file, proc, out)
    if key == "usedbins" and float(proc.get("mag_thres", "100")) != 100.0:
        imp.refuse(proc_file, "[processor] mag_thres", "mtlab's recipes use bins within 40 dB of the loudest "
                                                        "(mag_thres = 100)")
    if "winlen" in proc:
        try:
            spectral = Spectral.from_processor_config(proc, SAMPLE_RATE, origin=str(proc_path))
        except ConfigError as exc:
            imp.refuse(proc_file, "[processor]", str(exc).split(": ", 1)[-1])
            return out
        out["spectral"] = {"win_length": spectral.win_length, "hop_length": spectral.hop_length,
                           "n_fft": spectral.n_fft, "window": spectral.window, "framing": spectral.framing,
                           "sample_scale": spectral.sample_scale, "preemph": spectral.preemph}

    return out


def sources(imp: SpecReader, proc_file: str, proc: Mapping[str, str]) -> int:
    """A target processor's ``nrs``: the speakers per mixture, which the loader reads as s1 ... s<nrs>."""
    nrs = imp.value(proc_file, "[processor] nrs", "int", proc["nrs"])
    if nrs < 1:
        raise ConfigError(f"{imp.folder / proc_file}: [processor] nrs = {proc['nrs']!r}: the number of speakers "
                          "per mixture must be positive")
    if "spk_select" in proc and words(proc["spk_select"]) != [str(i) for i in range(nrs)]:
        imp.refuse(proc_file, "[processor] spk_select", f"{proc['spk_select']!r}: mtlab's targets cover every "
                                                         f"one of the nrs = {nrs} speakers, in order")
    return nrs


def vector_section(imp: SpecReader, proc_file: str, proc: Mapping[str, str], out: dict[str, Any]) -> dict[str, Any]:
    """A matrix2vector_processor section: its per-utterance vector settings (``out["ivec"]``)."""
    sizes = {}
    for key in ("nrcol", "nrs"):
        if key not in proc:
            raise ConfigError(f"{imp.folder / proc_file}: [processor] needs {key!r} (matrix2vector_processor "
                              "reads it)")
        sizes[key] = imp.value(proc_file, f"[processor] {key}", "int", proc[key])
        if sizes[key] < 1:
            raise ConfigError(f"{imp.folder / proc_file}: [processor] {key} = {proc[key]!r} must be positive")
    mvn = proc.get("mvn_type", "")
    if mvn not in VECTOR_MVN:
        raise ConfigError(f"{imp.folder / proc_file}: [processor] mvn_type = {mvn!r}: matrix2vector_processor "
                          f"knows {' or '.join(VECTOR_MVN)} (its constructor rejects anything else)")
    out["ivec"] = {"nrcol": sizes["nrcol"], "nrs": sizes["nrs"], "mvn": VECTOR_MVN[mvn]}
    return out


class DataSections:
    """database.conf's sections, each read once, when a task first names it: ``sections(name)`` is the section's
    :func:`data_section` (None where it was refused); ``found`` holds every one read so far."""

    def __init__(self, imp: SpecReader, data_root: str) -> None:
        self.imp = imp
        self.parser, self.file, self.globalvars = database(imp.folder)
        self.reroot = rerooter(self.parser, data_root)
        self.found: dict[str, dict[str, Any] | None] = {}

    def __call__(self, name: str) -> dict[str, Any] | None:
        if name not in self.found:
            self.found[name] = data_section(self.imp, self.parser, self.file, self.globalvars, name, self.reroot)
        return self.found[name]
