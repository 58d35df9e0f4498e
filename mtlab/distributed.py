"""Exact data-parallel accumulation on ``torch.distributed``.

Each rank reads its own shard of every linked set and accumulates locally, with no communication
per minibatch. At ``normalize`` each task's accumulated gradients, summed loss, norm and a
"this rank has a gradient" flag per parameter travel in ONE flat all-reduce (SUM); the result
equals one process that saw the union of the ranks' minibatches. A parameter no rank touched
keeps ``grad None`` everywhere; one touched on some ranks only gets the correct sum everywhere.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from .errors import ConfigError, MtlabError

if TYPE_CHECKING:
    from .trainer import Trainer


class DistributedError(MtlabError, RuntimeError):
    """Ranks that disagree or stopped answering."""


def active() -> bool:
    return dist.is_available() and dist.is_initialized()


def world() -> tuple[int, int]:
    """(rank, world_size) of the default process group, (0, 1) without one."""
    if not active():
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


def fingerprint(trainer: "Trainer") -> str:
    """A hash of what must match across ranks: tasks, parameters and their shapes, settings."""
    desc: dict[str, Any] = {
        "tasks": {n: [list(t.linkedsets), t.batch_size, t.numbuckets, trainer.graphs[n].model_names]
                  for n, t in trainer.tasks.items()},
        "params": {n: list(p.shape) for n, p in trainer.params.items()},
        "settings": [trainer.numbatches_to_aggregate, trainer.normalize_gradients, trainer.nonfinite,
                     trainer.acc_steps, trainer.seed],
    }
    return hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()[:16]


def check_consistent(trainer: "Trainer") -> None:
    """Every rank must build the same trainer; otherwise say which ranks differ."""
    mine = fingerprint(trainer)
    everyone: list[Any] = [None] * trainer.world_size
    try:
        dist.all_gather_object(everyone, {"fingerprint": mine, "world_size": trainer.world_size})
    except RuntimeError as exc:
        raise DistributedError(f"rank {trainer.rank}: could not reach the other ranks at start-up ({exc})") from exc
    prints = [e["fingerprint"] for e in everyone]
    if len(set(prints)) > 1:
        groups: dict[str, list[int]] = {}
        for r, fp in enumerate(prints):
            groups.setdefault(fp, []).append(r)
        raise ConfigError(
            f"ranks built different trainers (recipe, models or settings differ): ranks grouped by trainer "
            f"{list(groups.values())}; start every rank with the same recipe"
        )


def allreduce_task(trainer: "Trainer", task: str) -> None:
    """Sum ``task``'s gradients, loss and norm over the ranks, in place, in one collective."""
    st = trainer._states[task]
    names = trainer.task_params[task]
    params = [trainer.params[n] for n in names]
    grads = st.grads
    dtype = params[0].dtype
    for p in params[1:]:
        dtype = torch.promote_types(dtype, p.dtype)
    sizes = [p.numel() for p in params]
    n_grad = sum(sizes)
    total = n_grad + len(names) + 2
    buf = trainer._flat.get(task)
    if buf is None or buf.numel() != total or buf.dtype != dtype:
        buf = trainer._flat[task] = torch.empty(total, dtype=dtype, device=trainer.device)
    views = [v.view(p.shape) for v, p in zip(buf[:n_grad].split(sizes), params)]
    flags = buf[n_grad : n_grad + len(names)]
    present = [i for i, n in enumerate(names) if n in grads]
    missing = [i for i, n in enumerate(names) if n not in grads]
    if present:
        torch._foreach_copy_([views[i] for i in present], [grads[names[i]] for i in present])
    for i in missing:
        views[i].zero_()
    flags.zero_()
    if present:
        flags[present] = 1
    buf[n_grad + len(names) :].copy_(torch.stack([st.batch_loss.to(dtype), st.batch_loss_norm.to(dtype)]))
    try:
        dist.all_reduce(buf, op=dist.ReduceOp.SUM)
    except RuntimeError as exc:
        raise DistributedError(
            f"rank {trainer.rank}: the all-reduce of task {task!r} at normalize failed ({str(exc).splitlines()[0]}); "
            "another rank probably stopped or died: see its log. The run cannot continue; resume from the last checkpoint"
        ) from exc
    if present:
        torch._foreach_copy_([grads[names[i]] for i in present], [views[i] for i in present])
    if missing:
        used_anywhere = flags.tolist()  # host read: which parameters some other rank touched
        for i in missing:
            if used_anywhere[i] > 0:
                trainer._adopt_grad(task, names[i], views[i].clone())
    loss, norm = buf[n_grad + len(names) :].clone().unbind()
    st._sums = (len(st.records), loss, norm)


def _launch_worker(rank: int, world: int, port: int, recipe: Any, steps: int, out_dir: str, threads: int) -> None:
    import datetime
    import os

    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    try:
        from .recipe import build_trainer

        trainer = build_trainer(recipe)
        for _ in range(steps):
            trainer.step()
        trainer.history.to_csv(os.path.join(out_dir, f"history{rank}.csv"), index=False)
        if rank == 0:
            trainer.save(os.path.join(out_dir, "final.pt"))
        dist.barrier()  # nobody tears the group down while another rank still talks
    finally:
        dist.destroy_process_group()


def launch(recipe: Any, nprocs: int = 2, steps: int = 3, out_dir: str | None = None, threads: int = 1) -> dict[str, Any]:
    """Run ``steps`` data-parallel steps of a recipe on ``nprocs`` CPU processes (gloo), e.g. from a
    notebook, and return each rank's history and rank 0's checkpoint path.

    >>> res = mtlab.distributed.launch("recipes/demo.toml", nprocs=2, steps=2)
    >>> res["history"][0]    # pandas DataFrame of rank 0
    """
    import os
    import socket
    import tempfile

    import pandas as pd
    import torch.multiprocessing as mp

    if not dist.is_available():
        raise ConfigError("this torch build has no torch.distributed")
    if nprocs < 1:
        raise ConfigError(f"nprocs must be >= 1, got {nprocs}")
    out = out_dir or tempfile.mkdtemp(prefix="mtlab-launch-")
    os.makedirs(out, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_launch_worker, args=(nprocs, port, recipe, steps, out, threads), nprocs=nprocs,
                       start_method="spawn")
    from pathlib import Path

    return {"history": {r: pd.read_csv(Path(out) / f"history{r}.csv") for r in range(nprocs)},
            "checkpoint": str(Path(out) / "final.pt"), "out_dir": out}
