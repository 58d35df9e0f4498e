"""Worker functions for the torch.distributed tests (run in spawned processes, gloo on CPU)."""

from __future__ import annotations

import datetime
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn

import mtlab
import mtlab.training.distributed
from helpers import make_examples, make_models, task_a, task_b

STEPS = 3


def init(rank: int, world: int, port: int, timeout_s: float = 30) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))


def data():
    return make_examples(21, 11), make_examples(17, 12)


def build(distributed: bool | None = None, numbatches_to_aggregate: int = 2, **settings) -> mtlab.Trainer:
    clean, noisy = data()
    a = task_a((clean, noisy), weights=(1.0, 0.4), batch_size=3)
    b = task_b(clean, batch_size=4, weight=0.7)
    tr = mtlab.Trainer(make_models(), [a, b], lr=1e-2, **{"clip_grad_value": 0.5, **settings},
                       numbatches_to_aggregate=numbatches_to_aggregate, device="cpu", seed=3,
                       distributed=False if distributed is False else None)
    return tr if distributed is False else mtlab.distributed.attach_if_distributed(tr)


def params_of(tr: mtlab.Trainer) -> dict[str, list]:
    return {k: p.detach().tolist() for k, p in tr.params.items()}


def train_steps(rank: int, world: int, port: int, out: str) -> None:
    init(rank, world, port)
    tr = build()
    for _ in range(STEPS):
        tr.step()
    result = {"params": params_of(tr), "unused_grad_none": tr.params["unused.weight"].grad is None,
              "unused_no_state": tr.params["unused.weight"] not in tr.optimizer.state,
              "world": tr.parallel.world_size, "rank": tr.parallel.rank, "history": tr.history["a/loss"].tolist()}
    if rank == 0:
        tr.save(os.path.join(out, "ck.pt"))
    dist.barrier()
    for _ in range(2):
        tr.step()
    result["after"] = params_of(tr)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


# Chains without Normalize: the original's normalize_gradients = False, with clipping (the first call after
# the minibatches is clip) and without (it is apply). The ranks must still sum their gradients.
UNNORMALIZED = {"clip": {"normalize_gradients": False, "clip_grad_value": 0.05},
                "none": {"normalize_gradients": False, "clip_grad_value": None}}


def unnormalized_steps(rank: int, world: int, port: int, out: str) -> None:
    init(rank, world, port)
    result = {}
    for name, settings in UNNORMALIZED.items():
        tr = build(**settings)
        for _ in range(2):
            tr.step()
        result[name] = params_of(tr)
    # step() agrees once per cycle: one all-gather, where normalize, clip and apply by hand take three
    tr = build()
    gathers = []
    real = dist.all_gather
    dist.all_gather = lambda *a, **k: (gathers.append(1), real(*a, **k))[1]
    try:
        tr.step()
        result["gathers_step"] = len(gathers)
        for t, task in tr.tasks.items():
            for s in task.linkedsets:
                tr.process_minibatch(t, s)
        tr.normalize(); tr.clip(); tr.apply()
        result["gathers_by_hand"] = len(gathers) - result["gathers_step"]
    finally:
        dist.all_gather = real
    # one rank in step(), the other normalizing by hand: both told, at once
    if rank == 1:
        for t, task in tr.tasks.items():
            for s in task.linkedsets:
                tr.process_minibatch(t, s)
    result["step_vs_normalize"] = _attempt(tr.step if rank == 0 else tr.normalize)
    with open(os.path.join(out, f"unnormalized{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


def resume_steps(rank: int, world: int, port: int, out: str) -> None:
    init(rank, world, port)
    tr = build()
    tr.load_checkpoint(os.path.join(out, "ck.pt"))
    loaded = params_of(tr)
    for _ in range(2):
        tr.step()
    with open(os.path.join(out, f"resume{world}_rank{rank}.json"), "w") as f:
        json.dump({"loaded": loaded, "after": params_of(tr), "step": tr.step_count}, f)
    dist.barrier()
    dist.destroy_process_group()


class Router(nn.Module):
    """Uses its ``rare`` layer only for long inputs: on some ranks only."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 8)
        self.rare = nn.Linear(4, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        if x.shape[1] > 6:
            h = h + self.rare(x)
        return torch.tanh(h)


def router_batches(rank: int) -> list:
    lengths = (2, 5) if rank == 0 else (8, 12)
    return [mtlab.collate(make_examples(3, 100 * rank + i, lengths=lengths)) for i in range(2)]


def build_router() -> mtlab.Trainer:
    models = make_models()
    torch.manual_seed(1)
    models["enc"] = Router().double()
    return mtlab.distributed.attach_if_distributed(
        mtlab.Trainer(models, [task_a()], lr=1e-2, clip_grad_value=0.5, device="cpu", seed=3))


def router_run(rank: int, world: int, port: int, out: str) -> None:
    init(rank, world, port)
    tr = build_router()
    for i, batch in enumerate(router_batches(rank)):
        tr.process_minibatch("a", "clean" if i == 0 else "noisy", batch=batch)
    tr.normalize(); tr.clip(); tr.apply()
    with open(os.path.join(out, f"router{rank}.json"), "w") as f:
        json.dump({"params": params_of(tr)}, f)
    dist.barrier()
    dist.destroy_process_group()


def dying_rank(rank: int, world: int, port: int, out: str) -> None:
    init(rank, world, port, timeout_s=20)
    tr = build()
    tr.step()
    if rank == 1:
        os._exit(3)  # dies without a word
    t0 = time.time()
    try:
        for _ in range(50):
            tr.step()
        msg = "no error"
    except mtlab.MtlabError as exc:
        msg = f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # noqa: BLE001 - reported to the test, which fails on it
        msg = f"UNEXPECTED {type(exc).__name__}: {exc}"
    with open(os.path.join(out, "dying.json"), "w") as f:
        json.dump({"message": msg, "seconds": time.time() - t0}, f)
    os._exit(0)


def mismatched(rank: int, world: int, port: int, out: str) -> None:
    init(rank, world, port)
    try:
        build(numbatches_to_aggregate=2) if rank == 0 else mtlab.distributed.attach(mtlab.Trainer(
            make_models(), [task_a(data(), batch_size=3)], device="cpu"))
        msg = "no error"
    except mtlab.MtlabError as exc:
        msg = f"{type(exc).__name__}: {exc}"
    with open(os.path.join(out, f"mismatch{rank}.json"), "w") as f:
        json.dump({"message": msg}, f)
    dist.barrier()  # both ranks are done talking before either tears the group down
    dist.destroy_process_group()


# ---------------------------------------------------------------------- ranks that make different calls
def sized_data(n_clean: int, n_noisy: int):
    return make_examples(n_clean, 11), make_examples(n_noisy, 12)


def build_sized(sizes: tuple[int, int]) -> mtlab.Trainer:
    """``build()`` over linked sets of the given sizes (the three-rank test picks sizes 3 does not divide)."""
    clean, noisy = sized_data(*sizes)
    a = task_a((clean, noisy), weights=(1.0, 0.4), batch_size=3)
    b = task_b(clean, batch_size=4, weight=0.7)
    tr = mtlab.Trainer(make_models(), [a, b], lr=1e-2, clip_grad_value=0.5, numbatches_to_aggregate=2,
                       device="cpu", seed=3)
    return mtlab.distributed.attach_if_distributed(tr)


# Which (task, linked set) minibatches each rank draws, step by step: tasks on some ranks only, and a rank
# with nothing at all in the last step.
UNION_PLAN = [
    {0: [("a", "clean"), ("a", "noisy")], 1: [("a", "clean"), ("b", "clean")]},
    {0: [("a", "noisy")], 1: [("b", "clean"), ("b", "clean")]},
    {0: [], 1: [("b", "clean"), ("a", "noisy")]},
]


def union_run(rank: int, world: int, port: int, out: str) -> None:
    init(rank, world, port)
    tr = build()
    for plan in UNION_PLAN:
        for t, s in plan[rank]:
            tr.process_minibatch(t, s)
        tr.normalize(); tr.clip(); tr.apply()
    h = tr.history
    with open(os.path.join(out, f"union{rank}.json"), "w") as f:
        json.dump({"params": params_of(tr), "step": tr.step_count,
                   "loss": {t: h[f"{t}/loss"].tolist() for t in ("a", "b")},
                   "minibatches": {t: h[f"{t}/minibatches"].tolist() for t in ("a", "b")},
                   "set_loss": h["a/noisy/loss"].tolist()}, f)
    dist.barrier()
    dist.destroy_process_group()


def _attempt(fn) -> dict:
    t0 = time.time()
    try:
        fn()
        return {"message": "no error", "seconds": time.time() - t0}
    except mtlab.MtlabError as exc:
        return {"message": f"{type(exc).__name__}: {exc}", "seconds": time.time() - t0}


def mismatched_calls(rank: int, world: int, port: int, out: str) -> None:
    init(rank, world, port, timeout_s=60)
    tr = build()
    for t, s in [("a", "clean")] + ([("b", "clean")] if rank == 1 else []):
        tr.process_minibatch(t, s)
    res = {"tasks": _attempt(lambda: tr.normalize("a" if rank == 0 else "b")),
           "calls": _attempt(lambda: tr.normalize() if rank == 0 else tr.clip())}
    res["phases_after_errors"] = {k: str(v) for k, v in tr.phase().items()}
    tr.normalize()  # together now: rank 0 adopts task b
    res["late"] = _attempt(lambda: tr.apply() if rank == 0 else tr.clip())
    tr.clip(); tr.apply()
    res["params"] = params_of(tr)
    with open(os.path.join(out, f"calls{rank}.json"), "w") as f:
        json.dump(res, f)
    dist.barrier()
    dist.destroy_process_group()


UNEVEN_SIZES = (20, 14)  # batches of 3 -> 7 and 5; batches of 4 -> 5: none divides by 3
UNEVEN_STEPS = 3


def uneven_run(rank: int, world: int, port: int, out: str) -> None:
    init(rank, world, port)
    tr = build_sized(UNEVEN_SIZES)
    for _ in range(UNEVEN_STEPS):
        tr.step()
    with open(os.path.join(out, f"uneven{rank}.json"), "w") as f:
        json.dump({"params": params_of(tr), "world": tr.parallel.world_size, "loss": tr.history["a/loss"].tolist()}, f)
    dist.barrier()
    dist.destroy_process_group()


# ---------------------------------------------------------------------- `python tests/helpers/dist_worker.py` under torchrun
def _die_at(step: int, rank: int) -> None:
    """Make worker ``rank`` SIGKILL itself inside step ``step`` of the first attempt (torchrun then restarts)."""
    import signal

    import mtlab.apps.recipe

    build_experiment = mtlab.recipe.from_recipe

    def from_recipe(*args, **kwargs):
        exp = build_experiment(*args, **kwargs)

        def kill(event: str, info: dict) -> None:
            if event == "apply" and info["step"] == step and exp.trainer.parallel.rank == rank:
                os.kill(os.getpid(), signal.SIGKILL)

        if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
            exp.trainer.add_callback(kill)
        return exp

    mtlab.recipe.from_recipe = from_recipe


if __name__ == "__main__":
    import sys

    import mtlab.apps.cli

    argv = sys.argv[1:]
    if argv[0] == "--die-at":
        _die_at(int(argv[1]), int(argv[2]))
        argv = argv[3:]
    sys.exit(mtlab.cli.main(argv))
