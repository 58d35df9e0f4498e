"""Data-parallel cost: bytes communicated per optimizer step, and throughput of 2 ranks vs 1.

mtlab all-reduces each task's accumulated gradients once per step (at normalize); DDP without
``no_sync`` all-reduces every parameter's gradient after every minibatch's backward. Both are
counted from the tensors actually handed to the collectives (a DDP comm hook counts its buckets).

    python bench/distributed.py            # gloo on CPU, 2 ranks
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).parent))
import common  # noqa: E402

LAYERS, HIDDEN, BATCH, LO, HI = 1, 64, 8, 30, 120


def _init(rank: int, world: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))


def _count_allreduce() -> dict[str, int]:
    counter = {"bytes": 0, "calls": 0}
    original = dist.all_reduce

    def counting(tensor, *args, **kwargs):
        counter["bytes"] += tensor.numel() * tensor.element_size()
        counter["calls"] += 1
        return original(tensor, *args, **kwargs)

    dist.all_reduce = counting
    return counter


def worker_mtlab(rank: int, world: int, port: int, out: str, steps: int, threads: int) -> None:
    torch.set_num_threads(threads)
    if world > 1:
        _init(rank, world, port)
    examples = common.make_examples(512, LO, HI, seed=1)
    tr = common.make_trainer(common.make_models(LAYERS, HIDDEN), examples, BATCH)
    tr.step()
    counter = _count_allreduce() if world > 1 else {"bytes": 0, "calls": 0}
    t0 = time.perf_counter()
    for _ in range(steps):
        tr.step()
    elapsed = time.perf_counter() - t0
    if rank == 0:
        Path(out).write_text(json.dumps({"seconds": elapsed, "bytes": counter["bytes"] / steps,
                                         "calls": counter["calls"] / steps,
                                         "examples": steps * common.K * BATCH * world}))
    if world > 1:
        dist.destroy_process_group()


def worker_ddp(rank: int, world: int, port: int, out: str, steps: int, threads: int) -> None:
    torch.set_num_threads(threads)
    _init(rank, world, port)
    models = common.make_models(LAYERS, HIDDEN)
    model = torch.nn.ModuleDict(models)
    counter = {"bytes": 0, "calls": 0}

    def hook(state, bucket):
        counter["bytes"] += bucket.buffer().numel() * bucket.buffer().element_size()
        counter["calls"] += 1
        fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
        return fut.then(lambda f: f.value()[0])

    examples = common.make_examples(512, LO, HI, seed=1)
    stream = common.BatchStream(examples, BATCH, 1, seed=rank, shard=(rank, world))

    # DDP syncs in backward of the wrapped forward: run the wrapped module through a tiny adapter.
    class Tagger(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x, lens):
            return self.inner["head"](self.inner["enc"](x, lens))

    ddp = torch.nn.parallel.DistributedDataParallel(Tagger(model))
    ddp.register_comm_hook(None, hook)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)

    def step_ddp():
        opt.zero_grad()
        for _ in range(common.K):
            data, lens = next(stream)
            logits = ddp(data["x"], lens["x"])
            loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), data["y"], reduction="sum")
            loss.backward()
        opt.step()

    step_ddp()
    counter.update(bytes=0, calls=0)
    t0 = time.perf_counter()
    for _ in range(steps):
        step_ddp()
    elapsed = time.perf_counter() - t0
    if rank == 0:
        Path(out).write_text(json.dumps({"seconds": elapsed, "bytes": counter["bytes"] / steps,
                                         "calls": counter["calls"] / steps,
                                         "examples": steps * common.K * BATCH * world}))
    dist.destroy_process_group()


def run(fn, world: int, steps: int, threads: int) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        mp.start_processes(fn, args=(world, port, out, steps, threads), nprocs=world, start_method="spawn")
        return json.loads(Path(out).read_text())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    one = run(worker_mtlab, 1, args.steps, threads=args.threads)
    two = run(worker_mtlab, 2, args.steps, threads=args.threads)
    ddp = run(worker_ddp, 2, args.steps, threads=args.threads)
    params = sum(p.numel() for m in common.make_models(LAYERS, HIDDEN).values() for p in m.parameters())
    print(f"model: {LAYERS}-layer BLSTM hidden {HIDDEN}, {params} parameters; batch {BATCH}, K={common.K}; "
          f"{cores} cores, {args.threads} torch thread(s) per rank")
    print(f"{'':<28}{'bytes/step':>12}{'all-reduces/step':>18}")
    print(f"{'mtlab (2 ranks)':<28}{two['bytes']:>12.0f}{two['calls']:>18.1f}")
    print(f"{'DDP, sync every minibatch':<28}{ddp['bytes']:>12.0f}{ddp['calls']:>18.1f}")
    print(f"communication ratio DDP/mtlab = {ddp['bytes'] / two['bytes']:.2f}")
    r1 = one["examples"] / one["seconds"]
    r2 = two["examples"] / two["seconds"]
    print(f"throughput: 1 rank {r1:.1f} ex/s, 2 ranks {r2:.1f} ex/s, ratio {r2 / r1:.2f} "
          f"(DDP 2 ranks {ddp['examples'] / ddp['seconds']:.1f} ex/s)")


if __name__ == "__main__":
    main()
