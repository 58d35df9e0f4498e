"""The original's DANet attractor layer (``architecture = attractor``, ``models/attractor.py``): the mean
embedding of each speaker's dominated, used bins, written here in numpy from the original's TensorFlow code."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.paths import NABU_RECIPES

from mtlab.models import build_model

pytestmark = pytest.mark.usefixtures("one_thread")

DANET = NABU_RECIPES / "papers" / \
    "Journal_paper_reset_LSTM_2020" / "MERL_DANet_Drude2018_statereset_2spk"


def original_attractors(data: np.ndarray, labels: np.ndarray, usedbins: np.ndarray, normalization: bool) -> np.ndarray:
    """``Attractor._get_outputs`` with three inputs, op by op: data [B, T, F*D], labels [B, T, F*S], usedbins [B, T, F]
    -> A [B, S, D]."""
    b = data.shape[0]
    feat_dim = usedbins.shape[-1]
    emb_dim = data.shape[-1] // feat_dim
    nrs = labels.shape[-1] // feat_dim
    ubresh = usedbins.astype(np.float64).reshape(b, -1, 1)
    v = data.reshape(b, -1, emb_dim) * ubresh
    y = labels.astype(np.float64).reshape(b, -1, nrs) * ubresh
    numerator = np.matmul(np.transpose(y, (0, 2, 1)), v)  # Y^T V: [B, S, D]
    counts = y.sum(axis=1)
    counts = np.where(counts < 1, 1.0, counts)[..., None]
    a = numerator / np.tile(counts, (1, 1, emb_dim))
    if normalization:  # tf.nn.l2_normalize(A, axis=-1, epsilon=1e-12)
        a = a / np.sqrt(np.maximum((a ** 2).sum(axis=-1, keepdims=True), 1e-12))
    return a


@pytest.mark.parametrize("normalization", [False, True])
def test_attractors_are_the_originals(normalization: bool) -> None:
    rng = np.random.default_rng(3)
    b, t, f, d, s = 3, 7, 5, 4, 2
    data = rng.normal(size=(b, t, f * d))
    winner = rng.integers(0, s, size=(b, t, f))
    labels = np.zeros((b, t, f, s), dtype=bool)
    np.put_along_axis(labels, winner[..., None], True, axis=-1)
    labels = labels.reshape(b, t, f * s)  # the original's binary targets: bin-major, speaker fastest
    usedbins = rng.random((b, t, f)) > 0.3
    usedbins[1, 4:] = False  # padded frames of a shorter utterance: no used bins
    usedbins[2] = False  # no used bin at all: counts floored at 1, attractors 0
    model = build_model("Attractor", bins=f, normalize=normalization)
    got = model(torch.from_numpy(data), torch.from_numpy(labels), torch.from_numpy(usedbins))
    want = original_attractors(data, labels, usedbins, normalization)
    assert got.shape == (b, s, d)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-12)
    assert not np.allclose(want[0], 0)


def test_attractor_inputs_that_do_not_fit_are_errors() -> None:
    from mtlab.base.errors import BatchError, ConfigError

    model = build_model("Attractor", bins=5)
    with pytest.raises(BatchError, match="embeddings"):
        model(torch.zeros(1, 2, 11), torch.zeros(1, 2, 10), torch.zeros(1, 2, 5))
    with pytest.raises(ConfigError, match="bins"):
        build_model("Attractor", bins=0)


@pytest.mark.skipif(not DANET.is_dir(), reason="the original's recipes are not beside the repository")
def test_the_danet_recipe_imports_its_attractor_layer(tmp_path: Path) -> None:
    from mtlab.nabu import import_nabu

    recipe = import_nabu(DANET, data_root=tmp_path)
    assert recipe["models"]["attractor_layer"] == {"type": "Attractor", "bins": 129, "normalize": False}
    assert recipe["models"]["id_net"]["input_dim"] == 20  # the embedding size: 2580 / 129
    task = recipe["tasks"]["task_sr"]
    assert task["inputs"] == ["features", "binary_targets", "usedbins"]
    assert [n["inputs"] for n in task["nodes"] if n["name"] == "attractor"] == \
        [["speaker_bin_embeddings", "binary_targets", "usedbins"]]


@pytest.mark.slow
@pytest.mark.skipif(not DANET.is_dir(), reason="the original's recipes are not beside the repository")
def test_the_danet_speaker_task_feeds_its_attractors_and_trains(tmp_path: Path) -> None:
    """task_sr: attractors of the speaker embeddings over the binary targets and used bins, by hand, then a step."""
    import mtlab
    from mtlab.base.batching import collate
    from mtlab.nabu import import_nabu, make_sample_root, plain_recipe
    from mtlab.nabu.shrink import shrink
    from mtlab.tasks.forward import eval_mode

    recipe = import_nabu(DANET, data_root=tmp_path / "data")
    make_sample_root(recipe, limit=4)
    shrink(recipe, 8)
    exp = mtlab.from_recipe(plain_recipe(recipe), init_weights=False)
    ds = exp.trainer.tasks["task_sr"].linkedsets["set0"].examples
    batch = collate([ds[i] for i in range(2)])
    models, plan = exp.trainer.models, exp.trainer.plans["task_sr"]
    with eval_mode(models), torch.no_grad():
        got = plan.forward(batch).outputs["attractor"]
        data, lengths = batch
        emb = models["speaker_embeddings_model"](models["main"](data["features"], seq_lengths=lengths["features"]))
    want = original_attractors(emb.double().numpy(), data["binary_targets"].numpy(), data["usedbins"].numpy(), False)
    assert got.shape == (2, 2, 20)
    np.testing.assert_allclose(got.double().numpy(), want, rtol=1e-4, atol=1e-5)
    exp.trainer.step()
