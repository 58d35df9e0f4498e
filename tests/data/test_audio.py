"""WAV reading and its errors."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.corpora import write_wav

from mtlab.data import DataError, read_wav


def test_reads_int16_as_float(tmp_path: Path) -> None:
    path = write_wav(tmp_path / "ok.wav", np.array([0, 16384, -32768, 32767]))
    assert torch.equal(read_wav(path), torch.tensor([0.0, 0.5, -1.0, 32767 / 32768]))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rate": 16000}, "sample rate 16000 Hz, expected 8000 Hz; resample"),
        ({"width": 1}, "8-bit samples, expected 16-bit"),
        ({"channels": 2}, "2 channels, expected mono"),
    ],
)
def test_wrong_format_names_file_and_origin(tmp_path: Path, kwargs: dict[str, int], message: str) -> None:
    samples = np.zeros((400, kwargs.get("channels", 1)))
    path = write_wav(tmp_path / "odd.wav", samples, **kwargs)
    with pytest.raises(DataError, match=rf"odd\.wav \(listed at x\.scp:3\): {message}"):
        read_wav(path, origin="x.scp:3")


def test_missing_and_unreadable(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"gone\.wav.*not found"):
        read_wav(tmp_path / "gone.wav")
    junk = tmp_path / "junk.wav"
    junk.write_bytes(b"this is not a wav file at all")
    with pytest.raises(DataError, match=r"junk\.wav: not a readable PCM WAV"):
        read_wav(junk)
    good = write_wav(tmp_path / "cut.wav", np.zeros(1000))
    (tmp_path / "cut.wav").write_bytes(good.read_bytes()[:-500])
    with pytest.raises(DataError, match=r"cut\.wav: truncated WAV"):
        read_wav(tmp_path / "cut.wav")
