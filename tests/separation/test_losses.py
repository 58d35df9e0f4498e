"""Separation loss computers against brute-force references written out on tiny inputs, and against
the original's formulas (its ops.py steps, on the zero-padded batch it sees) for sum and normalizer."""

from __future__ import annotations

import itertools

import pytest
import torch

import mtlab
from mtlab.base.batching import collate
from mtlab.separation.losses import (
    PIT,
    CrossEntropyMulti,
    DeepAttractorNet,
    DeepClustering,
    DeepClusteringFlat,
    DeepClusteringNoise,
    Direct,
)

pytestmark = pytest.mark.usefixtures("one_thread")


F_, S_, D_ = 3, 2, 2
LENS = (4, 2, 3)


def utterances(seed: int = 0, lens=LENS, dtype=torch.float64):
    """Per-utterance tensors (unpadded) of a tiny separation batch."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for t in lens:
        src = torch.rand(t, F_, S_, generator=g, dtype=dtype) + 0.1
        onehot = torch.nn.functional.one_hot(src.argmax(-1), S_).to(dtype)
        out.append({
            "emb": torch.randn(t, F_ * D_, generator=g, dtype=dtype),
            "masks": torch.randn(t, F_ * S_, generator=g, dtype=dtype),  # logits (the loss activates them)
            "src_mag": src,
            "mix_mag": src.sum(-1) + 0.05 * torch.rand(t, F_, generator=g, dtype=dtype),
            "binary_targets": onehot.reshape(t, F_ * S_),
            "usedbins": torch.rand(t, F_, generator=g) > 0.3,
        })
    return out


def run(loss, utts, extra_pad: int = 0, garbage: float = 0.0):
    """Collate ``utts`` (optionally padded further, with garbage in the padded outputs) and call ``loss``."""
    data, lens = collate(utts)
    if extra_pad:
        data = {k: torch.cat([v, v.new_zeros((v.shape[0], extra_pad, *v.shape[2:]))], 1) for k, v in data.items()}
    for k in ("emb", "masks"):
        for i, n in enumerate(lens[k].tolist()):
            data[k][i, n:] = garbage
    outputs = {k: data.pop(k) for k in ("emb", "masks")}
    return loss(data, outputs, lens)


# ---------------------------------------------------------------- brute force references
def dc_reference(utts):
    loss, norm = 0.0, 0.0
    for u in utts:
        t = u["usedbins"].shape[0]
        used = u["usedbins"].reshape(-1)
        v = torch.nn.functional.normalize(u["emb"].reshape(t * F_, D_), dim=-1)[used]
        y = u["binary_targets"].reshape(t * F_, S_)[used]
        affinity = v @ v.T  # the explicit (T·F)×(T·F) matrices
        ideal = y @ y.T
        loss = loss + ((affinity - ideal) ** 2).sum()
        norm += float(used.sum()) ** 2
    return loss, norm


def mask_reference(utts, permute: bool):
    loss, norm = 0.0, 0.0
    for u in utts:
        t = u["mix_mag"].shape[0]
        m = torch.softmax(u["masks"].reshape(t, F_, S_), dim=-1)
        perms = itertools.permutations(range(S_)) if permute else [tuple(range(S_))]
        costs = []
        for p in perms:
            c = 0.0
            for s in range(S_):
                c = c + ((m[..., s] * u["mix_mag"] - u["src_mag"][..., p[s]]) ** 2).sum()
            costs.append(c)
        loss = loss + min(costs, key=float)
        norm += t * S_ * F_
    return loss, norm


def danet_reference(utts):
    loss, norm = 0.0, 0.0
    for u in utts:
        t = u["mix_mag"].shape[0]
        v = u["emb"].reshape(t, F_, D_) * u["usedbins"][..., None]  # unused bins: zero embedding
        y = u["binary_targets"].reshape(t, F_, S_)
        attractors = []
        for s in range(S_):
            members = [v[i, f] for i in range(t) for f in range(F_) if u["usedbins"][i, f] and y[i, f, s] == 1]
            attractors.append(torch.stack(members).mean(0) if members else torch.zeros(D_, dtype=v.dtype))
        a = torch.stack(attractors)
        masks = torch.softmax(v @ a.T, dim=-1)
        loss = loss + ((masks * u["mix_mag"][..., None] - u["src_mag"]) ** 2).sum()
        norm += t * S_ * F_
    return loss, norm


def test_deep_clustering_matches_explicit_affinity_matrices():
    utts = utterances(0)
    loss, norm = run(DeepClustering(output="emb"), utts, garbage=7.0)
    ref, ref_norm = dc_reference(utts)
    torch.testing.assert_close(loss, ref)
    assert float(norm) == ref_norm
    assert float(loss) >= 0


@pytest.mark.parametrize("cls, permute", [(PIT, True), (Direct, False)])
def test_mask_losses_match_explicit_permutations(cls, permute):
    utts = utterances(1)
    loss, norm = run(cls(output="masks"), utts, garbage=5.0)
    ref, ref_norm = mask_reference(utts, permute)
    torch.testing.assert_close(loss, ref)
    assert float(norm) == ref_norm == sum(LENS) * S_ * F_


def test_pit_differs_from_direct_when_the_order_is_wrong():
    utts = utterances(2)
    for u in utts:  # masks that fit the sources in swapped order
        swapped = u["src_mag"].flip(-1) / u["mix_mag"][..., None]
        u["masks"] = swapped.reshape(u["masks"].shape)
    pit, _ = run(PIT(output="masks", activation="none"), utts)
    direct, _ = run(Direct(output="masks", activation="none"), utts)
    assert float(pit) < 1e-20 < float(direct)


def test_deep_attractor_net_matches_reference():
    utts = utterances(3)
    loss, norm = run(DeepAttractorNet(output="emb"), utts, garbage=3.0)
    ref, ref_norm = danet_reference(utts)
    torch.testing.assert_close(loss, ref)
    assert float(norm) == ref_norm


def test_crossentropy_multi_matches_explicit_permutations():
    g = torch.Generator().manual_seed(4)
    b, s, c = 5, 3, 6
    logits = torch.randn(b, s * c, generator=g, dtype=torch.float64)
    target = torch.stack([torch.randperm(c, generator=g)[:s] for _ in range(b)])
    loss, norm = CrossEntropyMulti(output="o", target="y")({"y": target}, {"o": logits}, {})
    ref = 0.0
    for i in range(b):
        lp = torch.log_softmax(logits[i].reshape(s, c), -1)
        ref = ref + min((sum(-lp[k, target[i, p[k]]] for k in range(s)) / s
                         for p in itertools.permutations(range(s))), key=float)
    torch.testing.assert_close(loss, ref)
    assert float(norm) == b
    again, _ = CrossEntropyMulti(output="o", target="y")({"y": target}, {"o": logits.reshape(b, s, c)}, {})
    torch.testing.assert_close(again, loss)


@pytest.mark.parametrize("loss", [DeepClustering(output="emb"), PIT(output="masks"), Direct(output="masks"),
                                  DeepAttractorNet(output="emb")], ids=repr)
def test_padding_changes_neither_loss_nor_norm(loss):
    utts = utterances(5)
    base = run(loss, utts)
    padded = run(loss, utts, extra_pad=3, garbage=1e3)
    alone = [run(loss, [u]) for u in utts]
    torch.testing.assert_close(padded[0], base[0])
    assert float(padded[1]) == float(base[1])
    torch.testing.assert_close(sum(a[0] for a in alone), base[0])
    assert sum(float(a[1]) for a in alone) == float(base[1])


def test_speaker_order_of_targets_does_not_matter_for_pit_and_crossentropy_multi():
    utts = utterances(6)
    swapped = [{**u, "src_mag": u["src_mag"].flip(-1)} for u in utts]
    torch.testing.assert_close(run(PIT(output="masks"), swapped)[0], run(PIT(output="masks"), utts)[0])
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(4, 2, 5, generator=g)
    y = torch.tensor([[0, 1], [2, 3], [4, 0], [1, 2]])
    ce = CrossEntropyMulti(output="o", target="y")
    torch.testing.assert_close(ce({"y": y.flip(-1)}, {"o": logits}, {})[0], ce({"y": y}, {"o": logits}, {})[0])


def test_flat_and_4d_layouts_agree():
    utts = utterances(7)
    data, lens = collate(utts)
    out_flat = {"emb": data["emb"], "masks": data["masks"]}
    b, t = data["emb"].shape[:2]
    out_4d = {"emb": data["emb"].reshape(b, t, F_, D_), "masks": data["masks"].reshape(b, t, F_, S_)}
    tg = {k: v for k, v in data.items() if k not in out_flat}
    tg4 = {**tg, "binary_targets": tg["binary_targets"].reshape(b, t, F_, S_)}
    for loss in (DeepClustering(output="emb"), PIT(output="masks"), DeepAttractorNet(output="emb")):
        torch.testing.assert_close(loss(tg, out_flat, lens)[0], loss(tg4, out_4d, lens)[0])


def test_gradients_flow_gradcheck():
    utts = utterances(8, lens=(3, 2))
    data, lens = collate(utts)
    targets = {k: v for k, v in data.items() if k not in ("emb", "masks")}
    for loss, key in ((DeepClustering(output="emb"), "emb"), (PIT(output="masks"), "masks"),
                      (DeepAttractorNet(output="emb"), "emb"), (Direct(output="masks"), "masks")):
        x = data[key].clone().requires_grad_(True)
        assert torch.autograd.gradcheck(lambda v: loss(targets, {key: v}, lens)[0], (x,))  # noqa: B023 (called here)
    logits = torch.randn(3, 2, 4, dtype=torch.float64, requires_grad=True)
    y = torch.tensor([[0, 1], [2, 3], [3, 0]])
    assert torch.autograd.gradcheck(lambda z: CrossEntropyMulti(output="o", target="y")({"y": y}, {"o": z}, {})[0],
                                    (logits,))


def test_registry_and_shape_errors():
    assert isinstance(mtlab.losses.get_loss("pit", output="masks"), PIT)
    assert isinstance(mtlab.losses.get_loss("deepclustering", output="emb"), DeepClustering)
    for name in ("direct", "deepattractornet", "crossentropy_multi", "deepclustering_flat", "deepclusteringnoise"):
        assert name in mtlab.losses.LOSSES and name in mtlab.losses.ORIGINAL_LOSS_TYPES
    assert "mse" in mtlab.losses.LOSSES and "mse" not in mtlab.losses.ORIGINAL_LOSS_TYPES
    with pytest.raises(mtlab.ConfigError, match="activation='relu'; valid: \\['softmax', 'sigmoid', 'none'\\]"):
        PIT(activation="relu")
    data, lens = collate(utterances(9))
    with pytest.raises(mtlab.BatchError, match="num_sources"):
        PIT(output="m")(data, {"m": torch.zeros(3, 4, F_ * 3)}, lens)
    with pytest.raises(mtlab.BatchError, match="F = 3 bins"):
        DeepClustering(output="e")(data, {"e": torch.zeros(3, 4, 7)}, lens)
    with pytest.raises(mtlab.BatchError, match="no output named 'emb'"):
        DeepClustering()(data, {}, lens)


# ---------------------------------------------------------------- the original's formulas (ops.py steps)
def padded(utts):
    """The zero-padded batch the original's loss computers see, and its sequence lengths."""
    data, lens = collate(utts)
    return data, lens["mix_mag"]


def original_pit(logits, targets, mix, seq_length, activation="softmax", no_perm=False):
    """ops.pit_loss: flat logits [B, T, nrS*F] read speaker-major, masks over the speaker axis,
    recs = masks × mixture, per utterance the min over permutations of the summed squared error."""
    b, t, f, nrs = targets.shape
    resh = logits.permute(2, 0, 1).reshape(nrs, f, b, t).permute(2, 3, 1, 0)  # [B, T, F, nrS]
    masks = {"softmax": lambda z: torch.softmax(z, 3), "sigmoid": torch.sigmoid}[activation](resh)
    recs = (masks * mix[..., None]).permute(3, 0, 1, 2)  # [nrS, B, T, F]
    org = targets.permute(3, 0, 1, 2)
    perms = [list(range(nrs))] if no_perm else [list(p) for p in itertools.permutations(range(nrs))]
    cost = torch.stack([((recs[p] - org) ** 2).sum(dim=(0, 2, 3)) for p in perms])
    return cost.min(0).values.sum(), float(seq_length.sum() * nrs * f)


def original_direct(logits, targets, mix, seq_length):
    """ops.direct_loss: softmax masks, no permutation, squared Frobenius norm per (utterance, speaker)."""
    b, t, f, nrs = targets.shape
    resh = logits.permute(2, 0, 1).reshape(nrs, f, b, t).permute(2, 3, 1, 0)
    recs = torch.softmax(resh, 3) * mix[..., None]
    return ((recs - targets) ** 2).sum(dim=(1, 2)).sum(), float(seq_length.sum() * nrs * f)


def original_danet(partitioning, spectrogram_targets, mix, energybins, embeddings, seq_length):
    """ops.deepattractornet_loss with activation softmax."""
    b, t, f, nrs = spectrogram_targets.shape
    eb = energybins.to(embeddings.dtype).reshape(b, -1, 1)
    v = embeddings.reshape(b, -1, embeddings.shape[2] // f) * eb
    y = partitioning.to(embeddings.dtype).reshape(b, -1, nrs) * eb
    count = y.sum(1)
    count = torch.where(count == 0, torch.ones_like(count), count)
    a = (y.transpose(1, 2) @ v) / count[..., None]
    masks = torch.softmax(a @ v.transpose(1, 2), dim=1)  # [B, nrS, K]
    recs = masks * mix.reshape(b, 1, -1)
    s = spectrogram_targets.reshape(b, -1, nrs).transpose(1, 2)
    return ((s - recs) ** 2).sum(), float(seq_length.sum() * nrs * f)


def original_crossentropy_multi(labels, logits, allow_permutation):
    """ops.crossentropy_multi_loss for logits [B, nrS, C]: mean over speakers, min over permutations."""
    nrs = logits.shape[-2]
    perms = itertools.permutations(range(nrs)) if allow_permutation else [tuple(range(nrs))]
    costs = []
    for p in perms:
        ce = torch.nn.functional.cross_entropy(logits[:, list(p)].transpose(1, 2), labels, reduction="none")
        costs.append(ce.mean(1))
    return torch.stack(costs).min(0).values.sum(), float(labels.shape[0])


def original_deepclustering(targets, logits, usedbins):
    """ops.deepclustering_loss / deepclustering_flat_loss."""
    b = usedbins.shape[0]
    ub = usedbins.to(logits.dtype).reshape(b, -1, 1)
    v = torch.nn.functional.normalize(logits.reshape(b, -1, logits.shape[-1] if logits.dim() == 4
                                                     else logits.shape[2] // usedbins.shape[2]), dim=2, eps=1e-12) * ub
    y = targets.to(logits.dtype).reshape(b, -1, targets.shape[2] // usedbins.shape[2]) * ub
    loss = ((v.transpose(1, 2) @ v) ** 2).sum() - 2 * ((v.transpose(1, 2) @ y) ** 2).sum() \
        + ((y.transpose(1, 2) @ y) ** 2).sum()
    return loss, float((usedbins.sum(dim=(1, 2)).to(logits.dtype) ** 2).sum())


def speaker_major(masks_bin_major: torch.Tensor) -> torch.Tensor:
    """[B, T, F*nrS] (f*nrS + s) -> the original's flat logits (s*F + f)."""
    b, t, _ = masks_bin_major.shape
    return masks_bin_major.reshape(b, t, F_, S_).transpose(2, 3).reshape(b, t, S_ * F_)


@pytest.mark.parametrize("activation", ["softmax", "sigmoid"])
@pytest.mark.parametrize("cls, no_perm", [(PIT, False), (PIT, True), (Direct, True)])
def test_pit_and_direct_match_the_original_formula(cls, no_perm, activation):
    data, sl = padded(utterances(11))
    logits = speaker_major(data["masks"])
    loss_fn = cls(output="m", activation=activation, layout="speaker_major", no_perm=no_perm)
    loss, norm = loss_fn(data, {"m": logits}, {"m": sl})
    if cls is Direct and activation == "softmax":
        ref, ref_norm = original_direct(logits, data["src_mag"], data["mix_mag"], sl)
    else:
        ref, ref_norm = original_pit(logits, data["src_mag"], data["mix_mag"], sl, activation, no_perm)
    torch.testing.assert_close(loss, ref)
    assert float(norm) == ref_norm == sum(LENS) * S_ * F_
    # bin-major output of mtlab's own heads: the same numbers from the same masks
    same, _ = cls(output="m", activation=activation, no_perm=no_perm)(data, {"m": data["masks"]}, {"m": sl})
    torch.testing.assert_close(same, ref)


def test_pit_softmax_default_differs_from_sigmoid():
    data, sl = padded(utterances(12))
    soft = PIT(output="m")(data, {"m": data["masks"]}, {"m": sl})[0]
    sig = PIT(output="m", activation="sigmoid")(data, {"m": data["masks"]}, {"m": sl})[0]
    assert PIT().activation == "softmax" and Direct().activation == "softmax"
    assert abs(float(soft) - float(sig)) > 1e-6


def test_deep_attractor_net_matches_the_original_formula_and_ignores_unused_bins():
    utts = utterances(13)
    data, sl = padded(utts)
    emb = data["emb"].clone().requires_grad_(True)
    loss, norm = DeepAttractorNet(output="e")(data, {"e": emb}, {"e": sl})
    ref, ref_norm = original_danet(data["binary_targets"], data["src_mag"], data["mix_mag"], data["usedbins"],
                                   data["emb"], sl)
    torch.testing.assert_close(loss, ref)
    assert float(norm) == ref_norm
    loss.backward()
    b, t = data["usedbins"].shape[:2]
    grad = emb.grad.reshape(b, t, F_, D_)
    unused = ~data["usedbins"]
    assert unused.any() and (grad[unused] == 0).all()  # unused bins' embeddings get no gradient
    assert (grad[data["usedbins"]] != 0).any()
    # changing the embeddings of unused bins changes nothing (their masks are 1/nrS)
    other = data["emb"].reshape(b, t, F_, D_).clone()
    other[unused] = 100.0
    again, _ = DeepAttractorNet(output="e")(data, {"e": other.reshape(b, t, -1)}, {"e": sl})
    torch.testing.assert_close(again, loss.detach())


@pytest.mark.parametrize("allow_permutation", [True, False])
def test_crossentropy_multi_matches_the_original_formula(allow_permutation):
    g = torch.Generator().manual_seed(14)
    b, s, c = 6, 2, 5
    logits = torch.randn(b, s, c, generator=g, dtype=torch.float64)
    labels = torch.stack([torch.randperm(c, generator=g)[:s] for _ in range(b)])
    loss, norm = CrossEntropyMulti(output="o", target="y", allow_permutation=allow_permutation)(
        {"y": labels}, {"o": logits}, {})
    ref, ref_norm = original_crossentropy_multi(labels, logits, allow_permutation)
    torch.testing.assert_close(loss, ref)
    assert float(norm) == ref_norm == b
    swapped, _ = CrossEntropyMulti(output="o", target="y", allow_permutation=allow_permutation)(
        {"y": labels.flip(-1)}, {"o": logits}, {})
    if allow_permutation:
        torch.testing.assert_close(swapped, loss)
    else:
        assert abs(float(swapped) - float(loss)) > 1e-6


def test_deepclustering_and_flat_match_the_original_formula():
    data, sl = padded(utterances(15))
    ref, ref_norm = original_deepclustering(data["binary_targets"], data["emb"], data["usedbins"])
    loss, norm = DeepClustering(output="e")(data, {"e": data["emb"]}, {"e": sl})
    torch.testing.assert_close(loss, ref)
    assert float(norm) == ref_norm
    b, t = data["emb"].shape[:2]
    emb4 = data["emb"].reshape(b, t, F_, D_)
    flat, flat_norm = DeepClusteringFlat(output="e")(data, {"e": emb4}, {"e": sl})
    torch.testing.assert_close(flat, original_deepclustering(data["binary_targets"], emb4, data["usedbins"])[0])
    assert float(flat_norm) == ref_norm
    with pytest.raises(mtlab.BatchError, match="deepclustering_flat needs embeddings \\[B, T, F, D\\]"):
        DeepClusteringFlat(output="e")(data, {"e": data["emb"]}, {"e": sl})


def test_deepclusteringnoise_matches_the_original_formula():
    utts = utterances(16)
    g = torch.Generator().manual_seed(16)
    for u in utts:
        t = u["usedbins"].shape[0]
        u["noisybins"] = torch.rand(t, F_, generator=g) > 0.6
        u["rel_speech_targets"] = torch.rand(t, F_, generator=g, dtype=torch.float64)
        u["alpha"] = torch.rand(t, F_, generator=g, dtype=torch.float64)
    data, sl = padded(utts)
    loss, norm = DeepClusteringNoise(output="e", noise_filter="a")(
        data, {"e": data["emb"], "a": data["alpha"]}, {"e": sl})
    # ops.deepclustering_noise_loss
    b = data["usedbins"].shape[0]
    eb = data["usedbins"].double().reshape(b, -1, 1)
    se = (1 - data["noisybins"].double().reshape(b, -1, 1)) * eb
    v = torch.nn.functional.normalize(data["emb"].reshape(b, -1, D_), dim=2, eps=1e-12) * se
    y = data["binary_targets"].reshape(b, -1, S_) * se
    dc = ((v.transpose(1, 2) @ v) ** 2).sum() - 2 * ((v.transpose(1, 2) @ y) ** 2).sum() \
        + ((y.transpose(1, 2) @ y) ** 2).sum()
    dc_norm = max(float((se.sum(1) ** 2).sum()), 1.0)
    used = data["usedbins"].double()
    noise = ((data["rel_speech_targets"] * used - data["alpha"] * used) ** 2).sum()
    torch.testing.assert_close(loss, dc / dc_norm + noise / used.sum())
    assert float(norm) == 1.0


@pytest.mark.slow
def test_registry_imports_the_separation_package_on_a_miss():
    import subprocess
    import sys

    code = ("import sys, mtlab.losses as L; assert 'mtlab.separation' not in sys.modules; "
            "print(type(L.get_loss('deepclustering')).__name__, 'mtlab.separation' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["DeepClustering", "True"]
    with pytest.raises(mtlab.ConfigError, match="unknown loss type 'nope'; valid: .*'deepclustering'"):
        mtlab.losses.get_loss("nope")
