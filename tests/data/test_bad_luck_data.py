"""Bad luck in the data path, round 4: a skip policy that finds no readable file, stale header lengths after a
regenerated corpus, an error raised inside a DataLoader worker. Each case says what it tried (tests/campaign.py)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from data_helpers import make_corpus

from mtlab.data import DataError, load_split
from mtlab.tasks.sampling import BatchStream

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from campaign import record  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
NAMES = [f"u{i}" for i in range(6)]


# ------------------------------------------------------------------ 2. no readable file under on_bad_data="skip"
@pytest.mark.timeout(60, method="signal")  # fails the test, never holds the run
def test_skip_with_no_readable_file_left_raises_instead_of_hanging(tmp_path: Path) -> None:
    make_corpus(tmp_path, NAMES)
    split = load_split(tmp_path, split="train", linkedset="clean", stream=True, on_bad_data="skip", progress=False)
    stream = BatchStream(split, 2, 1, seed=0)
    next(stream)
    before = stream.state_dict()
    for wav in (tmp_path / "train" / "mix_clean").glob("*.wav"):
        wav.unlink()  # the audio disk goes away mid-run
    with pytest.raises(DataError) as info:
        next(stream)
    text = str(info.value)
    held = "no readable example" in text and "mix_clean.scp" in text and stream.state_dict() == before
    record("skip with no readable file left", held)
    assert held, (text, stream.state_dict(), before)
