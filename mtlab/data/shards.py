"""A linked set written once as shards: plain tar files, of which each rank of a data-parallel run reads its own.

:func:`mtlab.data.shardwriter.write_shards` reads one split of one linked set the way ``load_split(..., stream=True)``
does and writes::

    <out>/<split>/<linkedset>/shard-000000.tar  shard-000001.tar  ...  index.npz

Each shard is a plain (webdataset-style) tar: per utterance ``<key>.mix.wav``, ``<key>.s1.wav`` ... ``<key>.sS.wav``
(16-bit PCM, as read from the corpus) and ``<key>.json`` (name, samples, speakers, i-vector), ``key`` being the
utterance's 8-digit position in the list (utterance names may hold dots, which tar-stream readers split keys on).
``index.npz`` holds, per utterance, its name, samples, speakers, shard and the byte offset, size and CRC-32 of each
member, and once: the feature statistics, the spectral settings they were computed with, and each shard's size
and SHA-256. Everything is written into a temporary folder that replaces the old one at the end, with fixed
member metadata (no time stamps, owners): the same corpus gives the same bytes.

``load_split(root=<out or an fsspec URL>, ..., stream=True)`` finds ``index.npz`` and returns a
:class:`ShardedSplit`: its audio is read per batch by ranged reads of one member at a time (``seek`` + ``read``; on an
object store, one range request), checked against the member's CRC-32, and turned into features on the device by
the same :class:`~mtlab.data.ondevice.Featurizer` as a streamed split. ``split.shard_of`` tells a
:class:`~mtlab.tasks.sampling.BatchStream` the shard of each utterance: rank ``r`` of ``W`` draws its batches only
from shards ``i`` with ``i % W == r``, so it opens no other rank's file.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import wave
import zipfile
import zlib
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

from ..base.batching import collate
from ..tasks.sources import Skipped
from . import features as F
from .audio import SAMPLE_RATE
from .errors import DataError
from .source import AudioSplit
from .ondevice import Featurizer
from .vectors import VectorList

FORMAT = 1  # the index's layout version
INDEX = "index.npz"
SHARD_SIZE = 1000  # utterances per shard by default (about 270 MB of 5.6 s, 8 kHz mixtures with 2 sources)
MAX_OPEN = 32  # shard files a process keeps open at once (the oldest is closed beyond)
SOURCE_KEYS = {"src_mag", "binary_targets", "frame_target"}
SPEAKER_KEYS = {"spk", "spk_pair"}


def is_url(root: str | Path) -> bool:
    """True for an fsspec URL (``s3://bucket/corpus``, ``file:///data``, ``memory://x``)."""
    return "://" in str(root)


def join(root: str | Path, *parts: str) -> str:
    """``root/part/...`` for a local folder or a URL."""
    return "/".join([str(root).rstrip("/"), *parts]) if is_url(root) else os.path.join(str(root), *parts)


def _fsspec() -> Any:
    try:
        import fsspec
    except ImportError:
        raise ImportError('reading shards from a URL needs fsspec: pip install "mtlab[shards]" (and the backend '
                          "of the store, e.g. s3fs for s3://)") from None
    return fsspec


def _open_file(path: str) -> IO[bytes]:
    """Open a shard or index file for reading: every read of this module goes through here."""
    if is_url(path):
        return _fsspec().open(path, "rb").open()
    return open(path, "rb")


def _exists(path: str) -> bool:
    if is_url(path):
        fs, inner = _fsspec().core.url_to_fs(path)
        return bool(fs.exists(inner))
    return os.path.isfile(path)


def is_shard_root(root: str | Path | None, split: str, linkedset: str) -> bool:
    """True when ``root/<split>`` holds shard folders (``<linkedset>/index.npz``); any URL is taken as a shard root."""
    return root is not None and (is_url(root) or os.path.isfile(join(root, split, linkedset, INDEX)) or
                                 bool(_written(root, split)))


def _written(root: str | Path, split: str) -> list[str]:
    """The linked sets of a local shard folder's split."""
    return [] if is_url(root) else sorted(p.parent.name for p in Path(root, split).glob(f"*/{INDEX}"))


# ---------------------------------------------------------------------------------- reading
def read_index(root: str | Path, split: str, linkedset: str) -> tuple[dict[str, Any], dict[str, np.ndarray], str]:
    """The metadata and arrays of a shard folder's index, and the index's path."""
    path = join(root, split, linkedset, INDEX)
    if not _exists(path):
        written = f" (written here: {_written(root, split)})" if not is_url(root) else ""
        raise DataError(f"{path}: no shard index{written}; write the shards with `mtlab shard CORPUS {root}` (or "
                        f"mtlab.data.shardwriter.write_shards), or check the split and linked set names")
    with _open_file(path) as f:
        raw = f.read()
    try:
        with np.load(io.BytesIO(raw), allow_pickle=False) as found:
            arrays = {k: found[k] for k in found.files}
        meta = json.loads(str(arrays.pop("meta")))
    except (ValueError, KeyError, OSError, EOFError, zipfile.BadZipFile, json.JSONDecodeError) as err:
        raise DataError(f"{path}: not a readable shard index ({type(err).__name__}: {err}; a copy cut short?); copy "
                        f"it again, or write the shards again with `mtlab shard CORPUS {root}`") from err
    if meta.get("format") != FORMAT:
        raise DataError(f"{path}: shard index format {meta.get('format')!r}, this mtlab reads {FORMAT}; write the "
                        "shards again with this version")
    return meta, arrays, path


class ShardedSplit(AudioSplit):
    """One split of one linked set read from shards; see the module docstring. Same interface as a
    :class:`~mtlab.data.streamed.StreamedSplit` (``lengths``, ``audio(i)``, ``segment``, ``featurize``, ``split[i]``),
    plus ``shard_of`` (the shard of each utterance), ``files`` (the shard paths) and ``opened`` (those this
    process opened)."""

    shard_of: np.ndarray

    def __init__(self, root: str | Path, meta: dict[str, Any], arrays: dict[str, np.ndarray], featurizer: Featurizer,
                 stats: F.FeatureStats, on_bad_data: str = "raise") -> None:
        super().__init__(featurizer, arrays["samples"])
        self.root, self.meta = str(root), meta
        self.split, self.linkedset = meta["split"], meta["linkedset"]
        self.num_sources, self.num_speakers = meta["num_sources"], meta["num_speakers"]
        self.manifest_names = arrays["names"]
        self.shard_of = arrays["shard"].astype(np.int64)
        self._offset, self._size, self._crc = arrays["offset"], arrays["size"], arrays["crc"]
        self._speakers = arrays["speakers"]
        self.files = [join(root, self.split, self.linkedset, s["file"]) for s in meta["shards"]]
        self.stats, self.on_bad_data = stats, on_bad_data
        self.skipped: list[Skipped] = []
        self.opened: set[str] = set()
        self._handles: dict[int, IO[bytes]] = {}
        self._pid = os.getpid()

    @property
    def names(self) -> list[str]:
        """Every utterance's name, in the index's order."""
        return [n.decode("utf-8") for n in self.manifest_names]

    def __len__(self) -> int:
        return len(self.samples)

    def __getstate__(self) -> dict[str, Any]:  # DataLoader workers (spawn) open their own files
        return {**self.__dict__, "_handles": {}}

    def _file(self, shard: int) -> IO[bytes]:
        if self._pid != os.getpid():  # a forked DataLoader worker: never share the parent's file positions
            self._handles, self._pid = {}, os.getpid()
        if shard not in self._handles:
            if len(self._handles) >= MAX_OPEN:
                self._handles.pop(next(iter(self._handles))).close()
            path, expected = self.files[shard], int(self.meta["shards"][shard]["bytes"])
            try:
                handle = _open_file(path)
            except FileNotFoundError:
                raise DataError(f"{path}: shard {shard} of {len(self.files)} is missing; the shard folder is "
                                "incomplete: copy it again, or write it again with `mtlab shard`") from None
            self.opened.add(path)
            size = handle.seek(0, io.SEEK_END)
            if size != expected:
                handle.close()
                raise DataError(f"{path}: {size} bytes but the index says {expected}; the shard was changed or cut "
                                "short: copy it again, or write the shards again with `mtlab shard`")
            self._handles[shard] = handle
        return self._handles[shard]

    def _member(self, i: int, m: int) -> bytes:
        shard = int(self.shard_of[i])
        f = self._file(shard)
        f.seek(int(self._offset[i, m]))
        blob = f.read(int(self._size[i, m]))
        if len(blob) != int(self._size[i, m]) or zlib.crc32(blob) != int(self._crc[i, m]):
            raise DataError(f"{self.files[shard]}: member {i:08d} ({self.name(i)!r}, part {m}) fails its CRC-32 "
                            "check; the shard is damaged: copy it again, or write the shards again with `mtlab shard`")
        return blob

    def name(self, i: int) -> str:
        """The name of utterance ``i``."""
        return self.manifest_names[i].decode("utf-8")

    def _wav(self, blob: bytes) -> torch.Tensor:
        with wave.open(io.BytesIO(blob), "rb") as w:
            frames = w.readframes(w.getnframes())
        return torch.from_numpy(np.frombuffer(frames, dtype="<i2").copy())

    def audio(self, index: int) -> dict[str, torch.Tensor] | Skipped:
        """What a batch carries for utterance ``index`` (as :meth:`StreamedSplit.audio`)."""
        try:
            return self._read(index)
        except DataError as err:
            if self.on_bad_data == "skip":
                return Skipped(self.name(index), f"{self.files[int(self.shard_of[index])]}:{index:08d}", str(err))
            raise

    def _read(self, i: int) -> dict[str, torch.Tensor]:
        keys = self.featurizer.keys
        out = {"mix_wav": self._wav(self._member(i, 0))}
        if keys & SOURCE_KEYS:
            out["src_wav"] = torch.stack([self._wav(self._member(i, 1 + k)) for k in range(self.num_sources)], -1)
        if "spk" in keys:
            out["spk"] = torch.tensor(int(self._speakers[i, 0]), dtype=torch.long)
        if "spk_pair" in keys:
            out["spk_pair"] = torch.from_numpy(self._speakers[i].astype(np.int64))
        if "ivec" in keys:
            info = json.loads(self._member(i, self._size.shape[1] - 1))
            out["ivec"] = torch.tensor(info["ivec"], dtype=torch.float32)
        return out

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        """The example of utterance ``index`` with every key computed now (on the CPU)."""
        item = self._read(index)
        data, _ = self.featurize(collate([item]), "cpu")
        return {k: v[0] for k, v in data.items()}

    def close(self) -> None:
        """Close the open shard files."""
        for handle in self._handles.values():
            handle.close()
        self._handles = {}

    def __repr__(self) -> str:
        hours = int(self.samples.sum()) / SAMPLE_RATE / 3600
        return (f"ShardedSplit({self.split}/{self.linkedset}: {len(self)} utterances in {len(self.files)} shards, "
                f"{hours:.2f} h; from {self.root})")


def load_shards(root: str | Path, split: str, linkedset: str, keys: set[str], stats: F.FeatureStats | None,
                spectral: F.Spectral, threshold_db: float, mvn: str, num_sources: int,
                on_bad_data: str = "raise", ivec: VectorList | None = None) -> ShardedSplit:
    """The :class:`ShardedSplit` ``load_split`` returns for a shard folder (arguments checked there). The i-vectors
    are those written in the shards; ``ivec`` (a :class:`~mtlab.data.vectors.VectorList`), when given, must name
    the same shape and normalization."""
    meta, arrays, path = read_index(root, split, linkedset)
    if ivec is not None and "ivec" in keys and meta["ivec"]:
        written = {k: meta["ivec"][k] for k in ("nrcol", "nrs", "mvn")}
        if written != {k: getattr(ivec, k) for k in written}:
            raise DataError(f"{path}: its i-vectors were written with {written}, the load asks for nrcol = "
                            f"{ivec.nrcol}, nrs = {ivec.nrs}, mvn = {ivec.mvn!r}; match them or write the shards again")
    if meta["num_sources"] != num_sources:
        raise DataError(f"{path}: written with num_sources = {meta['num_sources']}, asked for {num_sources}; set "
                        f"num_sources = {meta['num_sources']} or write the shards again")
    lacking = sorted(k for k in keys if (k in SOURCE_KEYS and not meta["sources"]) or
                     (k in SPEAKER_KEYS and not meta["speakers"]) or (k == "ivec" and not meta["ivec"]))
    if lacking:
        raise DataError(f"{path}: the shards hold no data for targets {lacking} (their lists were not there when they "
                        "were written); drop those targets or write the shards from lists that have them")
    if stats is None:
        if meta["spectral"] != asdict(spectral):
            raise DataError(f"{path}: its feature statistics were computed with spectral {meta['spectral']}, this "
                            f"load asks for {asdict(spectral)}; pass stats=... or write the shards with that spectral")
        stats = F.FeatureStats.from_dict(meta["stats"], origin=path)
    featurizer = Featurizer(frozenset(keys), spectral, stats, threshold_db, mvn)
    return ShardedSplit(root, meta, arrays, featurizer, stats, on_bad_data)


def verify_shards(root: str | Path, split: str, linkedset: str) -> list[str]:
    """Check every shard of a shard folder against the SHA-256 and size in its index (reads every byte);
    returns the shard paths, or raises :class:`DataError` naming the first missing or damaged one."""
    meta, _, _ = read_index(root, split, linkedset)
    checked = []
    for k, shard in enumerate(meta["shards"]):
        path = join(root, split, linkedset, shard["file"])
        digest, size = hashlib.sha256(), 0
        try:
            with _open_file(path) as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
                    size += len(block)
        except FileNotFoundError:
            raise DataError(f"{path}: shard {k} of {len(meta['shards'])} is missing; copy the folder again") from None
        if size != shard["bytes"] or digest.hexdigest() != shard["sha256"]:
            raise DataError(f"{path}: its SHA-256 or size differs from the index's; the shard is damaged: copy it "
                            "again, or write the shards again with `mtlab shard`")
        checked.append(path)
    return checked
