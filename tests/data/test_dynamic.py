"""Dynamic mixing: new mixtures per example and epoch, reproducible from the seed, sums of their int16 parts,
targets equal to the in-memory feature functions of those parts, exact resume, named errors."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.corpora import write_wav

from mtlab.base.batching import collate
from mtlab.data import features as F
from mtlab.data import load_split
from mtlab.data.dynamic import DynamicMix, MixSettings
from mtlab.data.errors import DataError
from mtlab.tasks.sampling import BatchStream

pytestmark = pytest.mark.usefixtures("one_thread")

TARGETS = ["mix_mag", "src_mag", "binary_targets", "usedbins", "frame_target", "spk_pair"]


@pytest.fixture(scope="module")
def noise_list(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("noise")
    gen = np.random.default_rng(0)
    lines = []
    for k, n in enumerate((3000, 40000)):  # one shorter than every mixture (tiled), one longer (cut)
        write_wav(folder / f"n{k}.wav", gen.normal(0, 3000, n).astype(np.int16))
        lines.append(f"n{k} n{k}.wav")
    (folder / "noise.scp").write_text("\n".join(lines) + "\n")
    return folder / "noise.scp"


def mixing(**settings: object) -> DynamicMix:
    split = load_split(split="train", linkedset="clean", stream=True, targets=TARGETS, progress=False,
                       dynamic_mix=settings)
    assert isinstance(split, DynamicMix)
    return split


def test_same_seed_same_mixtures_another_epoch_or_seed_others() -> None:
    a, b, c = mixing(seed=1), mixing(seed=1), mixing(seed=2)
    for i in (0, 7, 50):
        x, y, z = a.mixture(i, epoch=0), b.mixture(i, epoch=0), c.mixture(i, epoch=0)
        assert np.array_equal(x.mix, y.mix) and np.array_equal(x.sources, y.sources) and x.picks == y.picks
        assert not np.array_equal(x.mix, a.mixture(i, epoch=1).mix)
        assert not np.array_equal(x.mix, z.mix)
    original = load_split(split="train", linkedset="clean", stream=True, targets=TARGETS, progress=False)
    assert not torch.equal(a.audio(3)["mix_wav"], original.audio(3)["mix_wav"])  # a new mixture, not the corpus's


def test_speakers_differ_gains_in_range_and_mixture_is_the_sum(noise_list: Path) -> None:
    dm = mixing(gain_db=[-3, 2], noise=str(noise_list), noise_snr_db=[5, 15], seed=4)
    spk = dm.speaker_ids
    for i in range(0, len(dm), 7):
        m = dm.mixture(i, epoch=3)
        assert len(set(m.speakers)) == dm.num_sources, m.speakers
        assert m.speakers == tuple(int(spk[r, k]) for r, k in m.picks)
        assert m.picks[0][0] == i  # the example's own utterance gives one source: every source is used each epoch
        assert all(-3 <= g <= 2 for g in m.gains_db)
        assert m.mix.dtype == np.int16 and m.mix.shape == (int(dm.samples[i]),)
        total = m.sources.astype(np.int64).sum(axis=1) + m.noise.astype(np.int64)
        assert np.array_equal(m.mix.astype(np.int64), total)  # sample for sample, nothing clipped
        assert np.abs(m.noise).max() > 0
        snr = 10 * np.log10(np.mean(m.sources.sum(axis=1).astype(np.float64) ** 2) / np.mean(m.noise.astype(np.float64) ** 2))
        assert 5 - 0.1 <= snr <= 15 + 0.1
    quiet = mixing(gain_db=[0, 0], seed=4).mixture(5, epoch=0)  # 0 dB: the picked sources' own samples
    row, k = quiet.picks[0]
    own = load_split(split="train", linkedset="clean", stream=True, targets=TARGETS, progress=False).audio(row)
    assert np.array_equal(quiet.sources[:, 0], own["src_wav"][:, k].numpy())  # same length: uncut, in place


def test_targets_equal_the_in_memory_features_of_the_sum(noise_list: Path) -> None:
    dm = mixing(gain_db=[-5, 5], noise=str(noise_list), seed=9)
    stream = BatchStream(dm, 4, numbuckets=2, seed=5)
    next(stream), next(stream)  # epoch 1 below: the epoch reaches the mixtures
    stream.seek(1, 0)
    data, lens = next(stream)
    for b, i in enumerate(stream.epoch_batches()[0]):
        m = dm.mixture(i, epoch=1)
        mix = torch.from_numpy(m.mix).float() / F.INT16_SCALE
        src_mag = torch.stack([F.magnitude(torch.from_numpy(s).float() / F.INT16_SCALE) for s in m.sources.T], -1)
        mix_mag = F.magnitude(mix)
        t = mix_mag.shape[0]
        assert int(lens["features"][b]) == t
        oracle = {"features": dm.stats.normalize(F.log_magnitude(mix_mag)), "mix_mag": mix_mag, "src_mag": src_mag,
                  "usedbins": F.used_bins(mix_mag), "binary_targets": F.binary_targets(src_mag),
                  "frame_target": F.frame_target(src_mag)}
        for key, value in oracle.items():
            got = data[key][b, :t]
            if value.is_floating_point():
                torch.testing.assert_close(got, value, rtol=1e-4, atol=1e-4, msg=key)
            else:
                assert (got != value.to(got.dtype)).float().mean() < 1e-3, key  # a bin at a float tie may differ
        assert data["spk_pair"][b].tolist() == list(m.speakers)


@pytest.mark.slow  # over a second even in-process
@pytest.mark.parametrize("workers", [0, 2])  # 2: DataLoader processes
def test_resume_mid_epoch_is_bit_exact(workers: int) -> None:
    def stream() -> BatchStream:
        return BatchStream(mixing(seed=3), 8, numbuckets=2, seed=1, num_workers=workers)

    whole = stream()
    n = len(whole)
    whole.seek(0, n - 4)  # two batches drawn mid-epoch before the state is taken
    next(whole), next(whole)
    state = whole.state_dict()
    expected = [next(whole) for _ in range(5)]  # crosses into the next epoch
    resumed = stream()
    resumed.load_state_dict(state)
    for a, b in zip(expected, (next(resumed) for _ in range(5))):
        for key in a[0]:
            assert torch.equal(a[0][key], b[0][key]), key
    again = stream()  # epoch 1 reaches the workers too: its batches are epoch 1's mixtures
    again.seek(1, 0)
    got = next(again)
    dm = mixing(seed=3)
    dm.set_epoch(1)
    want = dm.featurize(collate([dm.audio(i) for i in again.epoch_batches()[0]]))
    assert torch.equal(got[0]["features"], want[0]["features"])
    dm.set_epoch(0)
    stale = dm.featurize(collate([dm.audio(i) for i in again.epoch_batches()[0]]))
    assert not torch.equal(got[0]["features"], stale[0]["features"])


def test_bad_settings_name_the_key(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="dynamic_mix gain_db"):
        MixSettings.from_dict({"gain_db": [5, -5]})
    with pytest.raises(DataError, match="dynamic_mix noise_snr_db"):
        MixSettings.from_dict({"noise_snr_db": 10})
    with pytest.raises(DataError, match="unknown key.*'gain'.*valid: gain_db"):
        MixSettings.from_dict({"gain": [0, 1]})
    with pytest.raises(DataError, match="dynamic_mix noise = 'none.scp': no such list"):
        MixSettings.from_dict({"noise": "none.scp"}, tmp_path)
    with pytest.raises(DataError, match="dynamic_mix needs stream=True"):
        load_split(split="train", targets=TARGETS, dynamic_mix={})
