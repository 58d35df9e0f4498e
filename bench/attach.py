"""What being attachable costs a step, and how soon a change made from a client is in force.

Three measurements, each side by side in one run (the machine's load printed with them):

1. one process, per step: a trainer stepped through the loop's ``between_steps`` of an attachable job (its server
   listening, nobody attached) against the same trainer without (``--no-attach``), the steps taken in turns; and
   with a client attached that reads the history four times a second (a dashboard's pace);
2. the delay from ``job.set`` to the change in force (its journal entry's time), over a socket of this machine,
   while the job steps, in seconds and in minibatches;
3. two gloo ranks (``--ranks``): time per step with the ranks taking the commands together after each minibatch
   and before each step, against the same ranks without.

    python bench/attach.py [--steps 60] [--sets 20] [--ranks]
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import CASES, make_examples, make_models, make_trainer, timed_in_turns  # noqa: E402

import mtlab  # noqa: E402
from mtlab.remote.server import attachable  # noqa: E402
from mtlab.training.schedule import Schedule  # noqa: E402


def build(case: str = "overhead") -> mtlab.Trainer:
    layers, hidden, batch, lo, hi = CASES[case]
    return make_trainer(make_models(layers, hidden), make_examples(64, lo, hi), batch)


def job(trainer: mtlab.Trainer, folder: Path) -> Any:
    """An attachable job's steering around ``trainer`` (its server listening in ``folder``)."""
    exp = SimpleNamespace(trainer=trainer, schedule=Schedule(num_steps=10**9, initial_learning_rate=1e-3),
                          recipe={"name": "bench"})
    return attachable(exp, folder, progress=False)


def step_costs(steps: int, case: str = "overhead") -> dict[str, float]:
    """Seconds per step: ``plain`` (not attachable), ``attachable`` (listening, nobody attached), ``watched`` (a
    client reading the history at 4 Hz in a thread), the three taking turns step by step."""
    plain, ready, watched = build(case), build(case), build(case)
    folders = [Path(tempfile.mkdtemp(prefix="mtlab-bench-attach-")) for _ in range(2)]
    s1, s2 = job(ready, folders[0]), job(watched, folders[1])
    client = mtlab.attach(folders[1], timeout=10, steer=False)
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            client.rows()
            done.wait(0.25)

    reader = threading.Thread(target=watch, daemon=True)
    reader.start()
    try:
        for tr in (plain, ready, watched):
            tr.step()  # warm-up
        return timed_in_turns({"plain": plain.step, "attachable": lambda: (s1.between(), ready.step()),
                               "watched": lambda: (s2.between(), watched.step())}, steps)
    finally:
        done.set()
        reader.join()
        client.detach()
        s1.close("done")
        s2.close("done")


def set_delays(sets: int, case: str = "overhead") -> list[Any]:
    """``sets`` changes of a linked set's weight made through ``job.set`` while the job steps in a thread; the
    ``Applied`` of each (its ``delay_s`` and where it took effect)."""
    tr = build(case)
    folder = Path(tempfile.mkdtemp(prefix="mtlab-bench-attach-"))
    steering = job(tr, folder)
    stop = threading.Event()

    def train() -> None:
        while not stop.is_set():
            steering.between()
            tr.step()

    thread = threading.Thread(target=train, daemon=True)
    thread.start()
    client = mtlab.attach(folder, timeout=10)
    out = []
    try:
        for i in range(sets):
            out.append(client.set("weight", 0.5 + 0.01 * (i + 1), task="tag", linkedset="train"))
            time.sleep(0.05)
    finally:
        client.detach()
        stop.set()
        thread.join()
        steering.close("done")
    return out


def _rank(rank: int, port: int, steps: int, out: str) -> None:
    import torch.distributed as dist

    import mtlab.training.distributed

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=120))
    plain, agreeing = (mtlab.training.distributed.attach(build()) for _ in range(2))
    from mtlab.remote.steering import Steering

    steering = Steering(SimpleNamespace(trainer=agreeing, schedule=None, recipe={}), Path(out).parent, progress=False)
    for tr in (plain, agreeing):
        tr.step()
    spent = {"plain": 0.0, "agreeing": 0.0}
    for i in range(steps):
        for name in (["plain", "agreeing"] if i % 2 == 0 else ["agreeing", "plain"]):
            dist.barrier()
            t0 = time.perf_counter()
            if name == "agreeing":
                steering.between()
                agreeing.step()
            else:
                plain.step()
            spent[name] += time.perf_counter() - t0
    steering.close("done")
    if rank == 0:
        Path(out).write_text(repr({**{k: v / steps for k, v in spent.items()},
                                   "agreements": steering.agreements / (steps + 1)}))
    dist.barrier()
    dist.destroy_process_group()


def rank_costs(steps: int) -> dict[str, float]:
    """Seconds per step of 2 gloo ranks with and without the per-minibatch agreement, and agreements per step."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = Path(tempfile.mkdtemp(prefix="mtlab-bench-attach-")) / "times.txt"
    mp.start_processes(_rank, args=(port, steps, str(out)), nprocs=2, start_method="spawn")
    return dict(eval(out.read_text()))  # noqa: S307 - our own repr of a dict of floats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--sets", type=int, default=20)
    parser.add_argument("--case", choices=sorted(CASES), default="overhead")
    parser.add_argument("--ranks", action="store_true", help="also 2 gloo ranks (two processes)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; case {args.case!r} "
          f"(layers, hidden, batch, lengths: {CASES[args.case]}), 1 torch thread")
    t = step_costs(args.steps, args.case)
    print(f"one process, {args.steps} steps each, in turns:")
    for name in ("plain", "attachable", "watched"):
        print(f"  {name:<11} {t[name] * 1e3:8.2f} ms/step   ratio to --no-attach {t[name] / t['plain']:6.3f}")
    applied = set_delays(args.sets, args.case)
    delays = sorted(a.delay_s for a in applied if a.delay_s is not None)
    print(f"job.set -> in force, {len(delays)} changes while the job steps ({t['plain'] * 1e3:.2f} ms/step): "
          f"median {statistics.median(delays) * 1e3:.1f} ms, max {delays[-1] * 1e3:.1f} ms")
    if args.ranks:
        r = rank_costs(args.steps)
        print(f"2 gloo ranks, {args.steps} steps each, in turns ({r['agreements']:.1f} agreements a step):")
        print(f"  without   {r['plain'] * 1e3:8.2f} ms/step")
        print(f"  agreeing  {r['agreeing'] * 1e3:8.2f} ms/step   ratio {r['agreeing'] / r['plain']:6.3f}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
