"""Separation models, reconstruction, scoring, k-means masks and the runner."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

import mtlab
from mtlab.base.batching import collate
from mtlab.data import magnitude, read_list, read_wav, data_samples_dir
from mtlab.models import BLSTM, DeepClusteringHead, MaskHead, build_model
from mtlab.separation import (
    apply_masks, best_permutation, build_separator, covered_length, istft, kmeans, kmeans_masks, load_data, score, si_sdr,
    snr, stft,
)


pytestmark = pytest.mark.usefixtures("one_thread")


def dev_waves(index: int = 0, linkedset: str = "clean"):
    folder = data_samples_dir() / "dev"
    name = sorted(read_list(folder / f"mix_{linkedset}.scp"))[index]
    mix = read_wav(read_list(folder / f"mix_{linkedset}.scp")[name].resolve())
    refs = torch.stack([read_wav(read_list(folder / f"s{k}.scp")[name].resolve()) for k in (1, 2)])
    return mix, refs


# ---------------------------------------------------------------- models
def test_blstm_output_does_not_depend_on_padding():
    torch.manual_seed(0)
    m = BLSTM(5, 4, num_layers=2).double().eval()
    xs = [torch.randn(t, 5, dtype=torch.float64) for t in (7, 3, 5)]
    data, lens = collate([{"x": x} for x in xs])
    data["x"][1, 3:] = 100.0  # garbage in the padding
    batched = m(data["x"], lens["x"])
    for i, x in enumerate(xs):
        alone = m(x[None], torch.tensor([x.shape[0]]))
        torch.testing.assert_close(batched[i, : x.shape[0]], alone[0])
        assert (batched[i, x.shape[0]:] == 0).all()


def test_heads_unit_norm_masks_and_registry():
    x = torch.randn(2, 4, 6)
    emb = DeepClusteringHead(6, num_bins=5, emb_dim=3)(x)
    assert emb.shape == (2, 4, 15)
    torch.testing.assert_close(emb.reshape(2, 4, 5, 3).norm(dim=-1), torch.ones(2, 4, 5))
    soft = MaskHead(6, num_bins=5, num_sources=2, activation="softmax")(x).reshape(2, 4, 5, 2)
    torch.testing.assert_close(soft.sum(-1), torch.ones(2, 4, 5))
    sig = MaskHead(6, num_bins=5)(x)
    assert sig.shape == (2, 4, 10) and ((sig > 0) & (sig < 1)).all()
    assert isinstance(build_model("MaskHead", input_dim=6, num_bins=5), MaskHead)
    assert isinstance(build_model("DeepClusteringHead", input_dim=6), DeepClusteringHead)
    with pytest.raises(mtlab.ConfigError, match="valid: \\['sigmoid', 'softmax'\\]"):
        MaskHead(6, activation="relu")


# ---------------------------------------------------------------- reconstruction
def test_stft_matches_features_and_all_ones_mask_reproduces_the_mixture():
    mix, _ = dev_waves(0)
    spec = stft(mix)
    torch.testing.assert_close(spec.abs(), magnitude(mix))
    est = apply_masks(mix, torch.ones(*spec.shape, 2))
    assert est.shape == (2, mix.shape[0])
    inner = slice(256, covered_length(spec.shape[0]) - 256)  # away from the tapered ends
    torch.testing.assert_close(est[0, inner], mix[inner], atol=1e-5, rtol=0)
    torch.testing.assert_close(est[1], est[0])


def test_istft_inverts_stft_on_random_lengths_and_leaves_the_uncovered_tail_zero():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 1000, generator=g, dtype=torch.float64)  # 1000 is not on the hop grid
    spec = stft(x)
    y = istft(spec, length=1000)
    n = covered_length(spec.shape[-2])
    assert n < 1000
    torch.testing.assert_close(y[:, 60:n - 60], x[:, 60:n - 60])  # exact where the envelope is above the floor
    assert (y[:, n:] == 0).all() and (y[:, 0] == 0).all()
    assert y[:, :60].abs().max() <= x[:, :60].abs().max() * 3  # the ends are tapered, never blown up
    with pytest.raises(mtlab.BatchError, match="complex spectra"):
        istft(spec.abs())


def test_ideal_binary_masks_separate_a_dev_mixture():
    mix, refs = dev_waves(1)
    dominant = stft(refs).abs().argmax(0)  # [T, F]
    ibm = torch.nn.functional.one_hot(dominant, 2).float()
    sc = score(apply_masks(mix, ibm), refs, mix)
    assert sc.perm == (0, 1)
    assert float(sc.si_sdri.mean()) > 8.0


# ---------------------------------------------------------------- scoring
def test_si_sdr_invariants():
    g = torch.Generator().manual_seed(2)
    s = torch.randn(4000, generator=g, dtype=torch.float64)
    assert float(si_sdr(s, s)) > 80 and float(snr(s, s)) > 80
    est = s + 0.3 * torch.randn(4000, generator=g, dtype=torch.float64)
    torch.testing.assert_close(si_sdr(3.7 * est, s), si_sdr(est, s))
    torch.testing.assert_close(si_sdr(-0.2 * est, s), si_sdr(est, s))
    assert float(snr(3.7 * est, s)) < float(snr(est, s))
    expected = 10 * torch.log10(s.square().sum() / (s - est).square().sum())
    torch.testing.assert_close(snr(est, s), expected)


def test_best_permutation_and_mixture_baseline():
    g = torch.Generator().manual_seed(3)
    refs = torch.randn(2, 3000, generator=g, dtype=torch.float64)
    est = refs.flip(0) + 0.1 * torch.randn(2, 3000, generator=g, dtype=torch.float64)
    scores, perm = best_permutation(est, refs)
    assert perm == (1, 0) and (scores > 15).all()
    sc = score(est, refs, refs.sum(0))
    torch.testing.assert_close(sc.si_sdri, sc.si_sdr - sc.si_sdr_mix)
    assert (sc.si_sdr_mix.abs() < 3).all() and (sc.si_sdri > 12).all()


# ---------------------------------------------------------------- k-means
def test_kmeans_masks_recover_separable_assignment_up_to_permutation():
    g = torch.Generator().manual_seed(4)
    b, t, f, d = 3, 6, 5, 4
    truth = torch.randint(0, 2, (b, t, f), generator=g)
    centres = torch.nn.functional.normalize(torch.randn(b, 2, d, generator=g), dim=-1) * 3
    emb = centres[torch.arange(b)[:, None, None], truth] + 0.05 * torch.randn(b, t, f, d, generator=g)
    used = torch.rand(b, t, f, generator=g) > 0.2
    lens = torch.tensor([6, 4, 5])
    masks, cents = kmeans_masks(emb.reshape(b, t, f * d), used, lens, num_sources=2, seed=0)
    assert masks.shape == (b, t, f, 2) and cents.shape == (b, 2, d)
    for i in range(b):
        n = int(lens[i])
        got = masks[i, :n].argmax(-1)
        assert torch.equal(got, truth[i, :n]) or torch.equal(got, 1 - truth[i, :n])
        assert (masks[i, n:] == 0).all()
    again, _ = kmeans_masks(emb, used, lens, num_sources=2, seed=0)
    assert torch.equal(again, masks)


def test_kmeans_ignores_unweighted_points():
    pts = torch.tensor([[[0.0], [0.1], [10.0], [10.1], [1000.0]]])
    w = torch.tensor([[1, 1, 1, 1, 0]])
    cents, assign = kmeans(pts, w, k=2, seed=1)
    assert sorted(cents[0, :, 0].tolist()) == pytest.approx([0.05, 10.05])
    assert assign[0, 4] == assign[0, 2]


# ---------------------------------------------------------------- runner
@pytest.fixture(scope="module")
def tiny_separators():
    data = load_data("noisy")
    return {loss: build_separator(loss, "noisy", data=data, hidden=8, layers=1, emb_dim=4, batch_size=4, device="cpu",
                                  remix=50 if loss == "deepattractornet" else 0)
            for loss in ("pit", "deepclustering", "deepattractornet")}


@pytest.mark.slow
def test_runner_trains_evaluates_and_separates(tiny_separators):
    for _loss, sep in tiny_separators.items():
        before = {k: p.detach().clone() for k, p in sep.trainer.params.items()}
        assert sep.step(2) == 2 and sep.trainer.step_count == 2
        assert any(not torch.equal(before[k], p) for k, p in sep.trainer.params.items())
        df = sep.evaluate(limit=2)
        assert len(df) == 2 and np.isfinite(df["si_sdri"]).all()
        out = sep.separate(sep.dev.names[2])
        assert out["sample_rate"] == 8000 and out["name"] == sep.dev.names[2]
        assert out["estimates"].shape == out["references"].shape == (2, out["mixture"].shape[0])
        assert isinstance(out["mixture"], np.ndarray) and np.isfinite(out["estimates"]).all()
        assert sep.trainer.models["blstm"].training  # evaluation restored training mode


@pytest.mark.slow
def test_remixed_set_is_deterministic_and_shaped_like_the_corpus(tiny_separators):
    from mtlab.separation.remix import RemixedSet

    train = tiny_separators["pit"].train
    keys = ("features", "src_mag", "mix_mag", "usedbins", "binary_targets", "spk_pair")
    ds = RemixedSet(train, 6, "noisy", seed=3, keys=keys)
    again = RemixedSet(train, 6, "noisy", seed=3, keys=keys)
    assert len(ds) == len(train) + 6 and ds.lengths[: len(train)] == train.lengths
    for i in range(len(train) - 1, len(ds)):
        ex = ds[i]
        assert tuple(ex) == keys and ex["features"].shape[0] == ds.lengths[i]
        assert all(torch.equal(ex[k], again[i][k]) for k in keys)
        assert ex["spk_pair"][0] != ex["spk_pair"][1]
        torch.testing.assert_close(ex["binary_targets"].sum(-1), torch.full((ds.lengths[i],), 129.0))
    clean = RemixedSet(train, 2, "clean", seed=3, keys=keys)[len(train)]
    assert not torch.equal(clean["mix_mag"], ds[len(train)]["mix_mag"])  # noise added only in 'noisy'
    torch.testing.assert_close(clean["src_mag"], ds[len(train)]["src_mag"])  # same sources
    strict = RemixedSet(train, 2, "noisy", seed=3, keys=keys, usedbins_db=20)[len(train)]
    assert strict["usedbins"].sum() < ds[len(train)]["usedbins"].sum()
    assert (strict["usedbins"] <= ds[len(train)]["usedbins"]).all()


@pytest.mark.slow
def test_audio_players_and_settings_errors(tiny_separators):
    pytest.importorskip("IPython")
    from mtlab.separation import audio_players

    players = audio_players(tiny_separators["pit"].separate(0))
    assert list(players) == ["mixture", "estimate 1", "reference 1", "estimate 2", "reference 2"]
    with pytest.raises(mtlab.ConfigError, match="choose one of"):
        build_separator("kmeans")
    with pytest.raises(mtlab.ConfigError, match="unknown separator settings \\['hiden'\\]"):
        build_separator("pit", hiden=3)
    sep = tiny_separators["pit"]
    with pytest.raises(mtlab.ConfigError, match="pass data=load_data\\('clean'\\)"):
        build_separator("pit", "clean", data=(sep.train, sep.dev))


@pytest.mark.slow
def test_import_separation_pulls_in_no_ui_library():
    code = ("import sys, mtlab.separation; bad = [m for m in ('ipywidgets', 'matplotlib', 'IPython') "
            "if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_separator_trains_on_dynamic_mixtures() -> None:
    from mtlab.data.dynamic import DynamicMix

    sep = build_separator("pit", "clean", hidden=4, layers=1, batch_size=4, device="cpu",
                          dynamic_mix={"gain_db": [-2.5, 2.5]})
    examples = sep.trainer.tasks["separation"].linkedsets["clean"].examples
    assert isinstance(examples, DynamicMix) and examples.settings.gain_db == (-2.5, 2.5)
    assert torch.equal(examples.stats.mean, sep.train.stats.mean)  # normalized as the corpus's mixtures
    before = {k: p.clone() for k, p in sep.trainer.params.items()}
    assert sep.step(1) == 1
    assert any(not torch.equal(before[k], p) for k, p in sep.trainer.params.items())
    assert sep.step(5, max_cpu_seconds=0.0) == 0 and sep.trainer.step_count == 1  # a spent CPU budget: no step
    df = sep.evaluate(limit=1, metrics=("si_sdr",))
    assert {"si_sdr", "si_sdr_mix", "si_sdri"} <= set(df.columns) and "sdri" not in df.columns
