"""Bad audio met mid-epoch by a streamed linked set: a DataError naming the file and its list line, or, with
``on_bad_data="skip"``, the example left out and recorded; a dead data worker is reported, never a hang."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.corpora import make_corpus, write_wav

from mtlab.data import DataError, DataWarning, load_split
from mtlab.tasks.sampling import BatchStream

pytestmark = pytest.mark.usefixtures("one_thread")
NAMES = [f"u{i}" for i in range(6)]


def _unreadable(path: Path) -> None:
    path.write_bytes(b"this is not a RIFF file at all" * 10)


def _truncated(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-500])


def _rate(path: Path) -> None:
    write_wav(path, np.zeros(1500, dtype=np.int64), rate=16000)


def _stereo(path: Path) -> None:
    write_wav(path, np.zeros((1500, 2), dtype=np.int64), channels=2)


def _empty(path: Path) -> None:
    write_wav(path, np.zeros(0, dtype=np.int64))


def _missing(path: Path) -> None:
    path.unlink()


CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "unreadable": (_unreadable, "not a readable PCM WAV"),
    "truncated": (_truncated, "truncated WAV"),
    "sample_rate": (_rate, "sample rate 16000 Hz"),
    "stereo": (_stereo, "2 channels"),
    "empty": (_empty, "empty WAV"),
    "missing": (_missing, "not found"),
}


def _split(tmp_path: Path, policy: str = "raise") -> Any:
    make_corpus(tmp_path, NAMES, [1500 + 97 * i for i in range(len(NAMES))])
    return load_split(tmp_path, split="train", linkedset="clean", stream=True, on_bad_data=policy, progress=False)


def _epoch(stream: BatchStream) -> list[Any]:
    return [next(stream) for _ in range(len(stream))]


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("which", ["mix_clean", "s2"])
def test_a_bad_file_mid_epoch_names_the_file_and_its_list_line(tmp_path: Path, case: str, which: str) -> None:
    split = _split(tmp_path)
    spoil, message = CASES[case]
    spoil(tmp_path / "train" / which / "u3.wav")  # after the manifest was read: met mid-epoch
    with pytest.raises(DataError, match=message) as info:
        _epoch(BatchStream(split, 2, 1, seed=0))
    assert f"u3.wav (listed at {tmp_path / 'train' / which}.scp:4)" in str(info.value)


@pytest.mark.parametrize("case", list(CASES))
def test_the_skip_policy_leaves_the_example_out_and_records_it(tmp_path: Path, case: str) -> None:
    split = _split(tmp_path, "skip")
    spoil, message = CASES[case]
    spoil(tmp_path / "train" / "mix_clean" / "u3.wav")
    stream = BatchStream(split, 2, 1, seed=0)
    batches = _epoch(stream)
    assert sum(len(b[1]["features"]) for b in batches) == len(NAMES) - 1  # every other utterance, once
    [record] = stream.skipped
    assert record["name"] == "u3" and record["where"].endswith("mix_clean.scp:4") and message in record["reason"]
    assert record["epoch"] == 0


def test_a_bad_file_at_load_time_is_skipped_with_a_warning(tmp_path: Path) -> None:
    make_corpus(tmp_path, NAMES)
    _stereo(tmp_path / "train" / "mix_clean" / "u1.wav")
    with pytest.raises(DataError, match=r"u1.wav \(listed at .*mix_clean.scp:2\): 2 channels"):
        load_split(tmp_path, split="train", linkedset="clean", stream=True, progress=False)
    with pytest.warns(DataWarning, match="left out 1 bad file"):
        split = load_split(tmp_path, split="train", linkedset="clean", stream=True, on_bad_data="skip", progress=False)
    assert "u1" not in split.names and len(split) == len(NAMES) - 1
    assert [s.name for s in split.skipped] == ["u1"] and "2 channels" in split.skipped[0].reason
    with pytest.raises(DataError, match="stream=True"):
        load_split(tmp_path, split="train", linkedset="clean", on_bad_data="skip")


def test_a_bad_policy_name_lists_the_choices(tmp_path: Path) -> None:
    make_corpus(tmp_path, NAMES)
    with pytest.raises(DataError, match=r"on_bad_data='ignore'; valid: \['raise', 'skip'\]"):
        load_split(tmp_path, split="train", linkedset="clean", stream=True, on_bad_data="ignore")


@pytest.mark.slow  # starts DataLoader worker processes
def test_a_bad_file_read_by_a_worker_names_it_too(tmp_path: Path) -> None:
    split = _split(tmp_path)
    _truncated(tmp_path / "train" / "s1" / "u2.wav")
    with pytest.raises(DataError, match=r"u2.wav \(listed at .*s1.scp:3\): truncated WAV"):
        _epoch(BatchStream(split, 2, 1, seed=0, num_workers=2))


DYING = """
import os, sys, torch
from pathlib import Path
from mtlab.tasks.sampling import BatchStream, DataWorkerError

class Dying:
    # a streamed source whose worker dies (as if killed) reading example 3 while the flag file exists
    lengths = [5] * 8
    def __init__(self, flag): self.flag = flag
    def __len__(self): return 8
    def __getitem__(self, i): return {"x": torch.full((5,), float(i))}
    def audio(self, i):
        if i == 3 and self.flag.exists() and torch.utils.data.get_worker_info() is not None:
            os._exit(9)
        return self[i]
    def featurize(self, batch, device=None): return batch

flag = Path(sys.argv[1]); flag.touch()
stream = BatchStream(Dying(flag), 1, 1, seed=0, shuffle=False, num_workers=1)
seen, reports = [], []
while len(seen) < 8:
    try:
        seen.append(int(next(stream)[0]["x"][0, 0]))
    except (DataWorkerError, RuntimeError) as err:  # torch may also report the death from its SIGCHLD handler
        reports.append(f"{type(err).__name__}: {err}")
        flag.unlink(missing_ok=True)  # fresh workers from the kept position read on
        if len(reports) > 3:
            raise
print("REPORTED", reports[0])
print("SEEN", seen)
"""


@pytest.mark.slow  # starts a Python process and DataLoader workers
def test_a_dead_worker_is_reported_and_the_next_draw_retries_the_batch(tmp_path: Path) -> None:
    # its own process: torch reports a dead worker through a SIGCHLD handler that may fire anywhere in the
    # process that owns the loader, which must not be the test runner
    script = tmp_path / "dying.py"
    script.write_text(DYING)
    res = subprocess.run([sys.executable, str(script), str(tmp_path / "die")], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert re.search(r"REPORTED (DataWorkerError: a data worker of this stream died at epoch 0, batch [0-3] |"
                     r"RuntimeError: DataLoader worker \(pid)", res.stdout), res.stdout
    assert "SEEN [0, 1, 2, 3, 4, 5, 6, 7]" in res.stdout


@pytest.mark.slow  # trains and writes a whole experiment folder, plots included (about 10 s)
def test_skipped_examples_reach_the_experiment_folder(tmp_path: Path) -> None:
    from helpers.recipes import make_tiny_corpus, write_tiny_recipe

    from mtlab.training.loop import run
    from mtlab.apps.recipe import from_recipe

    corpus = make_tiny_corpus(tmp_path / "corpus")
    path = write_tiny_recipe(tmp_path / "tiny.toml", corpus, num_steps=4, valid_frequency=100)
    path.write_text(path.read_text().replace('linkedset = "noisy" }', 'linkedset = "noisy", on_bad_data = "skip" }'))
    listed = corpus / "train" / "mix_noisy.scp"
    lines = listed.read_text().splitlines()
    name, original = lines[0].split()
    first = tmp_path / f"{name}.wav"
    first.write_bytes(Path(original).read_bytes())  # a copy to spoil: the lists point into the shipped samples
    listed.write_text("\n".join([f"{name} {first}", *lines[1:]]) + "\n")
    exp = from_recipe(path)
    _truncated(first)  # after the manifest and the statistics were read: met mid-epoch
    heard: list[dict[str, Any]] = []
    exp.trainer.add_callback(lambda event, info: heard.extend(info["examples"]) if event == "data_skipped" else None)
    run(exp, progress=False, expdir=tmp_path / "exp")
    records = [json.loads(line) for line in (tmp_path / "exp" / "skipped.jsonl").read_text().splitlines()]
    assert records and all(r["name"] == first.stem and r["linkedset"] == "noisy" for r in records)
    assert [r["name"] for r in heard] == [r["name"] for r in records] and all("step" in r for r in heard)
