"""Recipes with i-vector inputs: the original's matrix2vector_processor as mtlab's ``ivec`` data, Concat's
``expand_dim_to_first_input``, the input sizes the importer infers, and one such recipe trained a step."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.nabu_ivectors import write_ivec_recipe

import mtlab
from mtlab.data import DataError, VectorList, load_vectors
from mtlab.models import Concat
from mtlab.nabu import import_nabu, make_sample_root, plain_recipe
from mtlab.nabu.samples import speaker_vector

pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------- the original's processor, written out
def original_vectors(list_file: Path, nrcol: int, nrs: int) -> dict[str, np.ndarray]:
    """matrix2vector_processor.__call__ and pre_loop, with mvn_type = global, in numpy."""
    raw = {}
    for line in list_file.read_text().splitlines():
        split = line.strip().split(" ")
        matrix = (list_file.parent / split[-1]).read_text().strip().split(",")
        vector = np.zeros(nrs * nrcol)
        for ind, row in enumerate(matrix):
            vector[ind * nrcol:(ind + 1) * nrcol] = list(map(float, row.strip().split(" ")))
        raw[split[0]] = vector
    mean = sum(raw.values()) / len(raw)
    std = np.sqrt(sum(np.square(v - mean) for v in raw.values()) / len(raw))
    return {name: (v - mean) / std for name, v in raw.items()}


def write_vector_list(folder: Path, rows: dict[str, list[list[float]]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for name, matrix in rows.items():
        (folder / f"{name}.txt").write_text(",".join(" ".join(str(x) for x in r) for r in matrix) + "\n")
        lines.append(f"{name} /corpus/{name}.wav {name}.txt\n")
    (folder / "ivecs.txt").write_text("".join(lines))
    return folder / "ivecs.txt"


def test_vectors_are_the_rows_end_to_end_normalized_as_the_original(tmp_path: Path) -> None:
    gen = np.random.default_rng(0)
    rows = {f"u{i}": gen.normal(size=(2, 3)).round(4).tolist() for i in range(5)}
    listing = write_vector_list(tmp_path, rows)
    plain = load_vectors(VectorList(str(listing), nrcol=3, nrs=2))
    assert plain["u1"].shape == (6,) and plain["u1"].dtype == torch.float32
    np.testing.assert_allclose(plain["u1"].numpy(), np.concatenate(rows["u1"]), rtol=1e-6)
    normalized = load_vectors(VectorList(str(listing), nrcol=3, nrs=2, mvn="global"))
    expected = original_vectors(listing, 3, 2)
    for name in rows:
        np.testing.assert_allclose(normalized[name].numpy(), expected[name], rtol=1e-5, atol=1e-6)
    # another list normalized with the first one's mean and variance (the original's meanandvar_dir)
    other = write_vector_list(tmp_path / "dev", {"d0": rows["u3"]})
    dev = load_vectors(VectorList(str(other), nrcol=3, nrs=2, mvn="global", stats_list=str(listing)))
    np.testing.assert_allclose(dev["d0"].numpy(), expected["u3"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("text, message", [
    ("1 2 3,4 5 6,7 8 9", "3 comma-separated rows, but the processor's nrs = 2"),
    ("1 2 3,4 5", "row 2 has 2 numbers, but the processor's nrcol = 3"),
    ("1 2 x,4 5 6", "row 1 is not all numbers"),
])
def test_a_bad_matrix_file_is_an_error_naming_it_and_the_fix(tmp_path: Path, text: str, message: str) -> None:
    listing = write_vector_list(tmp_path, {"u0": [[1, 2, 3], [4, 5, 6]]})
    (tmp_path / "u0.txt").write_text(text)
    with pytest.raises(DataError, match=message) as err:
        load_vectors(VectorList(str(listing), nrcol=3, nrs=2))
    assert str(tmp_path / "u0.txt") in str(err.value) and f"{listing}:1" in str(err.value)
    (tmp_path / "u0.txt").unlink()
    with pytest.raises(DataError, match="matrix file not found"):
        load_vectors(VectorList(str(listing), nrcol=3, nrs=2))
    with pytest.raises(DataError, match="mvn='local'"):
        VectorList(str(listing), nrcol=3, mvn="local")


# ---------------------------------------------------------------- Concat with expansion
def test_concat_repeats_a_vector_over_the_frames_of_the_first_input() -> None:
    torch.manual_seed(0)
    feats, vec = torch.randn(3, 7, 5), torch.randn(3, 4)
    lengths = torch.tensor([7, 4, 1])
    feats = feats * (torch.arange(7)[None, :, None] < lengths[:, None, None])  # zero-padded, as batches are
    cat = Concat(expand=[False, True])
    out = cat(feats, vec, seq_lengths=lengths)
    assert out.shape == (3, 7, 9)
    for b, n in enumerate(lengths.tolist()):
        expected = torch.cat([feats[b, :n], vec[b].repeat(n, 1)], dim=-1)  # plain PyTorch: repeat + cat
        torch.testing.assert_close(out[b, :n], expected, rtol=0, atol=0)
        assert not out[b, n:].any()  # padded frames stay zero
    with pytest.raises(mtlab.MtlabError, match="expanded input must be \\[B, D\\]"):
        cat(feats, feats)
    with pytest.raises(mtlab.ConfigError, match="2 entries for 3 inputs"):
        cat(feats, vec, vec)
    with pytest.raises(mtlab.ConfigError, match="first input cannot be expanded"):
        Concat(expand=[True, False])


def test_concat_noise_is_training_only_and_one_draw_per_utterance_for_a_vector() -> None:
    torch.manual_seed(1)
    feats, vec = torch.randn(2, 6, 3), torch.randn(2, 4)
    cat = Concat(expand=[False, True], input_noise=[0.2, 0.2])
    cat.eval()
    torch.testing.assert_close(cat(feats, vec), Concat(expand=[False, True])(feats, vec))
    cat.train()
    out = cat(feats, vec)
    noisy_vec = out[..., 3:]
    assert not torch.allclose(noisy_vec[:, 0], vec)
    torch.testing.assert_close(noisy_vec, noisy_vec[:, :1].expand_as(noisy_vec))  # the same over the frames
    assert not torch.allclose(out[..., :3], feats)


def test_a_segment_keeps_the_whole_vector_even_when_it_is_as_long_as_the_utterance() -> None:
    from mtlab.data.corpus import SEQUENCE_KEYS
    from mtlab.tasks.sources import HeadExamples, SegmentedExamples

    class Source(list):  # a mtlab.tasks.sources.DataSource
        lengths = [4]
        sequence_keys = tuple(k for k in SEQUENCE_KEYS if k == "features")
        shard_of = None

    source = Source([{"features": torch.randn(4, 3), "ivec": torch.arange(4.0)}])
    for view in (source, HeadExamples(source, 1)):
        segments = SegmentedExamples(view, 2)
        assert [s["features"].shape[0] for s in (segments[0], segments[1])] == [2, 2]
        torch.testing.assert_close(segments[1]["ivec"], torch.arange(4.0))


def replace_in(folder: Path, file: str, old: str, new: str) -> None:
    text = (folder / file).read_text()
    assert old in text, (file, old)
    (folder / file).write_text(text.replace(old, new, 1))


def test_the_importer_infers_the_input_sizes_from_the_ivector_dimension(tmp_path: Path) -> None:
    r = import_nabu(write_ivec_recipe(tmp_path / "MERL_IVEC"), data_root=tmp_path / "data")
    assert r["models"]["main"]["input_dim"] == 129 + 2 * 5  # features, then the two speakers' 5-dim i-vectors
    assert r["models"]["outlayer"]["input_dim"] == 12
    assert r["models"]["concat"] == {"type": "Concat", "expand": [False, True], "input_noise": [0.2, 0.2]}
    task = r["tasks"]["task_2spk"]
    assert task["inputs"] == ["features", "ivec"]
    data, valid = task["linkedsets"]["set0"]["data"], task["linkedsets"]["set0"]["valid"]
    train_list = str(tmp_path / "data" / "tr" / "utt_ivec5info.txt")
    assert data["ivec"] == {"list": train_list, "nrcol": 5, "nrs": 2, "mvn": "global"}
    assert valid["ivec"] == {"list": str(tmp_path / "data" / "cv" / "utt_ivec5info.txt"), "nrcol": 5, "nrs": 2,
                             "mvn": "global", "stats_list": train_list}
    # the written TOML recipe keeps the vector settings; a task reading 'ivec' needs them in its data
    from mtlab.nabu import write_toml
    from mtlab.apps.recipe import load_recipe, resolve_recipe

    write_toml(r, tmp_path / "r.toml")
    assert load_recipe(tmp_path / "r.toml")["tasks"]["task_2spk"]["linkedsets"]["set0"]["valid"]["ivec"] == \
        valid["ivec"]
    del data["ivec"]
    with pytest.raises(mtlab.ConfigError, match="\\[tasks.task_2spk.linkedsets.set0\\] data needs ivec = "):
        resolve_recipe(plain_recipe(r))
    data["ivec"] = {"list": "x.txt", "nrcol": 5, "mvn": "local"}
    with pytest.raises(mtlab.ConfigError, match="data ivec: VectorList mvn='local'; valid: \\['global', 'none'\\]"):
        resolve_recipe(plain_recipe(r))
    replace_in(tmp_path / "MERL_IVEC", "ivec_processor.cfg", "nrcol = 5", "nrcol = 40")
    assert import_nabu(tmp_path / "MERL_IVEC")["models"]["main"]["input_dim"] == 129 + 80


def test_ivectors_in_another_folder_than_the_audio_are_read_from_their_own_list(tmp_path: Path) -> None:
    folder = write_ivec_recipe(tmp_path / "MERL_ESTIVEC", ivec_root="/esat/exp/IvectorExtractor")
    r = import_nabu(folder, data_root=tmp_path / "data")
    data = r["tasks"]["task_2spk"]["linkedsets"]["set0"]["data"]
    assert data["split"] == "tr" and data["ivec"]["list"].endswith("exp/IvectorExtractor/tr/utt_ivec5info.txt")


@pytest.mark.parametrize("file, old, new, message", [
    ("ivec_processor.cfg", "mvn_type = global", "mvn_type = local",
     "ivec_processor.cfg: \\[processor\\] mvn_type = 'local': matrix2vector_processor knows global or None"),
    ("ivec_processor.cfg", "nrcol = 5\n", "", "ivec_processor.cfg: \\[processor\\] needs 'nrcol'"),
    ("ivec_processor.cfg", "nrcol = 5", "nrcol = five", "\\[processor\\] nrcol = 'five' must be an integer"),
    ("model.cfg", "expand_dim_to_first_input = False True", "expand_dim_to_first_input = True False",
     "\\[concat\\] expand_dim_to_first_input: the first input cannot be expanded"),
    ("model.cfg", "input_noise = 0.2 0.2", "input_noise = 0.2", "\\[concat\\] input_noise = '0.2': give one value"),
])
def test_bad_ivector_settings_are_errors_naming_file_key_and_fix(tmp_path: Path, file: str, old: str, new: str,
                                                                message: str) -> None:
    folder = write_ivec_recipe(tmp_path / "MERL_IVEC")
    replace_in(folder, file, old, new)
    with pytest.raises(mtlab.ConfigError, match=message) as err:
        import_nabu(folder)
    assert str(folder) in str(err.value)


@pytest.mark.parametrize("flags, message", [("False False", "input 2 is one vector per utterance: it must be expanded"),
                                            ("False", "give one value per input")])
def test_a_vector_joined_without_expansion_is_refused(tmp_path: Path, flags: str, message: str) -> None:
    folder = write_ivec_recipe(tmp_path / "MERL_IVEC")
    replace_in(folder, "model.cfg", "expand_dim_to_first_input = False True", f"expand_dim_to_first_input = {flags}")
    with pytest.raises(mtlab.ConfigError, match=message):
        import_nabu(folder)


def test_expanding_a_per_frame_input_is_refused(tmp_path: Path) -> None:
    folder = write_ivec_recipe(tmp_path / "MERL_IVEC")
    replace_in(folder, "trainer.cfg", "n0_inputs = features ivecs", "n0_inputs = features features")
    with pytest.raises(mtlab.ConfigError, match="input 2 is per-frame: only a per-utterance vector"):
        import_nabu(folder)


def test_an_ivector_recipe_trains_a_step_on_sample_data_with_fixed_speaker_vectors(tmp_path: Path) -> None:
    folder = write_ivec_recipe(tmp_path / "MERL_IVEC")
    r = import_nabu(folder, data_root=tmp_path / "data")
    made = make_sample_root(r, limit=6)
    listing = tmp_path / "data" / "tr" / "utt_ivec5info.txt"
    assert listing in made and (tmp_path / "data" / "cv" / "utt_ivec5info.txt") in made
    # the original's format: name audio matrixfile; one comma-separated row per speaker, fixed per speaker
    expected = original_vectors(listing, 5, 2)
    speakers = {line.split()[0]: [int(x) for x in line.split()[1:]]
                for line in (tmp_path / "data" / "tr" / "spk.txt").read_text().splitlines()}
    first = listing.read_text().split()
    assert Path(first[1]).is_file() and Path(first[2]).is_absolute()  # the original opens them from its cwd
    rows = (listing.parent / first[2]).read_text().strip().split(",")
    np.testing.assert_allclose([float(x) for x in rows[1].split()], speaker_vector(speakers[first[0]][1], 5),
                               atol=1e-6)
    exp = mtlab.from_recipe(plain_recipe(r))
    train = next(d for d in exp.datasets.values() if d.split == "tr")
    for i, name in enumerate(train.names):
        np.testing.assert_allclose(train[i]["ivec"].numpy(), expected[name], rtol=1e-4, atol=1e-5)
    valid = next(d for d in exp.datasets.values() if d.split == "cv")
    assert valid[0]["ivec"].shape == (10,)
    trainer = exp.trainer
    before = {k: p.detach().clone() for k, p in trainer.models["main"].named_parameters()}
    trainer.step()
    assert any(not torch.equal(before[k], p) for k, p in trainer.models["main"].named_parameters())


def test_a_constant_generator_stands_in_for_the_ivector(tmp_path: Path) -> None:
    """The joint recipes feed utterances without i-vectors a constant (zero) vector of the same size."""
    folder = write_ivec_recipe(tmp_path / "MERL_IVEC")
    replace_in(folder, "trainer.cfg", "nodes = n0 n1 bin_emb", "nodes = zero n0 n1 bin_emb\nzero_model = zeros\n"
                                                                "zero_inputs = features")
    replace_in(folder, "trainer.cfg", "n0_inputs = features ivecs", "n0_inputs = features zero")
    replace_in(folder, "model.cfg", "model_names = main outlayer concat", "model_names = main outlayer concat zeros")
    zeros = ("\n[zeros]\narchitecture = constant_generator\nconstant_value = -1.0\ntensor_shape = 10\n"
             "include_batch_size = True\noutput_noise = 0.0\n")
    (folder / "model.cfg").write_text((folder / "model.cfg").read_text() + zeros)
    r = import_nabu(folder)
    assert r["models"]["zeros"] == {"type": "Constant", "shape": [10], "value": -1.0, "output_noise": 0.0}
    assert r["models"]["main"]["input_dim"] == 129 + 10
    const = mtlab.models.build_model("Constant", shape=[10], value=-1.0, output_noise=0.5)
    x = torch.randn(3, 7, 129)
    const.eval()
    torch.testing.assert_close(const(x), torch.full((3, 10), -1.0))
    const.train()
    assert not torch.equal(const(x), torch.full((3, 10), -1.0))
    replace_in(folder, "model.cfg", "tensor_shape = 10", "tensor_shape = 2,5")
    with pytest.raises(mtlab.ConfigError, match="\\[zeros\\] tensor_shape: '2,5': mtlab's Constant gives one vector"):
        import_nabu(folder)


# ---------------------------------------------------------------- mvn_type = local
def test_local_mvn_is_the_originals_per_utterance_formula(tmp_path: Path) -> None:
    from mtlab.data import load_split, log_magnitude, magnitude, read_wav
    from mtlab.data.features import ORIGINAL

    data = load_split(split="dev", targets=(), spectral=ORIGINAL, mvn="local")
    name = data.names[0]
    from mtlab.data import data_samples_dir

    feats = log_magnitude(magnitude(read_wav(data_samples_dir() / "dev" / "mix_clean" / f"{name}.wav"),
                                    ORIGINAL)).double().numpy()
    expected = (feats - np.mean(feats, 0)) / (np.std(feats, 0) + 1e-12)  # audio_feat_processor, mvn_type = local
    np.testing.assert_allclose(data[0]["features"].numpy(), expected, rtol=1e-4, atol=1e-4)
    with pytest.raises(DataError, match="mvn='utterance'; valid: \\['global', 'local', 'none'\\]"):
        load_split(split="dev", targets=(), mvn="utterance")


def test_a_local_mvn_recipe_imports_and_its_features_are_normalized_per_utterance(tmp_path: Path) -> None:
    folder = write_ivec_recipe(tmp_path / "MERL_IVEC")
    replace_in(folder, "feature_processor.cfg", "mvn_type = global", "mvn_type = local")
    r = import_nabu(folder, data_root=tmp_path / "data")
    assert r["tasks"]["task_2spk"]["linkedsets"]["set0"]["data"]["mvn"] == "local"
    make_sample_root(r, limit=3)
    exp = mtlab.from_recipe(plain_recipe(r))
    for split in ("tr", "cv"):
        ds = next(d for d in exp.datasets.values() if d.split == split)
        feats = ds[0]["features"]
        torch.testing.assert_close(feats.mean(0), torch.zeros(129), atol=1e-4, rtol=0)
        torch.testing.assert_close(feats.std(0, unbiased=False), torch.ones(129), atol=1e-3, rtol=0)
    replace_in(folder, "feature_processor.cfg", "mvn_type = local", "mvn_type = from_files")
    with pytest.raises(mtlab.ConfigError, match="feature_processor.cfg: \\[processor\\] mvn_type: 'from_files'"):
        import_nabu(folder)
