"""A linked set as a manifest: names, paths, lengths from the WAV headers, speakers; audio is read per batch.

``load_split(..., stream=True)`` returns a :class:`StreamedSplit`. It holds no audio and no features: its memory
follows the number of utterances (a few hundred bytes each), not the hours of audio. A minibatch stream
(:class:`mtlab.tasks.sampling.BatchStream`) reads ``split.audio(i)`` (int16 samples, in DataLoader workers when the
linked set has ``num_workers``), collates them, and ``split.featurize(batch, device)`` computes the features and
targets of the whole batch on the device that trains (:mod:`mtlab.data.ondevice`). ``split[i]`` still gives the
precomputed-style example of one utterance (computed on the spot), for code that reads examples one by one.

Bad data met while reading (unreadable, truncated, another sample rate, stereo, empty) raises a
:class:`DataError` naming the file and its list line; with ``on_bad_data="skip"`` the utterance is left out of
its batch instead and recorded (``BatchStream.skipped``; the training loop writes them to ``skipped.jsonl``).
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..tasks.sources import Skipped
from . import features as F
from .audio import SAMPLE_RATE, read_wav_int16, wav_samples
from .errors import DataError
from .source import AudioSplit
from .lists import ListEntry
from .manifest import Manifest
from .ondevice import Featurizer
from .vectors import VectorList, normalize, read_vector

BAD_DATA = ("raise", "skip")


@dataclass(frozen=True)
class Row:
    """One utterance's list lines, as the per-utterance example computer reads them."""

    name: str
    mix: ListEntry
    sources: tuple[ListEntry, ...]
    speakers: ListEntry | None
    vector: ListEntry | None = None
    inputs: tuple[ListEntry, ...] = ()  # audio of other inputs of the same kind (``feature_inputs``)


class StreamedSplit(AudioSplit):
    """One split of one linked set read lazily; see the module docstring. ``lengths`` are frames (for bucketing),
    ``samples`` the mixture's samples, both from the WAV headers; the lists are held as compact columns
    (:class:`~mtlab.data.manifest.Manifest`)."""

    def __init__(self, manifest: Manifest, samples: np.ndarray, stats: F.FeatureStats, split: str,
                 linkedset: str, num_speakers: int, num_sources: int, featurizer: Featurizer,
                 example: Callable[[Row], dict[str, torch.Tensor]], ivec: VectorList | None = None,
                 ivec_stats: tuple[torch.Tensor, torch.Tensor] | None = None,
                 on_bad_data: str = "raise", skipped: list[Skipped] | None = None,
                 feature_inputs: tuple[str, ...] = ()) -> None:
        if on_bad_data not in BAD_DATA:
            raise DataError(f"on_bad_data={on_bad_data!r}; valid: {list(BAD_DATA)}")
        super().__init__(featurizer, samples)
        self.manifest = manifest
        self.stats = stats
        self.report = manifest.report
        self.split = split
        self.linkedset = linkedset
        self.num_speakers = num_speakers
        self.num_sources = num_sources
        self.on_bad_data = on_bad_data
        self.skipped = list(skipped or [])  # left out while the manifest was read (on_bad_data="skip")
        self._example = example  # (row) -> the precomputed-style example; corpus owns how it is computed
        self._ivec, self._ivec_stats = ivec, ivec_stats
        self.feature_inputs = tuple(feature_inputs)  # data keys of manifest.inputs, in order

    @property
    def names(self) -> list[str]:
        """The utterance names, in list order (built on each call: the manifest keeps them as bytes)."""
        return [n.decode("utf-8") for n in self.manifest.names]

    def row(self, index: int) -> Row:
        """The list lines of utterance ``index``."""
        m, name = self.manifest, self.manifest.name(index)
        part = (lambda c: c.entry(index, name) if c is not None else None)
        return Row(name, m.mix.entry(index, name), tuple(c.entry(index, name) for c in m.sources),
                   part(m.speakers), part(m.vector), tuple(c.entry(index, name) for c in m.inputs))

    def __len__(self) -> int:
        return len(self.manifest)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        """The example of utterance ``index`` with every key computed now, as ``load_split`` precomputes it."""
        row = self.row(index)
        example = self._example(row)
        for key, entry in zip(self.feature_inputs, row.inputs):
            wav = read_wav_int16(entry.resolve(), SAMPLE_RATE, origin=entry.where).double() / F.INT16_SCALE
            example[key] = self.featurizer.input_features(wav, example["features"].shape[0], entry.where)
        return example

    def audio(self, index: int) -> dict[str, torch.Tensor] | Skipped:
        """What a batch carries for utterance ``index``: ``mix_wav`` [N] and ``src_wav`` [N, S] int16, speaker
        ids and vectors; a :class:`Skipped` under ``on_bad_data="skip"`` when a file is bad."""
        row = self.row(index)
        try:
            return self._read(row, int(self.samples[index]))
        except DataError as err:
            if self.on_bad_data == "skip":
                return Skipped(row.name, row.mix.where, str(err))
            raise

    def _read(self, row: Row, samples: int) -> dict[str, torch.Tensor]:
        keys = self.featurizer.keys
        mix = read_wav_int16(row.mix.resolve(), SAMPLE_RATE, origin=row.mix.where)
        if mix.shape[0] != samples:
            raise DataError(f"{row.mix.resolve()} (listed at {row.mix.where}) has {mix.shape[0]} samples but had "
                            f"{samples} when the manifest was read; the file changed: rebuild the linked set")
        if self.featurizer.spectral.num_frames(mix.shape[0]) == 0 or mix.shape[0] < F.WIN_LENGTH:
            raise DataError(f"{row.mix.resolve()} (listed at {row.mix.where}): {mix.shape[0]} samples is shorter "
                            f"than one analysis window ({F.WIN_LENGTH} samples); remove it from the list")
        out = {"mix_wav": mix}
        if row.sources:
            out["src_wav"] = _beside(row.sources, row, mix.shape[0], "sources must match the mixture sample for sample")
        if row.speakers is not None:
            ids = row.speakers.ints(self.num_sources)
            if "spk" in keys:
                out["spk"] = torch.tensor(ids[0], dtype=torch.long)
            if "spk_pair" in keys:
                out["spk_pair"] = torch.tensor(ids, dtype=torch.long)
        if self._ivec is not None and row.vector is not None:
            out["ivec"] = normalize(read_vector(row.vector, self._ivec.nrcol, self._ivec.nrs), self._ivec_stats)
        if row.inputs:
            out["input_wav"] = _beside(row.inputs, row, mix.shape[0], "an input's audio must match the mixture sample "
                                       "for sample (its features frame for frame)")
        return out

    def __repr__(self) -> str:
        hours = int(self.samples.sum()) / SAMPLE_RATE / 3600
        return (f"StreamedSplit({self.split}/{self.linkedset}: {len(self)} utterances, {sum(self.lengths)} frames, "
                f"{hours:.2f} h; read per batch)")


def _beside(entries: tuple[ListEntry, ...], row: Row, samples: int, rule: str) -> torch.Tensor:
    """[N, k] int16: the audio of ``entries`` (a row's sources, or its other inputs), each as long as its mixture
    (``samples``), else a DataError that says so and why (``rule``)."""
    wavs = []
    for entry in entries:
        wav = read_wav_int16(entry.resolve(), SAMPLE_RATE, origin=entry.where)
        if wav.shape[0] != samples:
            raise DataError(f"{entry.resolve()} (listed at {entry.where}) has {wav.shape[0]} samples but its mixture "
                            f"{row.mix.resolve()} has {samples}; {rule}")
        wavs.append(wav)
    return torch.stack(wavs, dim=-1)


def _lengths_cache(manifest: Manifest, beside: bool = True) -> tuple[list[Path], str]:
    """Where the header lengths of a manifest's mixtures are cached (beside the mixture list, then in the user
    cache folder; only there for a corpus tree read in place, ``beside=False``), and the checksum of what they
    depend on: the list's bytes, the utterances kept and each mixture file's size and modification time, so a
    corpus regenerated under the same lists is read again (one ``stat`` per file, far cheaper than its header);
    a file changed in place after that is caught when it is read (its length no longer matches)."""
    from .usercache import beside_allowed, user_cache

    mix = manifest.mix
    beside = beside and beside_allowed(Path(mix.path))
    listed = Path(mix.path).read_bytes() if beside else b""
    h = hashlib.sha256(listed + mix.prefix.encode() + mix.suffixes.tobytes())
    for i in range(len(manifest)):
        try:
            st = os.stat(mix.resolved(i))
            h.update(f"{st.st_size}:{st.st_mtime_ns};".encode())
        except OSError:
            h.update(b"missing;")
    digest = h.hexdigest()
    home = user_cache() / "samples" / f"{digest}.npz"
    return ([Path(mix.path).with_suffix(".samples.npz"), home] if beside else [home]), digest


def _save_lengths(paths: list[Path], samples: np.ndarray, digest: str) -> Path | None:
    """Write the lengths to the first writable path (a read-only corpus folder goes to the user cache)."""
    for path in paths:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.stem}.tmp{os.getpid()}.npz")
            np.savez(tmp, samples=samples, checksum=np.array(digest))
            tmp.replace(path)  # atomic: ranks reading the same corpus never see half a file
            return path
        except OSError:
            continue
    return None


def header_samples(manifest: Manifest, on_bad_data: str, beside: bool = True,
                   progress: Any = None) -> tuple[Manifest, np.ndarray, list[Skipped]]:
    """Samples of every mixture from its WAV header (cached beside the list as ``mix_<set>.samples.npz``, else in
    the user cache folder; see :func:`_lengths_cache`); bad headers raise, or are skipped (left out and returned)."""
    caches, digest = _lengths_cache(manifest, beside)
    for cache in caches:
        try:
            with np.load(cache) as found:
                if str(found["checksum"]) == digest and len(found["samples"]) == len(manifest):
                    return manifest, found["samples"].astype(np.int64), []
        except (OSError, KeyError, ValueError):
            pass  # no cache, or another one: read the headers
    samples = np.zeros(len(manifest), dtype=np.int64)
    skipped = []
    mix = manifest.mix
    for i in range(len(manifest)):
        if progress is not None:
            progress(i + 1, len(manifest))  # a callback (done, total): headers of a large corpus take a while
        try:
            samples[i] = wav_samples(mix.resolved(i), SAMPLE_RATE, origin=mix.where(i))
        except DataError as err:
            if on_bad_data != "skip":
                raise
            skipped.append(Skipped(manifest.name(i), mix.where(i), str(err)))
    if not skipped:
        _save_lengths(caches, samples, digest)
    if len(skipped) == len(manifest):
        raise DataError(f"every utterance of the list was skipped as bad data (first: {skipped[0].reason})")
    if skipped:
        keep = samples > 0
        return manifest.subset(keep), samples[keep], skipped
    return manifest, samples, skipped
