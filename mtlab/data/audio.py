"""WAV reading with the stdlib ``wave`` module: mono 16-bit PCM at a checked sample rate."""
from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import torch

from .errors import DataError

SAMPLE_RATE = 8000


def _where(path: Path, origin: str | None) -> str:
    return f"{path} (listed at {origin})" if origin else str(path)


def read_wav(path: str | Path, sample_rate: int = SAMPLE_RATE, origin: str | None = None) -> torch.Tensor:
    """Samples of a mono 16-bit PCM WAV as float32 in [-1, 1), shape [N].

    ``origin`` (e.g. ``"train/s1.scp:12"``) is added to error messages so a bad file can be traced to its list.
    """
    return read_wav_int16(path, sample_rate, origin).float() / 32768.0


def read_wav_int16(path: str | Path, sample_rate: int = SAMPLE_RATE, origin: str | None = None) -> torch.Tensor:
    """Samples of a mono 16-bit PCM WAV as they are stored (int16), shape [N]; errors as :func:`read_wav`."""
    path = Path(path)
    where = _where(path, origin)
    if not path.is_file():
        raise DataError(f"{where}: audio file not found; fix the path in the list or regenerate the data")
    try:
        with wave.open(str(path), "rb") as w:
            channels, width, rate, frames = w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()
            raw = w.readframes(frames)
    except (wave.Error, EOFError, OSError) as err:
        raise DataError(f"{where}: not a readable PCM WAV file ({err}); re-export it as 16-bit PCM WAV") from err
    _check_format(where, channels, width, rate, sample_rate)
    if len(raw) != 2 * frames:
        raise DataError(f"{where}: truncated WAV (header says {frames} samples, found {len(raw) // 2})")
    if frames == 0:
        raise DataError(f"{where}: empty WAV (0 samples); remove it from the list")
    return torch.from_numpy(np.frombuffer(raw, dtype="<i2").copy())


def wav_samples(path: str | Path, sample_rate: int = SAMPLE_RATE, origin: str | None = None) -> int:
    """Samples of a mono 16-bit PCM WAV from its header alone (nothing else is read); errors as :func:`read_wav`."""
    where = f"{path} (listed at {origin})" if origin else str(path)  # no Path: it would intern every name
    try:
        with wave.open(str(path), "rb") as w:
            channels, width, rate, frames = w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()
    except FileNotFoundError:
        raise DataError(f"{where}: audio file not found; fix the path in the list or regenerate the data") from None
    except (wave.Error, EOFError, OSError) as err:
        raise DataError(f"{where}: not a readable PCM WAV file ({err}); re-export it as 16-bit PCM WAV") from err
    _check_format(where, channels, width, rate, sample_rate)
    if frames == 0:
        raise DataError(f"{where}: empty WAV (0 samples); remove it from the list")
    return frames


def _check_format(where: str, channels: int, width: int, rate: int, sample_rate: int) -> None:
    if channels != 1:
        raise DataError(f"{where}: {channels} channels, expected mono; mix it down to one channel")
    if width != 2:
        raise DataError(f"{where}: {8 * width}-bit samples, expected 16-bit PCM; convert it to 16-bit")
    if rate != sample_rate:
        raise DataError(f"{where}: sample rate {rate} Hz, expected {sample_rate} Hz; resample it to {sample_rate} Hz")
