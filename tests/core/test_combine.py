"""Task combination: the default is the original's weighted sum bit for bit; every torchjd aggregator gets the
Jacobian plain PyTorch computes in one pass; backward count, data parallel, history, missing packages."""

from __future__ import annotations

import datetime
import json
import os
import socket
import sys

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from helpers.paths import RECIPES

import mtlab
from helpers import make_examples, make_models, task_a, task_b
from mtlab.core import combine as combine_mod
from mtlab.base.batching import collate
from mtlab.tasks.sampling import BatchStream, derived_seed

torchjd = pytest.importorskip("torchjd", reason="task combination needs torchjd (pip install 'mtlab[mtl]')")
from torchjd import aggregation  # noqa: E402

SHARED = ["enc.lin.weight", "enc.lin.bias"]


def task_c(examples=None) -> mtlab.Task:
    """A third task on the shared encoder: per-frame classes through its own head."""
    return mtlab.Task("c", nodes=[mtlab.Node("h", model="enc", inputs=["x"]),
                                  mtlab.Node("logits", model="head_c", inputs=["h"])],
                      inputs=["x"], targets=["y"], outputs=["logits"],
                      loss=mtlab.losses.CrossEntropy(output="logits", target="y"),
                      linkedsets={"clean": mtlab.LinkedSet(examples)}, batch_size=3)


def models3() -> dict[str, nn.Module]:
    models = make_models()
    torch.manual_seed(7)
    models["head_c"] = nn.Linear(8, 5).double()
    return models


def ce_sum(models, batch, task):
    """Plain PyTorch: summed loss and normalizer of one minibatch of the helper tasks."""
    data, lens = batch
    h = models["enc"](data["x"])
    if task in ("a", "c"):
        logits = models["head_a" if task == "a" else "head_c"](h)
        mask = torch.arange(data["y"].shape[1])[None] < lens["y"][:, None]
        per = F.cross_entropy(logits.transpose(1, 2), data["y"], reduction="none")
        return (per * mask).sum(), mask.sum().double()
    logits = models["head_b"](models["pool"](h, lens["x"]))
    return F.cross_entropy(logits, data["spk"], reduction="sum"), torch.tensor(float(data["spk"].shape[0]),
                                                                               dtype=torch.float64)


def plans() -> dict[str, list[tuple[str, float, object]]]:
    """Per task: (linked set, its weight, minibatch), the same for mtlab and the oracle."""
    b = [collate(make_examples(n, 50 + i, lengths=(2, 9))) for i, n in enumerate((3, 2, 4, 3, 2))]
    return {"a": [("clean", 1.0, b[0]), ("noisy", 0.5, b[1])], "b": [("clean", 1.0, b[2]), ("clean", 1.0, b[3])],
            "c": [("clean", 1.0, b[4])]}


def trainer3(combine=None, clip=0.05, weights=(1.0, 0.7, 1.3), lr=1e-2, **kw) -> mtlab.Trainer:
    tasks = [task_a(), task_b(), task_c()]
    for t, w in zip(tasks, weights):
        t.weight = w
    return mtlab.Trainer(models3(), tasks, lr=lr, clip_grad_value=clip, device="cpu", combine=combine, **kw)


def accumulate(tr: mtlab.Trainer) -> None:
    for task, plan in plans().items():
        for s, _, batch in plan:
            tr.process_minibatch(task, s, batch=batch)
    tr.normalize()
    if tr.clip_grad_value is not None:
        tr.clip()


def oracle_grads(models, clip) -> dict[str, dict[str, torch.Tensor]]:
    """Each task's gradient of Σ w·loss / Σ w·normalizer over ALL its minibatches in one pass, then clipped."""
    out = {}
    for task, plan in plans().items():
        total = norm = 0.0
        for _, w, batch in plan:
            loss, n = ce_sum(models, batch, task)
            total, norm = total + w * loss, norm + w * n
        names = {f"{m}.{p}": q for m, mod in models.items() for p, q in mod.named_parameters()}
        used = [k for k in names if k.split(".")[0] in ("enc", {"a": "head_a", "b": "head_b", "c": "head_c"}[task])]
        grads = torch.autograd.grad(total / norm, [names[k] for k in used])
        out[task] = {k: g.clamp(-clip, clip) if clip else g for k, g in zip(used, grads)}
    return out


def test_the_default_is_the_original_weighted_sum_bit_for_bit() -> None:
    """Directions and parameters after 3 steps equal the original's arithmetic (mul, then add_ with alpha, per
    parameter; a lone task of weight 1 its own gradient) stepped by the same fused Adam, bit for bit."""
    tr = trainer3(weights=(1.0, 0.7, 1.0))
    ref = models3()
    ref_params = {f"{m}.{p}": q for m, mod in ref.items() for p, q in mod.named_parameters()}
    ref_opt = None
    for _ in range(3):
        accumulate(tr)
        grads = {t: {k: v.clone() for k, v in tr.state(t).grads.items()} for t in tr.tasks}
        expected = {}
        for name, users in tr.param_users.items():
            pairs = [(tr.tasks[t].weight, grads[t][name]) for t in users]
            if len(pairs) == 1 and pairs[0][0] == 1.0:
                expected[name] = pairs[0][1]
            else:
                d = torch.mul(pairs[0][1], pairs[0][0])
                for w, g in pairs[1:]:
                    d.add_(g, alpha=w)
                expected[name] = d
        got = tr.update.directions({t: tr.state(t) for t in tr.tasks}, {t: x.weight for t, x in tr.tasks.items()})
        assert all(torch.equal(got[k], v) for k, v in expected.items())
        tr.apply()
        used = [ref_params[k] for k in tr.update.params]
        if ref_opt is None:
            ref_opt = torch.optim.Adam(used, lr=1e-2, fused=True)
        for k in tr.update.params:
            ref_params[k].grad = expected[k]
        ref_opt.step()
    assert all(torch.equal(p, ref_params[k]) for k, p in tr.params.items())
    assert tr.update.method is None and isinstance(tr.update.combine, mtlab.core.update.WeightedSum)


@pytest.mark.parametrize("name", sorted(combine_mod.AGGREGATORS))
def test_each_method_equals_torchjd_on_the_jacobian_plain_pytorch_computes(name: str) -> None:
    tr = trainer3(name)
    accumulate(tr)
    weights = {t: x.weight for t, x in tr.tasks.items()}
    seed = tr.update.step_seed()
    got = tr.update.directions({t: tr.state(t) for t in tr.tasks}, weights)
    stats = dict(tr.update.stats)

    grads = oracle_grads(models3(), 0.05)
    J = torch.stack([weights[t] * torch.cat([grads[t][k].reshape(-1) for k in SHARED]) for t in "abc"])
    method = combine_mod.AGGREGATORS[name]
    cls = getattr(aggregation, method.cls)
    agg = cls(n_tasks=3, **method.defaults) if method.per_size else cls(**method.defaults)
    torch.manual_seed(seed)
    expected = agg(J)
    mine = torch.cat([got[k].reshape(-1) for k in SHARED])
    assert J.dtype == torch.float64
    torch.testing.assert_close(mine, expected, atol=1e-6, rtol=0)
    for t, head in (("a", "head_a"), ("b", "head_b"), ("c", "head_c")):  # task-specific: own weighted gradient
        for k in (f"{head}.weight", f"{head}.bias"):
            torch.testing.assert_close(got[k], weights[t] * grads[t][k], atol=1e-12, rtol=0)
    assert "unused.weight" not in got  # no task uses it: no direction, no optimizer state
    # the history's statistics: cosine similarities of the processed gradients, the direction's norm
    rows = {t: torch.cat([grads[t][k].reshape(-1) for k in SHARED]) for t in "abc"}
    for a, b in (("a", "b"), ("a", "c"), ("b", "c")):
        assert float(stats[f"cos/enc/{a},{b}"]) == pytest.approx(float(F.cosine_similarity(rows[a], rows[b], dim=0)),
                                                                  abs=1e-9)
    assert float(stats["direction_norm/enc"]) == pytest.approx(float(expected.norm()), abs=1e-6)
    if method.cls not in ("GradDrop", "ConFIG"):
        chosen = torch.stack([stats[f"combine/enc/{t}"] for t in "abc"])
        torch.testing.assert_close(chosen @ J, expected, atol=1e-6, rtol=0)


def test_apply_steps_with_the_combined_direction_and_the_history_records_it() -> None:
    tr = trainer3("upgrad", optimizer=lambda ps: torch.optim.SGD(ps, lr=1.0), lr=None)
    before = {k: p.detach().clone() for k, p in tr.params.items()}
    accumulate(tr)
    grads = oracle_grads(models3(), 0.05)
    w = {t: x.weight for t, x in tr.tasks.items()}
    J = torch.stack([w[t] * torch.cat([grads[t][k].reshape(-1) for k in SHARED]) for t in "abc"])
    tr.apply()
    moved = torch.cat([(before[k] - tr.params[k].detach()).reshape(-1) for k in SHARED])
    torch.testing.assert_close(moved, aggregation.UPGrad()(J), atol=1e-6, rtol=0)
    row = tr.history.iloc[-1]
    assert {"combine/enc/a", "cos/enc/a,b", "cos/enc/b,c", "direction_norm/enc", "direction_norm"} <= set(row.index)
    assert row["direction_norm/enc"] == pytest.approx(float(moved.norm()), abs=1e-9)


@pytest.mark.parametrize("method", [None, "upgrad", "uncertainty+pcgrad"])
def test_backward_passes_are_tasks_times_minibatches(method) -> None:
    ex = make_examples(12, 3)
    tasks = [task_a((ex, ex)), task_b(ex), task_c(ex)]
    tr = mtlab.Trainer(models3(), tasks, lr=1e-2, numbatches_to_aggregate=2, device="cpu", combine=method)
    calls = []
    # each backward through the shared encoder calls the hook on its output once
    def on_forward(module, inputs, out) -> None:
        out.register_hook(lambda grad: calls.append(1))

    tr.models["enc"].register_forward_hook(on_forward)
    for _ in range(2):
        tr.step()
    minibatches = 2 * (2 + 1 + 1)  # a has two linked sets; every set twice per step
    assert len(calls) == 2 * minibatches == sum(2 * 2 * len(t.linkedsets) for t in tasks)


def test_switching_the_method_between_steps_and_restoring_switches_back() -> None:
    tr = trainer3()
    seen = []
    tr.add_callback(lambda ev, info: seen.append(info.value) if ev == "knob" and info.name == "combine" else None)
    accumulate(tr); tr.apply()
    snap = tr.state_dict()
    tr.set_combine("dwa+mgda")
    accumulate(tr); tr.apply()
    assert seen == ["dwa+mgda"] and isinstance(tr.update.combine, combine_mod.Aggregate)
    h = tr.history
    assert h["combine/enc/a"].isna().iloc[0] and not h["combine/enc/a"].isna().iloc[1]
    assert h["weighting/b"].iloc[1] == 1.0  # DWA: uniform until two periods are done
    tr.load_state_dict(snap)
    assert tr.update.method is None and tr.update.weighting is None


@pytest.mark.slow
def test_a_recipe_chooses_the_method() -> None:
    from mtlab.apps.recipe import TRAINER_KEYS
    assert TRAINER_KEYS["combine"].default == "sum"
    exp = mtlab.from_recipe(demo_recipe("uncertainty+upgrad"))
    assert isinstance(exp.trainer.update.combine, combine_mod.Aggregate)
    assert type(exp.trainer.update.weighting).__name__ == "UncertaintyWeighting"
    with pytest.raises(mtlab.ConfigError, match="unknown combine method type 'upgard'"):
        mtlab.from_recipe(demo_recipe("upgard"))


def demo_recipe(method: str) -> dict:
    import tomllib

    path = RECIPES / "demo.toml"
    recipe = tomllib.loads(path.read_text())
    recipe["trainer"]["combine"] = method
    recipe["source"] = str(path)
    return recipe


@pytest.mark.parametrize("method,module", [("upgrad", "torchjd"), ("cagrad", "cvxpy"), ("nash_mtl", "ecos"),
                                           ("dualproj", "quadprog"), ("famo", "torchjd")])
def test_a_missing_optional_package_names_the_extra(monkeypatch: pytest.MonkeyPatch, method: str, module: str) -> None:
    for name in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, module, None)  # import of it now raises ImportError
    with pytest.raises(ImportError, match=r'pip install "mtlab\[mtl\]"'):
        trainer3(method)


def test_bad_specs_are_refused_with_the_fix() -> None:
    with pytest.raises(mtlab.ConfigError, match="two aggregators"):
        trainer3("upgrad+mgda")
    with pytest.raises(mtlab.ConfigError, match="cagrad"):
        trainer3({"type": "cagrad", "radius": 1})
    with pytest.raises(mtlab.ConfigError, match="acc_steps"):
        trainer3("upgrad", acc_steps=True)


# ---------------------------------------------------------------------------------- data parallel
STEPS = 3


def dist_build(distributed: bool | None = None) -> mtlab.Trainer:
    clean, noisy = make_examples(21, 11), make_examples(17, 12)
    tasks = [task_a((clean, noisy), weights=(1.0, 0.4), batch_size=3), task_b(clean, batch_size=4, weight=0.7),
             task_c(noisy)]
    tr = mtlab.Trainer(models3(), tasks, lr=1e-2, clip_grad_value=0.5, numbatches_to_aggregate=2, device="cpu",
                       seed=3, combine="uncertainty+pcgrad", distributed=False if distributed is False else None)
    return tr if distributed is False else mtlab.distributed.attach_if_distributed(tr)


def dist_worker(rank: int, world: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    tr = dist_build()
    for _ in range(STEPS):
        tr.step()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"params": {k: p.detach().tolist() for k, p in tr.params.items()},
                   "coef": tr.history["weighting/a"].tolist()}, f)
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built in this torch")
def test_two_ranks_equal_one_process(tmp_path) -> None:
    """Each rank reduces its accumulators at normalize; the combination then runs once on identical inputs
    (PCGrad's random order seeded by the step), so 2 gloo ranks make the update of 1 process."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(dist_worker, args=(2, port, str(tmp_path)), nprocs=2, join=True, start_method="spawn")
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert r0 == r1  # bit for bit on both ranks
    tr = dist_build(distributed=False)
    shards = {(t, s, r): BatchStream(ls.examples, task.batch_size, task.numbuckets,
                                     seed=derived_seed(tr.seed, t, s), shard=(r, 2))
              for t, task in tr.tasks.items() for s, ls in task.linkedsets.items() for r in range(2)}
    for _ in range(STEPS):
        for t, task in tr.tasks.items():
            for _ in range(tr.numbatches_to_aggregate):
                for s in task.linkedsets:
                    for r in range(2):
                        tr.process_minibatch(t, s, batch=next(shards[(t, s, r)]))
        tr.normalize(); tr.clip(); tr.apply()
    for k, p in tr.params.items():
        torch.testing.assert_close(torch.tensor(r0["params"][k], dtype=torch.float64), p.detach(), atol=1e-9, rtol=0)
    assert r0["coef"] == pytest.approx(tr.history["weighting/a"].tolist(), abs=1e-12)
    assert len(set(r0["coef"])) == STEPS  # the log-variances were learned, step by step


def test_the_dashboard_selector_switches_the_method_and_follows_a_restore() -> None:
    pytest.importorskip("ipywidgets", reason="the dashboard needs mtlab[notebook]")
    import mtlab.ui

    tr = trainer3()
    dash = mtlab.ui.dashboard(tr, plots=False)
    try:
        assert dash.combine_dropdown.value == "sum" and "upgrad" in dash.combine_dropdown.options
        snap = tr.state_dict()
        dash.combine_dropdown.value = "upgrad"
        assert tr.update.method == "upgrad"
        accumulate(tr); tr.apply()
        assert "combine/enc/a" in tr.history.columns
        tr.load_state_dict(snap)
        assert tr.update.method is None and dash.combine_dropdown.value == "sum"
    finally:
        dash.close()


def test_nash_mtl_state_is_checkpointed_and_resumes_the_run(tmp_path) -> None:
    pytest.importorskip("cvxpy", reason="Nash-MTL needs cvxpy and ecos (mtlab[mtl])")
    pytest.importorskip("ecos", reason="Nash-MTL needs cvxpy and ecos (mtlab[mtl])")

    def make() -> mtlab.Trainer:
        ex = make_examples(16, 4)
        # new weights every 2 steps: a resumed run must reuse the saved ones at its first step
        return mtlab.Trainer(make_models(), [task_a((ex, ex)), task_b(ex, weight=0.6)], lr=1e-2, device="cpu",
                             combine={"type": "nash_mtl", "update_weights_every": 2})

    tr = make()
    for _ in range(3):
        tr.step()
    path = tr.save(tmp_path / "ck.pt")
    for _ in range(3):
        tr.step()
    again = make()
    again.load_checkpoint(path)
    (state,) = again.update.combine.aggregators.values()
    assert state.weighting.step == 3 and not np.allclose(state.weighting.prvs_alpha, 1.0)  # restored, not fresh
    for _ in range(3):
        again.step()
    for k, p in again.params.items():
        torch.testing.assert_close(p, tr.params[k], atol=1e-6, rtol=1e-5)
    cols = [c for c in tr.history.columns if c.startswith("combine/")]
    np.testing.assert_allclose(again.history[cols].to_numpy(dtype=float), tr.history[cols].to_numpy(dtype=float),
                               atol=1e-5)
