"""Separation loss computers against brute-force references written out on tiny inputs."""

from __future__ import annotations

import itertools

import pytest
import torch

import mtlab
from mtlab.batching import collate
from mtlab.losses import PIT, CrossEntropyMulti, DeepAttractorNet, DeepClustering, Direct

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
            "masks": torch.rand(t, F_ * S_, generator=g, dtype=dtype),
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
        m = u["masks"].reshape(t, F_, S_)
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
        v = u["emb"].reshape(t, F_, D_)
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
    pit, _ = run(PIT(output="masks"), utts)
    direct, _ = run(Direct(output="masks"), utts)
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
        ref = ref + min((sum(-lp[k, target[i, p[k]]] for k in range(s)) for p in itertools.permutations(range(s))),
                        key=float)
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
        assert torch.autograd.gradcheck(lambda v: loss(targets, {key: v}, lens)[0], (x,))
    logits = torch.randn(3, 2, 4, dtype=torch.float64, requires_grad=True)
    y = torch.tensor([[0, 1], [2, 3], [3, 0]])
    assert torch.autograd.gradcheck(lambda z: CrossEntropyMulti(output="o", target="y")({"y": y}, {"o": z}, {})[0],
                                    (logits,))


def test_registry_and_shape_errors():
    assert isinstance(mtlab.losses.get_loss("pit", output="masks"), PIT)
    assert isinstance(mtlab.losses.get_loss("deepclustering", output="emb"), DeepClustering)
    for name in ("direct", "deepattractornet", "crossentropy_multi"):
        assert name in mtlab.losses.LOSSES
    data, lens = collate(utterances(9))
    with pytest.raises(mtlab.BatchError, match="num_sources"):
        PIT(output="m")(data, {"m": torch.zeros(3, 4, F_ * 3)}, lens)
    with pytest.raises(mtlab.BatchError, match="F = 3 bins"):
        DeepClustering(output="e")(data, {"e": torch.zeros(3, 4, 7)}, lens)
    with pytest.raises(mtlab.BatchError, match="no output named 'emb'"):
        DeepClustering()(data, {}, lens)
