"""Writing a linked set as shards (the format :mod:`mtlab.data.shards` describes and reads).

>>> write_shards(None, "train", "clean", "shards/", shard_size=1000)  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
import wave
import zipfile
import zlib
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..tasks.sources import Skipped
from . import features as F
from .audio import SAMPLE_RATE
from .corpus import DEFAULT_TARGETS, NUM_SOURCES, data_samples_dir, load_split
from .errors import DataError
from .shards import FORMAT, INDEX, SHARD_SIZE, SOURCE_KEYS, SPEAKER_KEYS, is_shard_root
from .statcache import printed_progress
from .streamed import StreamedSplit


def _wav_bytes(samples: torch.Tensor) -> bytes:
    """A mono 16-bit PCM WAV of ``samples`` (int16 [N]) at ``SAMPLE_RATE``, as bytes (a fixed 44-byte header)."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes(samples.numpy().astype("<i2").tobytes())
    return buf.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> int:
    """Append member ``name``; returns the offset of its data in the file."""
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = len(data), 0, 0o644, 0, 0, "", ""
    tar.addfile(info, io.BytesIO(data))
    return tar.offset - -(-len(data) // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE  # the data ends padded to a block


def _save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """``np.savez`` with a fixed time stamp on every zip member (``np.savez`` stamps the time of writing)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for key, value in arrays.items():
            with archive.open(zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0)), "w",
                              force_zip64=True) as f:
                np.lib.format.write_array(f, np.asanyarray(value), allow_pickle=False)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_shards(root: str | Path | None, split: str, linkedset: str, out: str | Path, shard_size: int = SHARD_SIZE,
                 num_sources: int | None = None, spectral: F.Spectral = F.MTLAB, **load: Any) -> Path:
    """Write ``split``/``linkedset`` of the corpus at ``root`` (list layout) as shards under
    ``out/<split>/<linkedset>/``; returns that folder. ``shard_size``: utterances per shard. The sources
    (``s1.scp`` ...) and speakers (``spk.txt``) are written when their lists exist; ``load`` goes to ``load_split``
    (``ivec=``, ``stats_utterances=``, ``progress=``: also of the writing, ``on_bad_data="skip"``). The feature
    statistics written are the training split's under ``spectral``, as the streamed path computes them."""
    if isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size < 1:
        raise DataError(f"write_shards shard_size={shard_size!r}: utterances per shard, a positive integer")
    base = Path(root) if root is not None else data_samples_dir()
    if is_shard_root(base, split, linkedset):
        raise DataError(f"{base}: already shards; write_shards reads a corpus in list layout (mix_<set>.scp ...)")
    if Path(out).resolve() == base.resolve():  # the corpus's own loads would then find shards instead of its lists
        raise DataError(f"write_shards out={out}: that is the corpus itself; write the shards to another folder")
    num_sources = NUM_SOURCES if num_sources is None else num_sources
    folder = base / split
    sources = all((folder / f"s{k}.scp").is_file() for k in range(1, num_sources + 1))
    speakers = (folder / "spk.txt").is_file()
    targets = [k for k in DEFAULT_TARGETS
               if (k not in SOURCE_KEYS or sources) and (k not in SPEAKER_KEYS or speakers)]
    if load.get("ivec") is not None:
        targets.append("ivec")
    data = load_split(base, split, linkedset, targets=targets, stream=True, num_sources=num_sources,
                      spectral=spectral, **load)
    if not isinstance(data, StreamedSplit):  # a dynamic mix draws new mixtures each epoch: nothing fixed to write
        raise DataError(f"write_shards writes the corpus's own mixtures, not a {type(data).__name__}: give no "
                        "dynamic_mix")
    progress = load.get("progress", True)
    show = printed_progress(f"shards of {split}/{linkedset}") if progress is True else (progress or None)
    target = Path(out) / split / linkedset
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{linkedset}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    n, members = len(data), 2 + (num_sources if sources else 0)
    offsets, sizes = np.zeros((n, members), np.int64), np.zeros((n, members), np.int64)
    crcs = np.zeros((n, members), np.uint32)
    spk = np.full((n, num_sources), -1, np.int64)
    shards: list[dict[str, Any]] = []
    try:
        for first in range(0, n, shard_size):
            name = f"shard-{len(shards):06d}.tar"
            with tarfile.open(tmp / name, "w", format=tarfile.PAX_FORMAT) as tar:
                for i in range(first, min(first + shard_size, n)):
                    blobs = _members(data, i, sources, speakers, num_sources, spk)
                    for m, (suffix, blob) in enumerate(blobs):
                        offsets[i, m] = _add(tar, f"{i:08d}.{suffix}", blob)
                        sizes[i, m], crcs[i, m] = len(blob), zlib.crc32(blob)
                    if show is not None:
                        show(i + 1, n)
            shards.append({"file": name, "bytes": (tmp / name).stat().st_size, "sha256": _sha256(tmp / name),
                           "utterances": min(shard_size, n - first)})
        meta = {"format": FORMAT, "split": split, "linkedset": linkedset, "num_sources": num_sources,
                "sources": sources, "speakers": speakers, "num_speakers": data.num_speakers,
                "ivec": load["ivec"].to_dict() if load.get("ivec") is not None else None,
                "spectral": asdict(spectral), "stats": data.stats.to_dict(), "shards": shards,
                "skipped": [s.to_dict() for s in data.skipped]}
        shard_of = np.repeat(np.arange(len(shards), dtype=np.int32), [s["utterances"] for s in shards])
        _save_npz(tmp / INDEX, {"meta": np.array(json.dumps(meta, sort_keys=True)), "names": data.manifest.names,
                                "samples": data.samples, "shard": shard_of, "offset": offsets, "size": sizes,
                                "crc": crcs, "speakers": spk})
        old = target.parent / f".{linkedset}.old{os.getpid()}"
        if target.exists():
            target.replace(old)
        tmp.replace(target)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _members(data: StreamedSplit, i: int, sources: bool, speakers: bool, num_sources: int,
             spk: np.ndarray) -> list[tuple[str, bytes]]:
    """The members of utterance ``i``: mixture, sources, then its JSON (whose speaker ids also go into ``spk``)."""
    item = data.audio(i)
    if isinstance(item, Skipped):  # on_bad_data="skip": a bad file mid-list stops the writing all the same
        raise DataError(f"{item.where}: {item.reason}; the shards would lack it: fix the file or drop it from the list")
    row = data.row(i)
    blobs = [("mix.wav", _wav_bytes(item["mix_wav"]))]
    if sources:
        blobs += [(f"s{k + 1}.wav", _wav_bytes(item["src_wav"][:, k])) for k in range(num_sources)]
    ids = list(row.speakers.ints(num_sources)) if speakers and row.speakers is not None else None
    if ids is not None:
        spk[i] = ids
    info = {"name": row.name, "samples": int(data.samples[i]), "speakers": ids,
            "ivec": item["ivec"].tolist() if "ivec" in item else None}
    return blobs + [("json", json.dumps(info, sort_keys=True).encode())]
