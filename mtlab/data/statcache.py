"""Global feature statistics from one streaming pass over a linked set, cached beside its list.

The pass reads one mixture at a time and merges per-utterance mean and sum of squared deviations (Chan et al.'s
pairwise update, in float64), so memory holds one utterance whatever the corpus size. The result is written to
``<split>/mix_<linkedset>.stats.json`` (or, where that folder is read-only, and always for a corpus tree read in
place, ``$MTLAB_CACHE`` / ``~/.cache/mtlab``) with a checksum of what it was computed from: the list file's bytes, the STFT settings, the
sample of utterances, and the size and modification time of every audio file read. A later pass with the same
checksum reads the file instead.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from . import features as F
from .audio import SAMPLE_RATE, read_wav
from .errors import DataError
from .manifest import Column
from .usercache import beside_allowed, user_cache

Progress = Callable[[int, int], None]  # (utterances done, utterances in all)


def stats_sample(count: int, limit: int | None) -> list[int]:
    """Indices the statistics read: all, or ``limit`` spread evenly over the list (first and last included)."""
    if limit is None or limit >= count:
        return list(range(count))
    if limit < 1:
        raise DataError(f"stats_utterances={limit}: read at least one utterance (or None for all)")
    return sorted({round(k * (count - 1) / max(limit - 1, 1)) for k in range(limit)})


def checksum(list_file: Path | None, column: Column, spectral: F.Spectral, sample: Sequence[int]) -> str:
    """What the statistics depend on, hashed: list bytes (a corpus tree read in place has none: its column is
    the list), STFT settings, sample, and each audio file's stat."""
    h = hashlib.sha256()
    if list_file is not None:
        h.update(list_file.read_bytes())
    h.update(repr(spectral).encode())
    h.update(repr(list(sample)).encode())
    h.update(column.prefix.encode() + column.suffixes.tobytes())  # the utterances a join kept
    for i in sample:
        try:
            st = os.stat(column.resolved(i))
            h.update(f"{st.st_size}:{st.st_mtime_ns};".encode())
        except OSError:
            h.update(b"missing;")
    return h.hexdigest()


def cache_paths(list_file: Path | None, digest: str) -> list[Path]:
    """Where the statistics of ``list_file`` are looked for and written, in order: beside the list, then the user
    cache folder (the only place for a corpus tree read in place, ``list_file`` None)."""
    home = user_cache() / "stats" / f"{digest}.json"
    beside = list_file is not None and beside_allowed(list_file)
    return [list_file.with_suffix(".stats.json"), home] if beside and list_file is not None else [home]


def load_cached(list_file: Path | None, digest: str) -> F.FeatureStats | None:
    """The cached statistics whose checksum is ``digest``, else None (a stale or unreadable file is ignored)."""
    for path in cache_paths(list_file, digest):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(data, dict) and data.get("checksum") == digest:
            return F.FeatureStats.from_dict(data, origin=str(path))
    return None


def save_cached(list_file: Path | None, digest: str, stats: F.FeatureStats) -> Path | None:
    """Write the statistics to the first writable cache path; returns it (None when none is writable)."""
    for path in cache_paths(list_file, digest):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps({**stats.to_dict(), "checksum": digest}) + "\n")
            tmp.replace(path)  # atomic: ranks computing the same statistics never read half a file
            return path
        except OSError:
            continue
    return None


def streaming_stats(column: Column, sample: Sequence[int], spectral: F.Spectral, source: str,
                    progress: Progress | None = None, skip_bad: bool = False) -> F.FeatureStats:
    """Per-bin mean and standard deviation of the log-magnitude features of the ``sample`` lines of ``column`` (the
    mixtures), one at a time.
    ``skip_bad`` passes over unreadable files (the linked set's ``on_bad_data="skip"`` leaves them out too)."""
    count, mean, m2 = 0, None, None
    for k, i in enumerate(sample):
        try:
            wav = read_wav(column.resolved(i), SAMPLE_RATE, origin=column.where(i))
        except DataError:
            if skip_bad:
                continue
            raise
        if spectral.num_frames(wav.shape[0]) == 0:
            if skip_bad:
                continue
            raise DataError(f"{column.resolved(i)} (listed at {column.where(i)}): {wav.shape[0]} samples is shorter than "
                            f"one analysis window ({spectral.win_length} samples); remove it from the list")
        feats = F.log_magnitude(F.magnitude(wav, spectral)).to(torch.float64)
        n = feats.shape[0]
        m = feats.mean(dim=0)
        d2 = (feats - m).square().sum(dim=0)
        if mean is None or m2 is None:
            count, mean, m2 = n, m, d2
        else:
            delta = m - mean
            total = count + n
            mean = mean + delta * (n / total)
            m2 = m2 + d2 + delta.square() * (count * n / total)
            count = total
        if progress is not None:
            progress(k + 1, len(sample))
    if mean is None or m2 is None:
        raise DataError(f"cannot compute feature statistics from zero frames ({source or 'no source'})")
    std = (m2 / count).sqrt().clamp_min(1e-5)
    return F.FeatureStats(mean.float(), std.float(), int(count), source)


def printed_progress(label: str, every_s: float = 2.0) -> Progress:
    """A progress callback that logs ``label: k/n utterances`` at most every ``every_s`` seconds (and at the end,
    when it was shown at all), through the ``mtlab`` logger and stderr."""
    import sys

    start = last = time.monotonic()
    shown = False

    def show(done: int, total: int) -> None:
        nonlocal last, shown
        now = time.monotonic()
        if now - last >= every_s or (shown and done == total):
            last, shown = now, True
            rate = done / max(now - start, 1e-9)
            print(f"{label}: {done}/{total} utterances ({rate:.0f}/s)", file=sys.stderr, flush=True)

    return show
