"""Datasets of speech mixtures laid out like ``data_samples/`` (see its README).

``load_split(split="train", linkedset="clean")`` reads ``<root>/<split>/mix_<linkedset>.scp`` (the input),
``s1.scp`` ... ``sS.scp`` (the S sources, ``num_sources``, 2 by default) and ``spk.txt`` (``name id1 ... idS``),
joins them by name, and precomputes every example once. Keys of an example (T frames, F = 129 bins, S speakers):

=================  ===================  =======  ======================================================
key                shape                dtype    meaning
=================  ===================  =======  ======================================================
``features``       [T, F]               float32  log |STFT| of the mixture, mean/variance normalized
``mix_mag``        [T, F]               float32  |STFT| of the mixture (linear)
``src_mag``        [T, F, S]            float32  |STFT| of each source (linear), for PIT/direct losses
``binary_targets`` [T, F * S]           float32  one-hot loudest source per bin, index ``f * S + s``
``usedbins``       [T, F]               bool     mixture bin within ``usedbins_threshold_db`` of its max
``frame_target``   [T]                  int64    0 silence, else 1 + index of the loudest source (1: s1, 2: s2, ...)
``spk``            []                   int64    id of the main (louder) speaker, s1
``spk_pair``       [S]                  int64    ids of s1 ... sS
``ivec``           [D]                  float32  per-utterance vector (i-vectors, ``D = nrs * nrcol``)
=================  ===================  =======  ======================================================

``usedbins`` and ``mix_mag`` come from the linked set's own mixture (noisy for ``noisy``); the source-based
targets are the same in every linked set. ``ivec`` is read from the vector list that ``ivec=VectorList(...)``
names (see :mod:`mtlab.data.vectors`); it batches as ``[B, D]``.
"""
from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..tasks.sources import Skipped

from . import features as F
from .audio import SAMPLE_RATE, read_wav
from .dynamic import DynamicMix, MixSettings
from .errors import DataError, DataWarning
from .lists import JoinReport, ListEntry, join_lists, read_list
from .ondevice import Featurizer
from .statcache import Progress, checksum, load_cached, printed_progress, save_cached, stats_sample, streaming_stats
from .inplace import split_names, tree_split
from .layouts import get_layout
from .manifest import Column, Manifest, read_manifest, read_manifest_cached
from .shards import ShardedSplit, is_shard_root, load_shards
from .source import SEQUENCE_KEYS, Split
from .streamed import BAD_DATA, Row, StreamedSplit, header_samples
from .vectors import VectorList, normalize, read_vector, vector_stats

ENV_VAR = "MTLAB_DATA"
SPLITS = ("train", "dev", "test")
FIXED_KEYS = ("spk", "spk_pair")
TARGET_KEYS = ("mix_mag", "src_mag", "binary_targets", "usedbins", "frame_target", "spk", "spk_pair", "ivec")
_SOURCE_KEYS = {"src_mag", "binary_targets", "frame_target"}
_SPEAKER_KEYS = {"spk", "spk_pair"}
VECTOR_KEYS = ("ivec",)
DEFAULT_TARGETS = tuple(k for k in TARGET_KEYS if k not in VECTOR_KEYS)  # vectors come only from a list given
STATS_UTTERANCES = 4000  # a streamed training list's statistics read at most this many utterances (evenly spread)
NUM_SOURCES = 2  # sources per mixture unless told otherwise (s1, s2), as in data_samples/


def data_samples_dir() -> Path:
    """The sample-data root: ``$MTLAB_DATA`` if set, else ``data_samples/`` of the repository checkout."""
    override = os.environ.get(ENV_VAR)
    here = Path(__file__).resolve().parents[1]  # mtlab/: a checkout has data_samples/ beside it, a wheel inside it
    root = Path(override) if override else next(
        (p for p in (here.parent / "data_samples", here / "data_samples") if p.is_dir()), here.parent / "data_samples")
    if not root.is_dir():
        hint = f"${ENV_VAR}={override}" if override else "the repository checkout"
        raise DataError(f"{root}: data directory not found (from {hint}); set {ENV_VAR} to the data_samples folder")
    return root


def linked_sets(root: str | Path | None = None, split: str = "train") -> list[str]:
    """Linked sets available in a split: the ``X`` of every ``mix_X.scp``."""
    folder = _split_dir(root, split)
    return sorted(p.stem.removeprefix("mix_") for p in folder.glob("mix_*.scp"))


def _split_dir(root: str | Path | None, split: str) -> Path:
    folder = (Path(root) if root is not None else data_samples_dir()) / split
    if not folder.is_dir():
        raise DataError(f"{folder}: split folder not found; splits are folders such as {', '.join(SPLITS)}")
    return folder


def _input_list(folder: Path, linkedset: str) -> dict[str, ListEntry]:
    path = folder / f"mix_{linkedset}.scp"
    if not path.is_file():
        found = sorted(p.stem.removeprefix("mix_") for p in folder.glob("mix_*.scp"))
        raise DataError(f"{path}: no list for linked set {linkedset!r}; available: {found or 'none'}")
    entries = read_list(path)
    if not entries:
        raise DataError(f"{path}: linked set {linkedset!r} is empty; the list has no utterances")
    return entries


class SeparationDataset(Split):
    """Precomputed examples of one split and linked set; ``dataset[i]`` is a dict of tensors."""

    def __init__(
        self,
        examples: list[dict[str, torch.Tensor]],
        names: list[str],
        stats: F.FeatureStats,
        report: JoinReport,
        split: str,
        linkedset: str,
        num_speakers: int,
        num_sources: int = NUM_SOURCES,
    ) -> None:
        self.examples = examples
        self.names = names
        self.lengths = [int(e["features"].shape[0]) for e in examples]
        self.stats = stats
        self.report = report
        self.split = split
        self.linkedset = linkedset
        self.num_speakers = num_speakers
        self.num_sources = num_sources  # sources per mixture (S of src_mag, binary_targets, spk_pair)
        # the per-frame entries (a per-utterance vector as long as an utterance is still not cut into segments)
        self.sequence_keys = tuple(k for k in SEQUENCE_KEYS if examples and k in examples[0])

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return dict(self.examples[index])

    def __repr__(self) -> str:
        frames = sum(self.lengths)
        keys = ", ".join(self.examples[0]) if self.examples else ""
        return f"SeparationDataset({self.split}/{self.linkedset}: {len(self)} utterances, {frames} frames; {keys})"


def _read_rows(folder: Path, linkedset: str, need_sources: bool, need_speakers: bool,
               vector_list: Path | None = None, num_sources: int = NUM_SOURCES) -> tuple[list[Row], JoinReport]:
    lists: dict[str, dict[str, ListEntry]] = {f"mix_{linkedset}.scp": _input_list(folder, linkedset)}
    if vector_list is not None:
        lists[str(vector_list)] = read_list(vector_list)
    if need_sources:
        for k in range(1, num_sources + 1):
            lists[f"s{k}.scp"] = read_list(folder / f"s{k}.scp")
    if need_speakers:
        lists["spk.txt"] = read_list(folder / "spk.txt")
    names, report = join_lists(lists)
    rows = []
    for name in names:
        sources = tuple(lists[f"s{k}.scp"][name] for k in range(1, num_sources + 1)) if need_sources else ()
        speakers = lists["spk.txt"][name] if need_speakers else None
        vector = lists[str(vector_list)][name] if vector_list is not None else None
        rows.append(Row(name, lists[f"mix_{linkedset}.scp"][name], sources, speakers, vector))
    return rows, report


def _read_mixture(entry: ListEntry) -> torch.Tensor:
    wav = read_wav(entry.resolve(), SAMPLE_RATE, origin=entry.where)
    if wav.shape[0] < F.WIN_LENGTH:
        raise DataError(
            f"{entry.resolve()} (listed at {entry.where}): {wav.shape[0]} samples is shorter than one analysis "
            f"window ({F.WIN_LENGTH} samples = 32 ms at {SAMPLE_RATE} Hz); remove it from the list"
        )
    return wav


def _example(row: Row, keys: set[str], stats: F.FeatureStats | None, threshold_db: float,
             spectral: F.Spectral = F.MTLAB, ivec: VectorList | None = None,
             ivec_stats: tuple[torch.Tensor, torch.Tensor] | None = None,
             mvn: str = "global", num_sources: int = NUM_SOURCES) -> dict[str, torch.Tensor]:
    mix = _read_mixture(row.mix)
    mix_mag = F.magnitude(mix, spectral)
    feats = F.log_magnitude(mix_mag)
    if mvn == "local":
        feats = F.local_mvn(feats)
    elif mvn == "global" and stats is not None:
        feats = stats.normalize(feats)
    example = {"features": feats}
    if "mix_mag" in keys:
        example["mix_mag"] = mix_mag
    if "usedbins" in keys:
        example["usedbins"] = F.used_bins(mix_mag, threshold_db)
    if keys & _SOURCE_KEYS:
        mags = []
        for src in row.sources:
            wav = read_wav(src.resolve(), SAMPLE_RATE, origin=src.where)
            if wav.shape[0] != mix.shape[0]:
                raise DataError(
                    f"{src.resolve()} (listed at {src.where}) has {wav.shape[0]} samples but its mixture "
                    f"{row.mix.resolve()} has {mix.shape[0]}; sources must match the mixture sample for sample"
                )
            mags.append(F.magnitude(wav, spectral))
        src_mag = torch.stack(mags, dim=-1)
        if "src_mag" in keys:
            example["src_mag"] = src_mag
        if "binary_targets" in keys:
            example["binary_targets"] = F.binary_targets(src_mag)
        if "frame_target" in keys:
            example["frame_target"] = F.frame_target(src_mag, threshold_db)
    if row.speakers is not None:
        ids = row.speakers.ints(num_sources)
        if "spk" in keys:
            example["spk"] = torch.tensor(ids[0], dtype=torch.long)
        if "spk_pair" in keys:
            example["spk_pair"] = torch.tensor(ids, dtype=torch.long)
    if ivec is not None and row.vector is not None:
        example["ivec"] = normalize(read_vector(row.vector, ivec.nrcol, ivec.nrs), ivec_stats)
    check_frame_lengths(example, where=row.mix.where)
    return example


def check_frame_lengths(example: dict[str, torch.Tensor], where: str = "") -> None:
    """Raise DataError unless every per-frame key of ``example`` has as many frames as ``features``."""
    frames = example["features"].shape[0]
    for key in SEQUENCE_KEYS:
        if key in example and example[key].shape[0] != frames:
            raise DataError(
                f"{where}: {key!r} has {example[key].shape[0]} frames but 'features' has {frames}; "
                "per-frame targets must be computed from audio of the same length as the input"
            )


def _num_speakers(root: Path, examples: Sequence[dict[str, torch.Tensor]]) -> int:
    table = root / "speakers.tsv"
    if table.is_file():
        return sum(1 for line in table.read_text().splitlines()[1:] if line.strip())
    ids = [int(e[k].max()) for e in examples for k in FIXED_KEYS if k in e]
    return max(ids) + 1 if ids else 0


def _speakers_of_manifest(root: Path, manifest: Manifest, num_sources: int) -> int:
    table = root / "speakers.tsv"
    if table.is_file():
        return sum(1 for line in table.read_text().splitlines()[1:] if line.strip())
    if manifest.speakers is None:
        return 0
    ids = [i for k in range(len(manifest)) for i in manifest.speakers.entry(k, manifest.name(k)).ints(num_sources)]
    return max(ids) + 1 if ids else 0


def _input_list_exists(folder: Path, linkedset: str) -> None:
    path = folder / f"mix_{linkedset}.scp"
    if not path.is_file():
        found = sorted(p.stem.removeprefix("mix_") for p in folder.glob("mix_*.scp"))
        raise DataError(f"{path}: no list for linked set {linkedset!r}; available: {found or 'none'}")


def compute_stats(root: str | Path | None = None, linkedset: str = "clean", split: str = "train",
                  spectral: F.Spectral = F.MTLAB) -> F.FeatureStats:
    """Feature mean/std over every frame of ``split`` (the training split unless told otherwise)."""
    folder = _split_dir(root, split)
    rows, _ = _read_rows(folder, linkedset, need_sources=False, need_speakers=False)
    feats = [F.log_magnitude(F.magnitude(_read_mixture(r.mix), spectral)) for r in rows]
    return F.FeatureStats.from_features(feats, source=f"{split}/mix_{linkedset}.scp")


def cached_stats(root: str | Path | None = None, linkedset: str = "clean", split: str = "train",
                 spectral: F.Spectral = F.MTLAB, stats_utterances: int | None = None,
                 progress: Progress | None | bool = True, on_bad_data: str = "raise",
                 utterances: Column | None = None) -> F.FeatureStats:
    """Feature mean/std of ``split`` (the training split unless told otherwise) from one streaming pass, reused from
    the cache beside its list when nothing it depends on changed (see :mod:`mtlab.data.statcache`).
    ``stats_utterances`` reads that many utterances spread evenly over the list instead of all of them;
    ``progress`` shows the pass (True: on stderr every 2 s; or a callback ``(done, total)``); ``on_bad_data="skip"``
    passes over bad files. ``utterances`` (a manifest's mixture column) limits them to the utterances a join kept."""
    folder = _split_dir(root, split)
    _input_list_exists(folder, linkedset)
    list_file = folder / f"mix_{linkedset}.scp"
    column = utterances if utterances is not None else read_manifest(list_file, []).mix
    return column_stats(column, list_file, f"{split}/mix_{linkedset}.scp", spectral, stats_utterances, progress,
                        on_bad_data)


def column_stats(column: Column, list_file: Path | None, label: str, spectral: F.Spectral = F.MTLAB,
                 stats_utterances: int | None = None, progress: Progress | None | bool = True,
                 on_bad_data: str = "raise") -> F.FeatureStats:
    """:func:`cached_stats` of a manifest's mixture column; ``list_file`` None (a corpus tree read in place) caches
    them in the user cache folder only."""
    sample = stats_sample(len(column.lines), stats_utterances)
    digest = checksum(list_file, column, spectral, sample)
    found = load_cached(list_file, digest)
    if found is not None:
        return found
    show = printed_progress(f"feature statistics of {label}") if progress is True else (progress or None)
    stats = streaming_stats(column, sample, spectral, label, show, skip_bad=on_bad_data == "skip")
    save_cached(list_file, digest, stats)
    return stats


def _own_stats(base: Path, split: str) -> bool:
    """Whether a split without given statistics computes its own: the ``train`` split, or any split of a root
    that has no ``train`` folder (a Nabu recipe's lists in the corpus's own ``tr``/``cv`` folders, read in place:
    the recipe loads its training data first and gives those statistics to the others)."""
    return split == "train" or not (base / "train").is_dir()


def load_split(
    root: str | Path | None = None,
    split: str = "train",
    linkedset: str = "clean",
    targets: Sequence[str] = DEFAULT_TARGETS,
    stats: F.FeatureStats | None = None,
    usedbins_threshold_db: float = F.USEDBINS_THRESHOLD_DB,
    spectral: F.Spectral = F.MTLAB,
    ivec: VectorList | None = None,
    mvn: str = "global",
    num_sources: int = NUM_SOURCES,
    stream: bool = False,
    on_bad_data: str = "raise",
    stats_utterances: int | None = STATS_UTTERANCES,
    progress: Progress | None | bool = True,
    dynamic_mix: MixSettings | Mapping[str, Any] | None = None,
    feature_inputs: Mapping[str, str | Path] | None = None,
    layout: str | None = None,
) -> SeparationDataset | StreamedSplit | DynamicMix | ShardedSplit:
    """Load one split of one linked set as a :class:`SeparationDataset`.

    ``targets`` picks the keys besides ``features`` (see the module docstring). ``stats`` normalizes the
    features; when None they are computed from the ``train`` split of the same linked set and kept as
    ``dataset.stats``. ``spectral`` sets the STFT (mtlab's by default; ``Spectral.from_processor_config``
    or ``features.ORIGINAL`` for the original's sine window, framing and int16 scale). ``ivec`` names the vector
list of the ``ivec`` key (a relative path is taken from ``root``); its utterances are joined with the others.
``mvn`` normalizes the features with ``stats`` (``"global"``), per utterance over its frames (``"local"``, the
original's ``mvn_type = local``; ``stats`` are then only recorded) or not at all (``"none"``). ``num_sources``
is the number of speakers S per mixture (the original's ``nrs``): the lists ``s1.scp`` ... ``sS.scp`` and S ids
per ``spk.txt`` line are read.

``stream=True`` returns a :class:`~mtlab.data.streamed.StreamedSplit`: a manifest whose audio is read per batch
and whose features are computed per batch on the training device (memory independent of the corpus size); its
statistics (when ``stats`` is None) come from :func:`cached_stats`: from at most ``stats_utterances`` utterances
spread evenly over the training list (all of a smaller list; None: all), with ``progress`` shown.
``on_bad_data="skip"`` (streamed only) leaves bad files out and records them instead of raising.
``root`` may be a folder of shards that :func:`mtlab.data.shardwriter.write_shards` wrote (``<root>/<split>/<linkedset>/
index.npz``), local or an fsspec URL (``s3://...``): with ``stream=True`` it returns a
:class:`~mtlab.data.shards.ShardedSplit`, whose statistics (when ``stats`` is None) are those the shards hold.
``dynamic_mix`` (streamed only: a :class:`~mtlab.data.dynamic.MixSettings` or its dict, e.g.
``{"gain_db": [-5, 5], "noise": "noise.scp", "noise_snr_db": [10, 20]}``) returns a
:class:`~mtlab.data.dynamic.DynamicMix`: a new mixture of the split's sources per example and epoch.
``feature_inputs`` (streamed only; ``mvn`` ``"local"`` or ``"none"``) maps more data keys to audio lists (a relative
path is taken from ``root``) whose utterances match the mixtures sample for sample: each key gets the features of its
list's audio, computed and normalized as the mixture's (e.g. an earlier separation's outputs fed to a second model).
``layout`` (``"wsj0-2mix"``, ``"wham"`` or ``"librimix"``; streamed only) reads the corpus tree at ``root`` in
place, without list files (:mod:`mtlab.data.inplace`); ``split`` is mtlab's name or the corpus's folder (``tr``).
For list files it is three steps, each callable alone: :func:`read_split` (the lists, or a manifest and its WAV
headers), :func:`split_statistics` (what the features are normalized with) and :func:`build_split`.
Example::

        train = load_split(split="train", linkedset="noisy")
        dev = load_split(split="dev", linkedset="noisy", stats=train.stats)
    """
    unknown = sorted(set(targets) - set(TARGET_KEYS))
    if unknown:
        raise DataError(f"unknown target keys {unknown}; valid keys: {', '.join(TARGET_KEYS)}")
    keys = set(targets)
    if root is not None and is_shard_root(root, split, linkedset):
        if not stream or dynamic_mix is not None:
            raise DataError(f"{root}: a shard folder is read with stream=True and without dynamic_mix (it draws "
                            "sources from the whole split, not from a rank's own shards)")
        if on_bad_data not in BAD_DATA:
            raise DataError(f"load_split on_bad_data={on_bad_data!r}; valid: {list(BAD_DATA)}")
        if mvn not in F.MVN_TYPES:
            raise DataError(f"load_split mvn={mvn!r}; valid: {list(F.MVN_TYPES)}")
        return load_shards(root, split, linkedset, keys, stats, spectral, usedbins_threshold_db, mvn, num_sources,
                           on_bad_data, ivec)
    base = Path(root) if root is not None else data_samples_dir()
    if layout is not None:
        return _load_tree(base, layout, split, linkedset, keys, stats, usedbins_threshold_db, spectral, ivec, mvn,
                          num_sources, stream, on_bad_data, stats_utterances, progress, dynamic_mix)
    request = SplitRequest.checked(base, split, linkedset, keys, spectral, usedbins_threshold_db, ivec, mvn,
                                   num_sources, stream, on_bad_data, stats_utterances, progress, dynamic_mix,
                                   feature_inputs)
    files = read_split(request)
    return build_split(request, files, split_statistics(request, files, stats))


@dataclass(frozen=True)
class SplitRequest:
    """:func:`load_split`'s arguments for a split of list files, checked: where its lists are, what to compute."""

    base: Path
    folder: Path
    split: str
    linkedset: str
    keys: frozenset[str]
    spectral: F.Spectral
    threshold_db: float
    ivec: VectorList | None  # None unless the ivec key is asked for
    mvn: str
    num_sources: int
    stream: bool
    on_bad_data: str
    stats_utterances: int | None
    progress: Progress | None | bool
    mixing: MixSettings | None
    others: Mapping[str, Path]  # feature_inputs, their paths taken from base

    @classmethod
    def checked(cls, base: Path, split: str, linkedset: str, keys: set[str], spectral: F.Spectral,
                threshold_db: float, ivec: VectorList | None, mvn: str, num_sources: int, stream: bool,
                on_bad_data: str, stats_utterances: int | None, progress: Progress | None | bool,
                dynamic_mix: MixSettings | Mapping[str, Any] | None, feature_inputs: Mapping[str, str | Path] | None) -> SplitRequest:
        """The request, or a DataError naming the argument to change."""
        folder = _split_dir(base, split)
        if isinstance(num_sources, bool) or not isinstance(num_sources, int) or num_sources < 1:
            raise DataError(f"load_split num_sources={num_sources!r}: the number of sources per mixture, a positive "
                            "integer (lists s1.scp ... sS.scp)")
        if mvn not in F.MVN_TYPES:
            raise DataError(f"load_split mvn={mvn!r}; valid: {list(F.MVN_TYPES)}")
        if "ivec" in keys and ivec is None:
            raise DataError("target key 'ivec' needs its vector list: load_split(..., ivec=VectorList(list=..., "
                            "nrcol=...)) (a recipe's data = { ..., ivec = { list = ..., nrcol = ... } })")
        if on_bad_data not in BAD_DATA:
            raise DataError(f"load_split on_bad_data={on_bad_data!r}; valid: {list(BAD_DATA)}")
        mixing = MixSettings.from_dict(dynamic_mix, base) if dynamic_mix is not None else None
        if mixing is not None and not stream:
            raise DataError("load_split dynamic_mix needs stream=True (mixtures are made per batch from the sources)")
        others = {k: (Path(p) if Path(p).is_absolute() else base / p) for k, p in (feature_inputs or {}).items()}
        if others and (not stream or mixing is not None or mvn == "global"):
            raise DataError(f"load_split feature_inputs {sorted(others)} need stream=True, no dynamic_mix and mvn "
                            f"'local' or 'none' (got stream={stream}, mvn={mvn!r}): their features are computed per "
                            "batch and have no statistics of their own")
        clash = sorted(set(others) & {"features", *TARGET_KEYS})
        if clash:
            raise DataError(f"load_split feature_inputs {clash}: name them otherwise than mtlab's data keys "
                            f"(features, {', '.join(TARGET_KEYS)})")
        if not stream and on_bad_data != "raise":
            raise DataError("load_split on_bad_data='skip' needs stream=True (the in-memory path reads every file "
                            "before training and stops at the first bad one)")
        return cls(base, folder, split, linkedset, frozenset(keys), spectral, threshold_db,
                   ivec if "ivec" in keys else None, mvn, num_sources, stream, on_bad_data, stats_utterances, progress,
                   mixing, others)

    @property
    def vector_list(self) -> Path | None:
        """The ivec key's vector list (a relative path taken from ``base``)."""
        if self.ivec is None:
            return None
        return Path(self.ivec.list) if Path(self.ivec.list).is_absolute() else self.base / self.ivec.list

    @property
    def list_name(self) -> str:
        return f"mix_{self.linkedset}.scp"

    def example(self, row: Row, stats: F.FeatureStats | None,
                vector_stats: tuple[torch.Tensor, torch.Tensor] | None) -> dict[str, torch.Tensor]:
        """One utterance's example (its features normalized with ``stats``, as ``mvn`` says)."""
        return _example(row, set(self.keys), stats, self.threshold_db, self.spectral, self.ivec, vector_stats,
                        self.mvn, self.num_sources)


@dataclass(frozen=True)
class StreamedFiles:
    """What :func:`read_split` finds to stream: the lists as a manifest, each mixture's samples from its WAV header,
    and the bad files left out (``on_bad_data="skip"``)."""

    manifest: Manifest
    samples: np.ndarray
    skipped: list[Skipped]


@dataclass(frozen=True)
class ListedRows:
    """What :func:`read_split` finds to hold in memory: the utterances every list has, joined by name."""

    rows: list[Row]
    report: JoinReport


@dataclass(frozen=True)
class SplitStatistics:
    """What :func:`split_statistics` gives: the feature statistics, the vector list's (mean, std) when it is
    normalized globally, and the examples it featurized to compute them (in memory), not yet normalized."""

    features: F.FeatureStats
    vectors: tuple[torch.Tensor, torch.Tensor] | None = None
    raw_examples: list[dict[str, torch.Tensor]] | None = None


def read_split(request: SplitRequest) -> StreamedFiles | ListedRows:
    """Read a split's lists: streamed, a manifest with each mixture's WAV header (bad files left out or raising as
    ``on_bad_data`` says, with a warning); in memory, the rows every list shares."""
    r = request
    sources, speakers = bool(r.keys & _SOURCE_KEYS), bool(r.keys & _SPEAKER_KEYS)
    if not r.stream:
        return ListedRows(*_read_rows(r.folder, r.linkedset, sources, speakers, r.vector_list, r.num_sources))
    _input_list_exists(r.folder, r.linkedset)
    manifest = read_manifest_cached(r.folder / r.list_name,
                                    [r.folder / f"s{k}.scp" for k in range(1, r.num_sources + 1)]
                                    if sources or r.mixing else [],
                                    r.folder / "spk.txt" if speakers or r.mixing else None, r.vector_list,
                                    tuple(r.others.values()))
    manifest, samples, skipped = header_samples(
        manifest, r.on_bad_data, progress=printed_progress(f"WAV headers of {r.split}/{r.list_name}")
        if r.progress is True else (r.progress or None))
    if skipped:
        warnings.warn(f"{r.folder}/{r.list_name}: left out {len(skipped)} bad file(s) (on_bad_data='skip'), "
                      f"first {skipped[0].reason}; dataset.skipped lists them", DataWarning, stacklevel=3)
    return StreamedFiles(manifest, samples, skipped)


def split_statistics(request: SplitRequest, files: StreamedFiles | ListedRows,
                     stats: F.FeatureStats | None = None) -> SplitStatistics:
    """The statistics a split is normalized with: ``stats`` when given, else its own (the training split, see
    :func:`_own_stats`) or the training split's; streamed, from :func:`cached_stats`."""
    r = request
    vectors = vector_stats(r.ivec, r.base) if r.ivec is not None and r.ivec.mvn == "global" else None
    own = _own_stats(r.base, r.split)
    if stats is not None:
        return SplitStatistics(stats, vectors)
    if isinstance(files, StreamedFiles):
        # the training split: the utterances its lists share (as the in-memory path); another split: train's
        return SplitStatistics(cached_stats(r.base, r.linkedset, r.split if own else "train", r.spectral,
                                            r.stats_utterances, r.progress, r.on_bad_data,
                                            files.manifest.mix if own else None), vectors)
    if not own:
        return SplitStatistics(compute_stats(r.base, r.linkedset, "train", r.spectral), vectors)
    raw = _featurize(r, files.rows, None, vectors)
    return SplitStatistics(F.FeatureStats.from_features((e["features"] for e in raw),
                                                        source=f"{r.split}/{r.list_name}"), vectors, raw)


def build_split(request: SplitRequest, files: StreamedFiles | ListedRows,
                statistics: SplitStatistics) -> SeparationDataset | StreamedSplit | DynamicMix:
    """The split object: a :class:`StreamedSplit` (a :class:`DynamicMix` over it with ``dynamic_mix``) that reads
    audio per batch, or a :class:`SeparationDataset` of every example computed now."""
    r, stats = request, statistics.features
    if isinstance(files, StreamedFiles):
        compute = partial(_example, keys=set(r.keys), stats=stats, threshold_db=r.threshold_db, spectral=r.spectral,
                          ivec=r.ivec, ivec_stats=statistics.vectors, mvn=r.mvn, num_sources=r.num_sources)
        featurizer = Featurizer(r.keys, r.spectral, stats, r.threshold_db, r.mvn, tuple(r.others))
        streamed = StreamedSplit(files.manifest, files.samples, stats, r.split, r.linkedset,
                                 _speakers_of_manifest(r.base, files.manifest, r.num_sources), r.num_sources,
                                 featurizer, compute, r.ivec, statistics.vectors, r.on_bad_data, files.skipped,
                                 tuple(r.others))
        return DynamicMix(streamed, r.mixing) if r.mixing is not None else streamed
    if statistics.raw_examples is None:
        examples = _featurize(r, files.rows, stats, statistics.vectors)
    else:  # featurized to compute the statistics: normalized now
        examples = statistics.raw_examples
        if r.mvn == "global":
            for e in examples:
                e["features"] = stats.normalize(e["features"])
    return SeparationDataset(examples, [row.name for row in files.rows], stats, files.report, r.split, r.linkedset,
                             _num_speakers(r.base, examples), r.num_sources)


def _featurize(request: SplitRequest, rows: list[Row], stats: F.FeatureStats | None,
               vectors: tuple[torch.Tensor, torch.Tensor] | None) -> list[dict[str, torch.Tensor]]:
    """Every row's example, with progress: reading and featurizing a real corpus takes a while (68 s for one
    linked set)."""
    r = request
    show = printed_progress(f"features of {r.split}/{r.list_name}") if r.progress is True else (r.progress or None)
    out = []
    for row in rows:
        out.append(r.example(row, stats, vectors))
        if show is not None:
            show(len(out), len(rows))
    return out


def _load_tree(base: Path, layout: str, split: str, linkedset: str, keys: set[str], stats: F.FeatureStats | None,
               threshold_db: float, spectral: F.Spectral, ivec: VectorList | None, mvn: str, num_sources: int,
               stream: bool, on_bad_data: str, stats_utterances: int | None, progress: Progress | None | bool,
               dynamic_mix: MixSettings | Mapping[str, Any] | None) -> StreamedSplit | DynamicMix:
    """``load_split(layout=...)``: one split of a corpus tree read in place (see :mod:`mtlab.data.inplace`)."""
    if not stream:
        raise DataError(f"load_split layout={layout!r} reads the corpus tree in place and needs stream=True; for the "
                        "in-memory path write list files first (mtlab prepare)")
    if ivec is not None and "ivec" in keys:
        raise DataError(f"load_split layout={layout!r}: a corpus tree has no vector list (ivec); write list files "
                        "with mtlab prepare and add the vector list beside them")
    if mvn not in F.MVN_TYPES:
        raise DataError(f"load_split mvn={mvn!r}; valid: {list(F.MVN_TYPES)}")
    if on_bad_data not in BAD_DATA:
        raise DataError(f"load_split on_bad_data={on_bad_data!r}; valid: {list(BAD_DATA)}")
    mixing = MixSettings.from_dict(dynamic_mix, base) if dynamic_mix is not None else None
    tree = tree_split(layout, base, split, linkedset, num_sources)
    full = tree.manifest
    manifest = Manifest(full.names, full.mix, full.sources if keys & _SOURCE_KEYS or mixing else (),
                        full.speakers if keys & _SPEAKER_KEYS or mixing else None, None, full.report)
    manifest, samples, skipped = header_samples(manifest, on_bad_data, beside=False)
    if skipped:
        warnings.warn(f"{tree.folder}: left out {len(skipped)} bad file(s) (on_bad_data='skip'), first "
                      f"{skipped[0].reason}; dataset.skipped lists them", DataWarning, stacklevel=3)
    if stats is None:  # the training split's, as for list files
        train = manifest if split_names(get_layout(layout))[split] == "train" else \
            tree_split(layout, base, "train", linkedset, num_sources).manifest
        stats = column_stats(train.mix, None, f"{layout} train/{linkedset} at {base}", spectral, stats_utterances,
                             progress, on_bad_data)
    compute = partial(_example, keys=keys, stats=stats, threshold_db=threshold_db, spectral=spectral, mvn=mvn,
                      num_sources=num_sources)
    featurizer = Featurizer(frozenset(keys), spectral, stats, threshold_db, mvn)
    streamed = StreamedSplit(manifest, samples, stats, split, linkedset, tree.num_speakers, num_sources, featurizer,
                             compute, None, None, on_bad_data, skipped)
    return DynamicMix(streamed, mixing) if mixing is not None else streamed
