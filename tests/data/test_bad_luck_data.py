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


# ------------------------------------------------------------------ 4. a corpus regenerated under the same lists
@pytest.mark.parametrize("where", ["lists", "tree"])
def test_a_regenerated_utterance_gets_its_new_length(tmp_path: Path, where: str, monkeypatch) -> None:
    import numpy as np
    from data_helpers import write_wav

    monkeypatch.setenv("MTLAB_CACHE", str(tmp_path / "cache"))
    if where == "lists":
        make_corpus(tmp_path, NAMES)
        kw = {"split": "train", "linkedset": "clean"}
        root = tmp_path
    else:  # a wsj0-2mix tree read in place
        from test_layouts import make_layouts

        root = tmp_path / "corpus"
        make_layouts.make_tree("wsj0-2mix", root, 3)
        kw = {"layout": "wsj0-2mix", "split": "train"}
    split = load_split(root, stream=True, progress=False, **kw)
    row = split.row(1)
    old = int(split.samples[1])
    new = old + 800
    for entry in [row.mix, *row.sources]:  # regenerated at another length; lists untouched
        write_wav(Path(entry.resolve()), np.ones(new, dtype=np.int64))
    fresh = load_split(root, stream=True, progress=False, **kw)
    got = int(fresh.samples[fresh.names.index(row.name)])
    held = got == new
    record(f"regenerated corpus, stale header lengths: {where}", held)
    assert held, (old, got, new)
    fresh.audio(fresh.names.index(row.name))  # and it reads


# ------------------------------------------------------------------ 5. a DataError in a DataLoader worker
def _after_a_bad_file(tmp_path: Path, workers: int) -> tuple[dict, list[str], list[str], str]:
    """Draw until the bad file raises; repair it; return (state after the error, the live stream's next batch, a
    stream restored from that state's next batch, the error's message)."""
    folder = tmp_path / f"w{workers}"
    make_corpus(folder, NAMES)
    split = load_split(folder, split="train", linkedset="clean", stream=True, progress=False)
    bad = folder / "train" / "s1" / "u3.wav"
    good = bad.read_bytes()
    bad.write_bytes(good[:-500])
    stream = BatchStream(split, 2, 1, seed=0, num_workers=workers)
    with pytest.raises(DataError) as info:
        for _ in range(len(stream)):
            next(stream)
    state = stream.state_dict()
    batches = stream.epoch_batches(state["epoch"])
    retried = state["position"] < len(batches) and split.names.index("u3") in batches[state["position"]]
    assert retried, "the failed draw moved the stream: the next draw skips the batch that failed"
    bad.write_bytes(good)
    names = lambda batch: [f"{float(v):.6f}" for v in batch[0]["features"].sum(dim=(1, 2))]  # noqa: E731
    live = names(next(stream))
    again = BatchStream(split, 2, 1, seed=0, num_workers=workers)
    again.load_state_dict(state)
    return state, live, names(next(again)), str(info.value)


def test_a_data_error_keeps_the_stream_where_the_failed_draw_started(tmp_path: Path) -> None:
    state, live, restored, _ = _after_a_bad_file(tmp_path, 0)
    held = live == restored
    record("DataError mid-stream, resume agrees: 0 workers", held)
    assert held


@pytest.mark.slow  # starts DataLoader worker processes
def test_a_data_error_in_a_worker_leaves_the_stream_as_without_workers(tmp_path: Path) -> None:
    state0, live0, _, message0 = _after_a_bad_file(tmp_path, 0)
    state1, live1, restored1, message1 = _after_a_bad_file(tmp_path, 1)
    held = state1 == state0 and live1 == restored1 == live0
    record("DataError in a DataLoader worker, resume agrees", held)
    assert held, (state0, state1, live0, live1, restored1)
    clean = "Traceback" not in message1 and "DataLoader worker" not in message1 and len(message1.splitlines()) == 1
    record("DataError in a DataLoader worker, one-line message", clean)
    assert clean, message1
    assert "u3.wav (listed at" in message1 and "truncated WAV" in message1
