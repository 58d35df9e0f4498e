"""Mixtures of N speakers (the original's ``nrs`` = N): the loader's source-based targets against the
original's processors written out in numpy, the importer passing ``nrs`` through, three-speaker sample data,
a three-speaker recipe training a step, and the separation losses with three speakers against brute force."""

from __future__ import annotations

import itertools
import math
import wave
from pathlib import Path

import numpy as np
import pytest
import torch

import mtlab
from mtlab.data import DataError, data_samples_dir, load_split, read_wav
from mtlab.data.features import INT16_SCALE, ORIGINAL
from mtlab.nabu import import_nabu, make_sample_root, plain_recipe
from mtlab.separation.losses import PIT, CrossEntropyMulti, DeepAttractorNet, DeepClustering, Direct

pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------- the original's formulas, in numpy
def original_magspec(ints: np.ndarray) -> np.ndarray:
    """The original's magspec of int16 samples (8 kHz, winlen 0.032, winstep 0.008, cosine window, nfft 256):
    sigproc.snip, then framesig, then |rfft|."""
    import scipy.signal

    rate, frame_len, frame_step = 8000, 256, 64
    num = int((len(ints) - 0.032 * rate) / (0.008 * rate))
    sig = ints[: int(round(num * 0.008 * rate + 0.032 * rate))]
    numframes = 1 if len(sig) <= frame_len else 1 + int(math.ceil((1.0 * len(sig) - frame_len) / frame_step))
    padded = np.concatenate((sig, np.zeros((numframes - 1) * frame_step + frame_len - len(sig))))
    idx = np.tile(np.arange(frame_len), (numframes, 1)) + np.tile(np.arange(0, numframes * frame_step, frame_step),
                                                                  (frame_len, 1)).T
    frames = padded[idx] * np.tile(scipy.signal.windows.cosine(frame_len), (numframes, 1))
    return np.abs(np.fft.rfft(frames, frame_len))


def original_onehot_targets(clean_features: np.ndarray, nrs: int) -> np.ndarray:
    """onehotperfeature_target_processor.__call__: [T, F, nrs] magnitudes -> [T, F * nrs] bool."""
    winner = np.argmax(clean_features, axis=2)
    targets = np.empty([clean_features.shape[0], clean_features.shape[1] * nrs], dtype=bool)
    for s_ind, spk_id in enumerate(range(nrs)):
        targets[:, s_ind::nrs] = winner == spk_id
    return targets


def frame_classes(src_mag: np.ndarray, threshold_db: float = 40.0) -> np.ndarray:
    """0 for a frame more than ``threshold_db`` under the loudest frame of any source, else 1 + loudest source."""
    energy = (src_mag.astype(np.float64) ** 2).sum(axis=1)  # [T, S]
    level = 10 * np.log10(np.maximum(energy, 1e-20))
    out = np.zeros(energy.shape[0], dtype=np.int64)
    for t in range(energy.shape[0]):
        if level[t].max() > level.max() - threshold_db:
            out[t] = 1 + int(np.argmax(energy[t]))
    return out


# ---------------------------------------------------------------- a miniature three-speaker tree
def write_wav(path: Path, samples: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(np.asarray(samples).astype("<i2").tobytes())


def make_tree(root: Path, split: str = "train", nrs: int = 3, count: int = 3, seed: int = 0) -> dict[str, list]:
    """``root/split`` with mix_clean.scp, s1..s<nrs>.scp and spk.txt; returns {name: [int16 sources]}."""
    rng = np.random.default_rng(seed)
    folder = root / split
    lines: dict[str, list[str]] = {"mix_clean": [], **{f"s{k}": [] for k in range(1, nrs + 1)}}
    sources = {}
    for i in range(count):
        name = f"{split}_{i:03d}"
        n = 1500 + 211 * i
        # speaker k is loud in the k-th stretch of the utterance and quiet elsewhere: each one dominates some frames
        loud = [np.where(np.arange(n) * nrs // n == k, 3000.0, 300.0) for k in range(nrs)]
        parts = [(rng.standard_normal(n) * loud[k]).astype(np.int64) for k in range(nrs)]
        sources[name] = parts
        for stream, x in (("mix_clean", sum(parts)), *((f"s{k + 1}", p) for k, p in enumerate(parts))):
            write_wav(folder / stream / f"{name}.wav", x)
            lines[stream].append(f"{name} {stream}/{name}.wav")
    for stream, text in lines.items():
        (folder / f"{stream}.scp").write_text("\n".join(text) + "\n")
    (folder / "spk.txt").write_text("".join(f"{name} {' '.join(str((i + k) % 5) for k in range(nrs))}\n"
                                            for i, name in enumerate(sources)))
    return sources


def test_three_source_targets_are_the_original_processors_on_a_miniature_tree(tmp_path: Path) -> None:
    sources = make_tree(tmp_path)
    ds = load_split(tmp_path, split="train", linkedset="clean", spectral=ORIGINAL, num_sources=3)
    assert ds.num_sources == 3 and len(ds) == 3
    for i, name in enumerate(ds.names):
        e = ds[i]
        # multi_target_processor: the magspec of each source, stacked in list order s1, s2, s3
        expected = np.stack([original_magspec(p.astype(np.float64)) for p in sources[name]], axis=2)
        assert e["src_mag"].shape == expected.shape
        np.testing.assert_allclose(e["src_mag"].numpy(), expected, rtol=1e-4, atol=1e-2)
        # onehotperfeature_target_processor with nrs = 3, on those magnitudes
        np.testing.assert_array_equal(e["binary_targets"].numpy().astype(bool),
                                      original_onehot_targets(e["src_mag"].numpy(), 3))
        np.testing.assert_array_equal(e["frame_target"].numpy(), frame_classes(e["src_mag"].numpy()))
        assert set(e["frame_target"].tolist()) == {1, 2, 3}  # the classes reach past a two-speaker range
        # strlabel2index / spk.txt: one id per speaker, s1 first
        assert e["spk_pair"].tolist() == [(i + k) % 5 for k in range(3)] and int(e["spk"]) == i % 5
    # every speaker dominates some bins (the third one too)
    y = torch.cat([ds[i]["binary_targets"] for i in range(len(ds))]).reshape(-1, 129, 3)
    assert (y.sum(dim=(0, 1)) > 0).all()


def test_the_default_still_reads_two_sources_from_the_same_tree(tmp_path: Path) -> None:
    make_tree(tmp_path)
    two = load_split(tmp_path, split="train", linkedset="clean", spectral=ORIGINAL)
    three = load_split(tmp_path, split="train", linkedset="clean", spectral=ORIGINAL, num_sources=3)
    assert two.num_sources == 2 and two[0]["src_mag"].shape[-1] == 2 and two[0]["spk_pair"].shape == (2,)
    torch.testing.assert_close(two[0]["src_mag"], three[0]["src_mag"][..., :2])


def test_missing_third_sources_and_bad_counts_are_errors_naming_the_file(tmp_path: Path) -> None:
    make_tree(tmp_path, nrs=2)
    with pytest.raises(DataError, match="s3.scp"):
        load_split(tmp_path, split="train", targets=("src_mag",), num_sources=3)
    with pytest.raises(DataError, match="spk.txt:1: expected 3 integer fields"):
        load_split(tmp_path, split="train", targets=("spk_pair",), num_sources=3)
    with pytest.raises(DataError, match="num_sources=0"):
        load_split(tmp_path, split="train", num_sources=0)


# ---------------------------------------------------------------- a small recipe in the original's format
PROC = """[processor]
processor = {processor}
feature = {feature}
winlen = 0.032
winstep = 0.008
winfunc = cosine
nfft = 256
preemph = 0.0
include_energy = False
{extra}
"""

TASKS = """[task_dc]
loss_type = deepclustering
inputs = features
outputs = bin_emb
nodes = n0 bin_emb
n0_model = main
n0_inputs = features
bin_emb_model = outlayer
bin_emb_inputs = n0
features = {prefix}spec
targets = binary_targets usedbins
binary_targets = {prefix}targets
usedbins = {prefix}usedbins

[task_pit]
loss_type = pit
inputs = features
outputs = bin_est
nodes = n0 bin_est
n0_model = main
n0_inputs = features
bin_est_model = pitlayer
bin_est_inputs = n0
features = {prefix}spec
targets = multi_targets mix_to_mask
multi_targets = {prefix}multitargets
mix_to_mask = {prefix}mixtomask
"""

TRAINER = """[trainer]
trainer = multi_task
tasks = task_dc task_pit
segment_lengths = full
num_epochs = 1
initial_learning_rate = 1e-3
learning_rate_decay = 1
clip_grad_value = 20000000
normalize_gradients = True
batch_size = 2
numbatches_to_aggregate = 1
numbuckets = 1
valid_frequency = 5
valid_adapt = False
go_back = False
num_tries = 3
reset_tries = True

""" + TASKS.format(prefix="train")

VALID = """[evaluator]
evaluator = task_loss_evaluator
requested_utts = 4
batch_size = 2

""" + TASKS.format(prefix="dev")

MODEL = """[hyper]
model_names = main outlayer pitlayer

[main]
architecture = dblstm
num_units = 4
num_layers = 1
input_noise = 0
dropout = 1.0
recurrent_dropout = 1.0
layer_norm = False

[outlayer]
architecture = linear
output_dims = 129 2
input_noise = 0
dropout = 1.0

[pitlayer]
architecture = linear
output_dims = 387
input_noise = 0
dropout = 1.0
"""

SECTIONS = {"spec": ("mix_wav.scp", "feature"), "targets": ("allS_wav.scp", "target"),
            "usedbins": ("mix_wav.scp", "usedbins"), "multitargets": ("allS_wav.scp", "multitarget"),
            "mixtomask": ("mix_wav.scp", "mixtomask")}


def write_recipe(folder: Path) -> Path:
    """A two-task (deep clustering, PIT) three-speaker recipe as the original's ICASSP2018 ones."""
    folder.mkdir(parents=True)
    db = []
    for split, prefix in (("tr", "train"), ("cv", "dev")):
        for name, (listing, proc) in SECTIONS.items():
            db += [f"[{prefix}{name}]", f"datafiles = /esat/wsjMix/data/3speakers/wav8k/min/{split}/{listing}",
                   f"processor_config = config/recipes/mine/{folder.name}/{proc}_processor.cfg", ""]
    files = {
        "trainer.cfg": TRAINER, "validation_evaluator.cfg": VALID, "model.cfg": MODEL,
        "loss.cfg": "[deepclustering]\nloss_type = deepclustering\n\n[pit]\nloss_type = pit\n",
        "database.conf": "\n".join(db),
        "feature_processor.cfg": PROC.format(processor="audio_feat_processor", feature="logspec", extra=""),
        "target_processor.cfg": PROC.format(processor="onehotperfeature_target_processor", feature="magspec",
                                            extra="nrs = 3"),
        "usedbins_processor.cfg": PROC.format(processor="scorelabelperfeature_processor", feature="magspec",
                                              extra="mag_thres = 100"),
        "multitarget_processor.cfg": PROC.format(processor="multi_target_processor", feature="magspec",
                                                 extra="nrs = 3"),
        "mixtomask_processor.cfg": PROC.format(processor="audio_signal_processor", feature="magspec", extra=""),
    }
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


def replace_in(folder: Path, file: str, old: str, new: str) -> None:
    text = (folder / file).read_text()
    assert old in text
    (folder / file).write_text(text.replace(old, new))


def test_the_importer_passes_nrs_through_as_the_linked_sets_num_sources(tmp_path: Path) -> None:
    r = import_nabu(write_recipe(tmp_path / "MERL_3SPK"), data_root="/data")
    for task in ("task_dc", "task_pit"):
        lset = r["tasks"][task]["linkedsets"]["set0"]
        assert lset["data"]["root"] == "/data" and lset["data"]["split"] == "tr"
        assert lset["data"]["num_sources"] == 3 and lset["valid"] == {"split": "cv"}
    assert r["nabu"]["data"]["traintargets"]["nrs"] == 3


@pytest.mark.parametrize("file, old, new, message", [
    ("target_processor.cfg", "nrs = 3", "nrs = three", "target_processor.cfg: \\[processor\\] nrs = 'three' must be an"),
    ("target_processor.cfg", "nrs = 3", "nrs = 0", "target_processor.cfg: \\[processor\\] nrs = '0': the number of"),
    ("target_processor.cfg", "nrs = 3", "nrs = 3\nspk_select = 2", "target_processor.cfg: \\[processor\\] spk_select"),
    ("multitarget_processor.cfg", "nrs = 3", "nrs = 2",
     "trainer.cfg: \\[task_pit\\] linked set 'set0': its processors give different nrs \\(\\[2, 3\\]\\)"),
])
def test_an_nrs_mtlab_cannot_honour_is_an_error_naming_file_key_and_why(tmp_path: Path, file: str, old: str,
                                                                        new: str, message: str) -> None:
    folder = write_recipe(tmp_path / "MERL_3SPK")
    replace_in(folder, file, old, new)
    if file == "multitarget_processor.cfg":  # the PIT task also reads the nrs = 3 one-hot targets
        replace_in(folder, "trainer.cfg", "targets = multi_targets mix_to_mask\nmulti_targets = trainmultitargets",
                   "targets = multi_targets mix_to_mask binary_targets\nmulti_targets = trainmultitargets\n"
                   "binary_targets = traintargets")
    with pytest.raises(mtlab.ConfigError, match=message):
        import_nabu(folder)


# ---------------------------------------------------------------- sample data and one training step
def test_three_speaker_sample_data_is_each_mixture_plus_another_speaker(tmp_path: Path) -> None:
    r = import_nabu(write_recipe(tmp_path / "MERL_3SPK"), data_root=tmp_path / "data")
    made = make_sample_root(r, limit=4)
    tr = tmp_path / "data" / "tr"
    assert made[:2] == [tr, tmp_path / "data" / "cv"]
    samples = data_samples_dir() / "train"
    spk = {ln.split()[0]: [int(x) for x in ln.split()[1:]] for ln in (tr / "spk.txt").read_text().splitlines()}
    two = {ln.split()[0]: [int(x) for x in ln.split()[1:]] for ln in (samples / "spk.txt").read_text().splitlines()}
    assert len(spk) == 4
    for name, ids in spk.items():
        assert ids[:2] == two[name] and len(set(ids)) == 3  # the third speaker is another one
        mix = read_wav(tr / "mix_clean" / f"{name}.wav").double()
        parts = [read_wav(tr / f"s{k}" / f"{name}.wav").double() for k in (1, 2, 3)]
        torch.testing.assert_close(mix, sum(parts), rtol=0, atol=1e-9)  # the mixture is the sum of its sources
        orig = [read_wav(samples / f"s{k}" / f"{name}.wav").double() for k in (1, 2)]
        scale = float(parts[0].abs().max() / orig[0].abs().max())
        assert 0.5 < scale <= 1.0
        for made_src, orig_src in zip(parts, orig):  # s1, s2 are the samples' (scaled only to keep from clipping)
            torch.testing.assert_close(made_src, orig_src * scale, rtol=0, atol=1.0 / INT16_SCALE)
        assert abs(float(parts[2].pow(2).mean().sqrt() / parts[1].pow(2).mean().sqrt()) - 1) < 1e-2
    before = {p.name: p.read_bytes() for p in sorted((tr / "s3").iterdir())}
    make_sample_root(r, limit=4)  # deterministic: the same bytes again
    assert {p.name: p.read_bytes() for p in sorted((tr / "s3").iterdir())} == before


def test_a_three_speaker_recipe_trains_a_step_on_sample_data(tmp_path: Path) -> None:
    r = import_nabu(write_recipe(tmp_path / "MERL_3SPK"), data_root=tmp_path / "data")
    make_sample_root(r, limit=4)
    exp = mtlab.from_recipe(plain_recipe(r))
    train = next(d for d in exp.datasets.values() if d.split == "tr" and "src_mag" in d[0])
    assert train.num_sources == 3 and train[0]["src_mag"].shape[-1] == 3
    assert train[0]["binary_targets"].shape[-1] == 129 * 3
    trainer = exp.trainer
    before = {k: p.detach().clone() for k, p in trainer.models["pitlayer"].named_parameters()}
    trainer.step()
    assert any(not torch.equal(before[k], p) for k, p in trainer.models["pitlayer"].named_parameters())


# ---------------------------------------------------------------- losses with three speakers, by brute force
def batch3(seed: int = 0, b: int = 2, t: int = 5, f: int = 4, s: int = 3, d: int = 3):
    g = torch.Generator().manual_seed(seed)
    src = torch.rand(b, t, f, s, generator=g, dtype=torch.float64) + 0.05
    mix = src.sum(-1)
    used = torch.rand(b, t, f, generator=g) > 0.2
    y = torch.nn.functional.one_hot(src.argmax(-1), s).to(torch.float64)
    lengths = torch.tensor([t, t - 2])
    return src, mix, used, y, lengths, torch.randn(b, t, f * s, generator=g, dtype=torch.float64), \
        torch.randn(b, t, f * d, generator=g, dtype=torch.float64)


def test_pit_with_three_speakers_is_the_minimum_over_all_six_orders() -> None:
    src, mix, _, _, lengths, logits, _ = batch3()
    b, t, f, s = src.shape
    targets, seq = {"src_mag": src, "mix_mag": mix}, {"src_mag": lengths}
    loss, norm = PIT(output="m", layout="speaker_major")(targets, {"m": logits}, seq)
    direct, _ = Direct(output="m", layout="speaker_major")(targets, {"m": logits}, seq)
    masks = torch.softmax(logits.reshape(b, t, s, f).transpose(2, 3), dim=-1)  # index s * F + f
    expected, identity = 0.0, 0.0
    for i in range(b):
        n = int(lengths[i])
        costs = []
        for perm in itertools.permutations(range(s)):
            costs.append(sum(((masks[i, :n, :, k] * mix[i, :n] - src[i, :n, :, perm[k]]) ** 2).sum()
                             for k in range(s)))
        expected += min(costs)
        identity += costs[0]
    assert len(costs) == 6
    torch.testing.assert_close(loss, torch.as_tensor(expected, dtype=loss.dtype))
    torch.testing.assert_close(direct, torch.as_tensor(identity, dtype=loss.dtype))
    assert float(norm) == int(lengths.sum()) * s * f


def test_deep_clustering_with_three_speakers_is_the_affinity_difference() -> None:
    _, _, used, y, lengths, _, emb = batch3()
    b, t, f, s = y.shape
    loss, norm = DeepClustering(output="v")({"binary_targets": y.reshape(b, t, f * s), "usedbins": used},
                                            {"v": emb}, {"v": lengths})
    expected, expected_norm = 0.0, 0.0
    for i in range(b):
        n = int(lengths[i])
        keep = used[i, :n].reshape(-1)
        v = torch.nn.functional.normalize(emb[i, :n].reshape(n * f, -1), dim=-1)[keep]
        yy = y[i, :n].reshape(n * f, s)[keep]
        expected += ((v @ v.T - yy @ yy.T) ** 2).sum()
        expected_norm += float(keep.sum()) ** 2
    torch.testing.assert_close(loss, torch.as_tensor(expected, dtype=loss.dtype))
    assert float(norm) == expected_norm


def test_deep_attractor_and_speaker_cross_entropy_with_three_speakers() -> None:
    src, mix, used, y, lengths, _, emb = batch3()
    b, t, f, s = src.shape
    loss, _ = DeepAttractorNet(output="v")({"src_mag": src, "mix_mag": mix, "usedbins": used,
                                            "binary_targets": y.reshape(b, t, f * s)}, {"v": emb}, {"v": lengths})
    expected = 0.0
    for i in range(b):
        n = int(lengths[i])
        v = emb[i, :n].reshape(n, f, -1) * used[i, :n, :, None]
        yu = y[i, :n] * used[i, :n, :, None]
        att = torch.stack([(v * yu[..., k:k + 1]).sum((0, 1)) / yu[..., k].sum().clamp_min(1) for k in range(s)])
        masks = torch.softmax(v @ att.T, dim=-1)
        expected += ((masks * mix[i, :n, :, None] - src[i, :n]) ** 2).sum()
    torch.testing.assert_close(loss, torch.as_tensor(expected, dtype=loss.dtype))
    g = torch.Generator().manual_seed(3)
    logits, ids = torch.randn(4, 3, 7, generator=g, dtype=torch.float64), torch.randint(0, 7, (4, 3), generator=g)
    ce, norm = CrossEntropyMulti(output="l", target="ids")({"ids": ids}, {"l": logits}, {})
    logp = torch.log_softmax(logits, -1)
    brute = sum(min(-sum(logp[i, k, ids[i, p[k]]] for k in range(3)) / 3 for p in itertools.permutations(range(3)))
                for i in range(4))
    torch.testing.assert_close(ce, torch.as_tensor(brute, dtype=ce.dtype))
    assert float(norm) == 4
