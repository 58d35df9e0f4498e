"""load_split on the shipped sample data and on small bad corpora."""
from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.corpora import write_wav

import mtlab.data as md
from mtlab.data import DataError, DataWarning, FeatureStats, compute_stats, load_split


@pytest.fixture(scope="module")
def train() -> md.SeparationDataset:
    return load_split(split="train", linkedset="clean")


@pytest.mark.slow
def test_example_keys_shapes_and_dtypes(train: md.SeparationDataset) -> None:
    ex = train[0]
    t = ex["features"].shape[0]
    assert train.lengths[0] == t and len(train.lengths) == len(train.names) == len(train) == 120
    expected = {
        "features": ((t, 129), torch.float32),
        "mix_mag": ((t, 129), torch.float32),
        "src_mag": ((t, 129, 2), torch.float32),
        "binary_targets": ((t, 258), torch.float32),
        "usedbins": ((t, 129), torch.bool),
        "frame_target": ((t,), torch.long),
        "spk": ((), torch.long),
        "spk_pair": ((2,), torch.long),
    }
    assert {k: (tuple(v.shape), v.dtype) for k, v in ex.items()} == expected
    assert train.num_speakers == 10 and int(ex["spk"]) == int(ex["spk_pair"][0])
    assert train.report.num_dropped == 0


@pytest.mark.slow
def test_targets_consistent_with_sources(train: md.SeparationDataset) -> None:
    root = md.data_samples_dir() / "train"
    name = train.names[3]
    ex = train[3]
    wavs = {s: md.read_wav(root / s / f"{name}.wav") for s in ("mix_clean", "s1", "s2")}
    torch.testing.assert_close(wavs["mix_clean"], wavs["s1"] + wavs["s2"], rtol=0, atol=1e-6)
    src = torch.stack([md.magnitude(wavs["s1"]), md.magnitude(wavs["s2"])], dim=-1)
    torch.testing.assert_close(ex["src_mag"], src)
    torch.testing.assert_close(ex["mix_mag"], md.magnitude(wavs["mix_clean"]))
    dom = ex["binary_targets"].reshape(-1, 129, 2)
    assert torch.equal(dom[..., 0].bool(), src[..., 0] >= src[..., 1])
    assert torch.equal(dom.sum(-1), torch.ones_like(dom[..., 0]))
    level = 20 * ex["mix_mag"].clamp_min(1e-6).log10()
    assert torch.equal(ex["usedbins"], level > level.max() - 40.0)
    assert 0.05 < ex["usedbins"].float().mean() < 0.95
    assert set(ex["frame_target"].unique().tolist()) <= {0, 1, 2}
    spk = (root / "spk.txt").read_text().splitlines()[3].split()
    assert spk[0] == name and ex["spk_pair"].tolist() == [int(spk[1]), int(spk[2])]


@pytest.mark.slow
def test_stats_come_from_train_only(train: md.SeparationDataset, tmp_path: Path) -> None:
    raw = [md.log_magnitude(e["mix_mag"]) for e in train.examples]
    direct = FeatureStats.from_features(raw)
    torch.testing.assert_close(train.stats.mean, direct.mean)
    assert train.stats.frames == sum(train.lengths) and train.stats.source == "train/mix_clean.scp"
    dev = load_split(split="dev", linkedset="clean", targets=("mix_mag",))
    assert dev.stats.source == "train/mix_clean.scp" and torch.equal(dev.stats.mean, train.stats.mean)
    torch.testing.assert_close(dev[0]["features"], train.stats.normalize(md.log_magnitude(dev[0]["mix_mag"])))
    assert not torch.allclose(compute_stats(split="dev").mean, train.stats.mean)
    train.stats.save(tmp_path / "s.json")
    again = load_split(split="dev", targets=(), stats=FeatureStats.load(tmp_path / "s.json"))
    assert torch.equal(again[0]["features"], dev[0]["features"])


@pytest.mark.slow
def test_linked_sets_share_names_and_source_targets(train: md.SeparationDataset) -> None:
    noisy = load_split(split="train", linkedset="noisy", targets=("binary_targets", "usedbins"))
    assert noisy.names == train.names and noisy.lengths == train.lengths
    assert torch.equal(noisy[5]["binary_targets"], train[5]["binary_targets"])
    assert noisy[5]["usedbins"].float().mean() > train[5]["usedbins"].float().mean()
    assert md.linked_sets(split="dev") == ["clean", "noisy"]


def test_env_var_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(md.ENV_VAR, str(tmp_path))
    assert md.data_samples_dir() == tmp_path
    monkeypatch.setenv(md.ENV_VAR, str(tmp_path / "nope"))
    with pytest.raises(DataError, match="MTLAB_DATA"):
        md.data_samples_dir()


def test_small_corpus_loads(corpus: Callable[..., Path]) -> None:
    folder = corpus()
    ds = load_split(folder.parent, "train")
    assert ds.names == ["a", "b", "c"] and ds.lengths == [md.num_frames(n) for n in (1000, 1137, 1274)]


def test_join_drops_are_reported(corpus: Callable[..., Path]) -> None:
    folder = corpus()
    (folder / "s2.scp").write_text("a s2/a.wav\nc s2/c.wav\n")
    with pytest.warns(DataWarning, match=r"dropped 1 .*1 missing from s2\.scp"):
        ds = load_split(folder.parent, "train")
    assert ds.names == ["a", "c"] and ds.report.missing["s2.scp"] == ("b",)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_split(folder.parent, "train", targets=("spk",)).names == ["a", "b", "c"]


def test_names_matching_nothing(corpus: Callable[..., Path]) -> None:
    folder = corpus()
    (folder / "spk.txt").write_text("x 0 1\ny 1 2\n")
    with pytest.raises(DataError, match=r"no utterance name is in all of: mix_clean\.scp.*spk\.txt"):
        load_split(folder.parent, "train")


def test_empty_and_unknown_linked_set(corpus: Callable[..., Path]) -> None:
    folder = corpus()
    (folder / "mix_noisy.scp").write_text("\n")
    with pytest.raises(DataError, match=r"mix_noisy\.scp: linked set 'noisy' is empty"):
        load_split(folder.parent, "train", linkedset="noisy")
    with pytest.raises(DataError, match=r"mix_reverb\.scp: no list for linked set 'reverb'; available: \['clean'"):
        load_split(folder.parent, "train", linkedset="reverb")
    with pytest.raises(DataError, match=r"dev: split folder not found"):
        load_split(folder.parent, "dev")


def test_missing_audio_names_list_line(corpus: Callable[..., Path]) -> None:
    folder = corpus()
    (folder / "s1" / "b.wav").unlink()
    with pytest.raises(DataError, match=r"s1/b\.wav \(listed at .*s1\.scp:2\): audio file not found"):
        load_split(folder.parent, "train")


def test_wrong_rate_names_list_line(corpus: Callable[..., Path]) -> None:
    folder = corpus()
    write_wav(folder / "mix_clean" / "c.wav", np.zeros(1274), rate=16000)
    with pytest.raises(DataError, match=r"mix_clean/c\.wav \(listed at .*mix_clean\.scp:3\): sample rate 16000"):
        load_split(folder.parent, "train")


def test_bad_list_line(corpus: Callable[..., Path]) -> None:
    folder = corpus()
    (folder / "spk.txt").write_text("a 0 1\nb 1\nc 2 0\n")
    with pytest.raises(DataError, match=r"spk\.txt:2: expected 2 integer fields"):
        load_split(folder.parent, "train")
    (folder / "s1.scp").write_text("a s1/a.wav\nb\n")
    with pytest.raises(DataError, match=r"s1\.scp:2: expected 'name value'"):
        load_split(folder.parent, "train")


def test_utterance_shorter_than_one_window(corpus: Callable[..., Path]) -> None:
    folder = corpus(lengths=[1000, 255, 1000])
    with pytest.raises(DataError, match=r"mix_clean/b\.wav \(listed at .*mix_clean\.scp:2\): 255 samples is shorter"):
        load_split(folder.parent, "train")


def test_source_length_mismatch(corpus: Callable[..., Path]) -> None:
    folder = corpus()
    write_wav(folder / "s2" / "a.wav", np.zeros(1100))
    with pytest.raises(DataError, match=r"s2/a\.wav \(listed at .*s2\.scp:1\) has 1100 samples but its mixture"):
        load_split(folder.parent, "train")


def test_per_frame_length_check() -> None:
    ex = {"features": torch.zeros(10, 129), "frame_target": torch.zeros(9, dtype=torch.long), "spk": torch.tensor(1)}
    with pytest.raises(DataError, match=r"x\.scp:4: 'frame_target' has 9 frames but 'features' has 10"):
        md.check_frame_lengths(ex, where="x.scp:4")


def test_unknown_target_key() -> None:
    with pytest.raises(DataError, match="unknown target keys \\['speaker'\\]; valid keys"):
        load_split(split="dev", targets=("speaker",))
