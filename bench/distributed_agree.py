"""Cost of the ranks' agreement before each stepwise call: time per step of 2 gloo ranks with and without it.

The agreement is one all-gather of a few integers per ``step()`` (``normalize``, ``clip`` and ``apply``
called by hand agree one by one: three).

    python bench/distributed_agree.py [--steps 40]
"""

from __future__ import annotations

import argparse
import datetime
import socket
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import mtlab
import mtlab.training.distributed


def build() -> mtlab.Trainer:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    examples = [{"x": torch.randn(int(torch.randint(20, 60, (1,), generator=g)), 40, generator=g),
                 "y": torch.randint(0, 10, (1,), generator=g).squeeze(0)} for _ in range(64)]
    models = {"enc": nn.Sequential(nn.Linear(40, 128), nn.Tanh()), "pool": mtlab.models.build_model("MeanPool"),
              "head": nn.Linear(128, 10)}
    task = mtlab.Task("t", nodes=[mtlab.Node("h", model="enc", inputs=["x"]),
                                  mtlab.Node("p", model="pool", inputs=["h"]),
                                  mtlab.Node("logits", model="head", inputs=["p"])],
                      inputs=["x"], targets=["y"], outputs=["logits"],
                      loss=mtlab.losses.CrossEntropy(output="logits", target="y"),
                      linkedsets={"s": mtlab.LinkedSet(examples)}, batch_size=8)
    return mtlab.distributed.attach(mtlab.Trainer(models, [task], clip_grad_value=1.0, device="cpu",
                                                  numbatches_to_aggregate=2))


def worker(rank: int, port: int, steps: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    times = {}
    for mode in ("agree", "no agreement", "agree ", "no agreement "):  # twice each, interleaved
        tr = build()
        if mode.startswith("no"):
            tr.parallel.reducer.agree = None  # the trainer then skips the agreement
        tr.step()  # warm-up
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(steps):
            tr.step()
        dist.barrier()
        times.setdefault(mode.strip(), []).append((time.perf_counter() - t0) / steps)
    if rank == 0:
        Path(out).write_text(repr({k: min(v) for k, v in times.items()}))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = Path(tempfile.mkdtemp()) / "times.txt"
    mp.start_processes(worker, args=(port, args.steps, str(out)), nprocs=2, start_method="spawn")
    times = eval(out.read_text())  # noqa: S307 - our own repr of a dict of floats
    a, b = times["agree"], times["no agreement"]
    print(f"2 gloo ranks, 1 thread each, {args.steps} steps (best of 2):")
    print(f"  with agreement     {a * 1e3:8.2f} ms/step")
    print(f"  without agreement  {b * 1e3:8.2f} ms/step")
    print(f"  ratio              {a / b:8.3f}x  ({(a - b) * 1e3:+.2f} ms/step for 1 all-gather)")


if __name__ == "__main__":
    main()
