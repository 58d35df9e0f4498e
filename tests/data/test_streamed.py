"""Streamed linked sets: a manifest read per batch, features on the device equal to the precomputed ones,
cached streaming statistics, DataLoader workers, and exact resume through a worker restart."""
from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers.corpora import write_wav

from mtlab.data import load_split, read_wav
from mtlab.data.corpus import cached_stats
from mtlab.data.features import ORIGINAL, Spectral
from mtlab.data.streamed import StreamedSplit
from mtlab.tasks.sampling import BatchStream
from mtlab.tasks.sources import SegmentedExamples, trainset_fraction

pytestmark = pytest.mark.usefixtures("one_thread")

SETTINGS = {
    "mtlab": {},
    "original": {"spectral": ORIGINAL},
    "local_mvn": {"mvn": "local"},
    "pad_preemph": {"spectral": Spectral(framing="pad", preemph=0.97, window="hamming"), "mvn": "none"},
}


def assert_same_batch(a: Any, b: Any) -> None:
    """Every key and its sequence lengths equal (floats to 1e-5, integers and masks exactly)."""
    (da, la), (db, lb) = a, b
    assert sorted(da) == sorted(db) and sorted(la) == sorted(lb)
    for key in da:
        assert da[key].shape == db[key].shape and da[key].dtype == db[key].dtype, key
        if da[key].is_floating_point():
            torch.testing.assert_close(da[key], db[key], rtol=1e-5, atol=1e-5, msg=key)
        else:
            assert torch.equal(da[key], db[key]), key
        assert torch.equal(la[key], lb[key]), key


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_features_on_the_device_equal_the_precomputed_examples(setting: str) -> None:
    kwargs = SETTINGS[setting]
    linkedset = "noisy" if setting == "mtlab" else "clean"
    memory = load_split(split="dev", linkedset=linkedset, **kwargs)  # stats: the training split's
    streamed = load_split(split="dev", linkedset=linkedset, stream=True, **kwargs)
    assert isinstance(streamed, StreamedSplit) and streamed.lengths == memory.lengths
    if kwargs.get("mvn") != "local":  # under local mvn the in-memory path records stats of normalized features
        torch.testing.assert_close(streamed.stats.mean, memory.stats.mean, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(streamed.stats.std, memory.stats.std, rtol=1e-6, atol=1e-6)
    a, b = BatchStream(memory, 8, 4, seed=3), BatchStream(streamed, 8, 4, seed=3)
    for _ in range(len(a)):  # a whole epoch: every utterance, every key
        assert_same_batch(next(a), next(b))
    one = streamed[5]  # one example read alone equals the precomputed one too
    for key, value in memory[5].items():
        torch.testing.assert_close(one[key], value, rtol=1e-5, atol=1e-5)


def test_segments_and_the_head_of_the_list_cut_streamed_audio_like_precomputed_examples() -> None:
    memory = load_split(split="dev", linkedset="clean")
    streamed = load_split(split="dev", linkedset="clean", stream=True, stats=memory.stats)
    a = BatchStream(SegmentedExamples(trainset_fraction(memory, 0.5), 100), 6, 2, seed=1)
    b = BatchStream(SegmentedExamples(trainset_fraction(streamed, 0.5), 100), 6, 2, seed=1)
    assert len(a) == len(b)
    for _ in range(len(a)):
        assert_same_batch(next(a), next(b))
    # the head of a stage's segments (trainset_frac within a segment_lengths stage)
    a = BatchStream(trainset_fraction(SegmentedExamples(memory, 50), 0.3), 6, 2, seed=2)
    b = BatchStream(trainset_fraction(SegmentedExamples(streamed, 50), 0.3), 6, 2, seed=2)
    for _ in range(len(a)):
        assert_same_batch(next(a), next(b))


def test_three_sources_stream_like_precomputed(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    folder = tmp_path / "train"
    lines: dict[str, list[str]] = {"mix_clean": [], "s1": [], "s2": [], "s3": []}
    for i in range(5):
        n = 900 + 173 * i
        parts = [(rng.standard_normal(n) * (3000 if k == i % 3 else 300)).astype(np.int64) for k in range(3)]
        for name, x in (("mix_clean", sum(parts)), ("s1", parts[0]), ("s2", parts[1]), ("s3", parts[2])):
            write_wav(folder / name / f"u{i}.wav", x)
            lines[name].append(f"u{i} {name}/u{i}.wav")
    for name, text in lines.items():
        (folder / f"{name}.scp").write_text("\n".join(text) + "\n")
    (folder / "spk.txt").write_text("".join(f"u{i} {i % 4} {(i + 1) % 4} {(i + 2) % 4}\n" for i in range(5)))
    memory = load_split(tmp_path, num_sources=3, spectral=ORIGINAL)
    streamed = load_split(tmp_path, num_sources=3, spectral=ORIGINAL, stream=True)
    assert streamed.num_speakers == memory.num_speakers == 4
    assert_same_batch(next(BatchStream(memory, 5, 1, seed=0)), next(BatchStream(streamed, 5, 1, seed=0)))


def test_the_manifest_holds_no_audio() -> None:
    streamed = load_split(split="train", linkedset="clean", stream=True)
    tensors = [k for k, v in vars(streamed).items() if isinstance(v, torch.Tensor) and v.numel() > 1000]
    assert tensors == []
    # what a worker receives: names, list lines and lengths, well under the 2 x 45 KB of audio per utterance
    assert len(pickle.dumps(streamed)) < 3_000 * len(streamed)
    for i in (0, len(streamed) - 1):  # lengths from the headers alone equal what reading the file gives
        assert streamed.samples[i] == read_wav(streamed.row(i).mix.resolve()).shape[0]


def _copy_split(tmp_path: Path) -> Path:
    """A writable copy of the sample corpus's dev split (lists and the clean mixtures) under tmp_path/dev."""
    from mtlab.data import data_samples_dir

    src = data_samples_dir() / "dev"
    dst = tmp_path / "dev"
    (dst / "mix_clean").mkdir(parents=True)
    for wav in (src / "mix_clean").glob("*.wav"):
        (dst / "mix_clean" / wav.name).write_bytes(wav.read_bytes())
    (dst / "mix_clean.scp").write_text((src / "mix_clean.scp").read_text())
    return dst


def test_statistics_are_cached_beside_the_list_and_recomputed_when_a_file_changes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _copy_split(tmp_path)
    monkeypatch.setenv("MTLAB_CACHE", str(tmp_path / "elsewhere"))
    seen: list[tuple[int, int]] = []
    first = cached_stats(tmp_path, "clean", "dev", progress=lambda done, total: seen.append((done, total)))
    assert (folder / "mix_clean.stats.json").is_file() and seen[-1] == (len(seen), len(seen))
    reference = load_split(tmp_path, split="dev", linkedset="clean", targets=(), stats=first)
    exact = type(first).from_features([reference[i]["features"] * first.std + first.mean for i in range(len(reference))])
    torch.testing.assert_close(first.mean, exact.mean, rtol=1e-5, atol=1e-5)

    seen.clear()
    again = cached_stats(tmp_path, "clean", "dev", progress=lambda done, total: seen.append((done, total)))
    assert seen == [] and torch.equal(again.mean, first.mean) and again.frames == first.frames

    wav = sorted((folder / "mix_clean").glob("*.wav"))[0]
    data = bytearray(wav.read_bytes())
    data[2000:6000] = bytes(4000)  # 2000 samples silenced: same size, new content and time
    wav.write_bytes(bytes(data))
    changed = cached_stats(tmp_path, "clean", "dev", progress=lambda done, total: seen.append((done, total)))
    assert seen and not torch.equal(changed.mean, first.mean)

    sample = cached_stats(tmp_path, "clean", "dev", stats_utterances=5, progress=False)
    assert sample.frames < changed.frames


def test_a_read_only_corpus_caches_its_statistics_elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _copy_split(tmp_path)
    monkeypatch.setenv("MTLAB_CACHE", str(tmp_path / "cache"))
    folder.chmod(0o555)
    try:
        cached_stats(tmp_path, "clean", "dev", progress=False)
        if (folder / "mix_clean.stats.json").exists():
            pytest.skip("running as a user who can write to a read-only folder (root)")
        assert len(list((tmp_path / "cache" / "stats").glob("*.json"))) == 1
    finally:
        folder.chmod(0o755)


@pytest.mark.slow  # starts DataLoader worker processes
def test_workers_give_the_same_batches_and_leave_the_global_rng_alone() -> None:
    streamed = load_split(split="dev", linkedset="noisy", stream=True)
    a, b = BatchStream(streamed, 4, 3, seed=2), BatchStream(streamed, 4, 3, seed=2, num_workers=2)
    torch.manual_seed(0)
    state = torch.random.get_rng_state()
    for _ in range(len(a) + 2):  # into the next epoch: new workers
        assert_same_batch(next(a), next(b))
    assert torch.equal(torch.random.get_rng_state(), state)


@pytest.mark.slow  # starts DataLoader worker processes
def test_resume_is_exact_through_a_worker_restart(tmp_path: Path) -> None:
    from helpers.recipes import make_tiny_corpus, write_tiny_recipe

    from mtlab.training.loop import run
    from mtlab.apps.recipe import from_recipe, load

    corpus = make_tiny_corpus(tmp_path / "corpus")
    path = write_tiny_recipe(tmp_path / "tiny.toml", corpus, num_steps=8, valid_frequency=100)
    text = path.read_text().replace('split = "train", linkedset = "clean" }',
                                    'split = "train", linkedset = "clean", num_workers = 2 }')
    assert "num_workers" in text
    path.write_text(text)
    full = from_recipe(path)
    assert full.trainer.tasks["spk"].linkedsets["clean"].num_workers == 2
    run(full, progress=False)
    half = from_recipe(path)
    run(half, steps=3, progress=False, expdir=tmp_path / "exp")
    resumed = load(tmp_path / "exp" / "final.pt")  # new process state, new workers, mid-epoch
    run(resumed, progress=False)
    assert resumed.trainer.step_count == full.trainer.step_count == 8
    assert all(torch.equal(p, full.trainer.params[k]) for k, p in resumed.trainer.params.items())
    assert resumed.trainer.history.equals(full.trainer.history)


def test_the_manifest_joins_lists_like_the_in_memory_path(tmp_path: Path) -> None:
    from helpers.corpora import make_corpus

    from mtlab.data import DataError, DataWarning

    folder = make_corpus(tmp_path, ["a", "b", "c", "d"])
    (folder / "s2.scp").write_text("d s2/d.wav\na s2/a.wav\nb s2/b.wav\nzz s2/b.wav\n")
    with pytest.warns(DataWarning, match="kept 3 utterances, dropped 2"):
        streamed = load_split(tmp_path, stream=True, progress=False)
    with pytest.warns(DataWarning):
        memory = load_split(tmp_path)
    assert streamed.names == memory.names == ["a", "b", "d"]
    assert streamed.report.dropped == memory.report.dropped
    assert streamed.row(2).sources[1].where == f"{folder / 's2.scp'}:1"  # d's line in s2.scp
    assert_same_batch(next(BatchStream(memory, 3, 1, seed=0)), next(BatchStream(streamed, 3, 1, seed=0)))
    (folder / "s1.scp").write_text("a s1/a.wav\nb s1/b.wav\n\na s1/c.wav\n")
    with pytest.raises(DataError, match=r"s1.scp:4: name 'a' repeats line 1"):
        load_split(tmp_path, stream=True, progress=False)


def test_header_lengths_are_cached_and_a_file_changed_since_is_named(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import mtlab.data.streamed as streamed_module
    from helpers.corpora import make_corpus

    from mtlab.data import DataError, DataWarning

    folder = make_corpus(tmp_path, ["a", "b", "c"], [1000, 1500, 2000])
    first = load_split(tmp_path, stream=True, progress=False)
    assert (folder / "mix_clean.samples.npz").is_file()

    def no_headers(*args: Any, **kwargs: Any) -> int:
        raise AssertionError("the cached lengths should have been used")

    monkeypatch.setattr(streamed_module, "wav_samples", no_headers)
    again = load_split(tmp_path, stream=True, progress=False)
    assert list(again.samples) == list(first.samples) == [1000, 1500, 2000]
    write_wav(folder / "mix_clean" / "b.wav", np.zeros(1200, dtype=np.int64))  # replaced after the cache was written
    with pytest.raises(DataError, match=r"b.wav \(listed at .*mix_clean.scp:2\) has 1200 samples but had 1500"):
        again.audio(1)
    (folder / "mix_clean.scp").write_text("a mix_clean/a.wav\nb mix_clean/b.wav\n")  # a new list: headers read again
    with pytest.raises(AssertionError, match="cached lengths"), pytest.warns(DataWarning, match="kept 2 utterances"):
        load_split(tmp_path, stream=True, progress=False)


def test_the_sample_corpus_gets_no_cache_files_beside_its_lists(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Caches of mtlab's own sample corpus go to the user cache folder: a test run leaves the checkout clean."""
    from mtlab.data.corpus import data_samples_dir
    from mtlab.data.statcache import cache_paths

    monkeypatch.setenv("MTLAB_CACHE", str(tmp_path / "cache"))
    listed = data_samples_dir() / "train" / "mix_clean.scp"
    assert cache_paths(listed, "d") == [tmp_path / "cache" / "stats" / "d.json"]
    own = tmp_path / "corpus" / "mix_clean.scp"
    assert cache_paths(own, "d")[0] == own.with_suffix(".stats.json")
