"""Does the streamed data path keep up with training? Loader delivery against what one training process consumes.

    python bench/loader.py [--recipe recipes/demo.toml] [--steps 30] [--threads 1] [--workers 0 2]

On the demo recipe (two tasks x two linked sets of the sample corpus, streamed: audio read and collated in
``num_workers`` DataLoader workers, features and targets computed per batch on the trainer's device, here the
CPU), in one process:

- **consumption**: examples/s that training steps use when their batches are ready (each stream replays batches
  drawn and featurized beforehand, so a step is model work only);
- **delivery**, per worker count: examples/s that the linked sets' ``BatchStream`` gives, (a) read + collate
  only, (b) read + collate + features on the device (what a training step waits for);
- **end to end**: examples/s of real training steps with that many workers.

Then the ratio delivery (b) / consumption: the aim is at least 2x, so that the loader is never the step's
bottleneck. Worker start-up (first batch) is left out of the rates and printed apart.
"""
from __future__ import annotations

import argparse
import copy
import itertools
import time
import tomllib
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]


def build(recipe: dict[str, Any], workers: int) -> Any:
    """The experiment of ``recipe`` on the CPU, every linked set streamed with ``workers`` workers, no validation."""
    from mtlab.apps.recipe import from_recipe

    r = copy.deepcopy(recipe)
    r["trainer"].update(device="cpu", valid_frequency=0, go_back=False, valid_adapt=False)
    for task in r["tasks"].values():
        for ls in task["linkedsets"].values():
            ls["data"].update(stream=True, num_workers=workers)
            ls.pop("valid", None)
    return from_recipe(r)


class Replay:
    """A stream that cycles batches drawn beforehand (the trainer reads ``epoch``/``position`` and ``next``)."""

    def __init__(self, batches: list[Any]) -> None:
        self.batches, self.epoch, self.position = batches, 0, 0
        self.skipped: list[dict[str, Any]] = []

    def __iter__(self) -> Replay:
        return self

    def __next__(self) -> Any:
        self.position += 1
        return self.batches[(self.position - 1) % len(self.batches)]


def examples(batch: Any) -> int:
    data, _lengths = batch
    return int(next(iter(data.values())).shape[0])


def consumption(recipe: dict[str, Any], steps: int) -> tuple[float, float]:
    """(examples per step, examples/s) of training steps whose batches are ready."""
    exp = build(recipe, 0)
    trainer = exp.trainer
    keys = [(t.name, s) for t in trainer.tasks.values() for s in t.linkedsets]
    for task, ls in keys:
        stream = trainer.streams.get_stream(trainer.tasks[task], ls)
        trainer.streams[(task, ls)] = Replay([next(stream) for _ in range(4)])
    trainer.step()  # warm-up: allocations, first backward
    before = sum(trainer.streams[k].position for k in keys)
    start = time.perf_counter()
    for _ in range(steps):
        trainer.step()
    seconds = time.perf_counter() - start
    drawn = sum(trainer.streams[k].position for k in keys) - before
    per_batch = sum(examples(b) for k in keys for b in trainer.streams[k].batches) / (4 * len(keys))
    return drawn * per_batch / steps, drawn * per_batch / seconds


def delivery(recipe: dict[str, Any], workers: int, batches: int, featurize: bool) -> tuple[float, float]:
    """(seconds to the first batch of every stream, examples/s after) drawn round-robin from the linked sets'
    streams, as training draws them; ``featurize=False`` stops at the collated audio."""
    from mtlab.tasks.sampling import BatchStream

    exp = build(recipe, workers)
    trainer = exp.trainer
    streams = []
    for task in trainer.tasks.values():
        for ls in task.linkedsets.values():
            stream = BatchStream(ls.examples, task.batch_size, task.numbuckets, seed=0, num_workers=workers)
            if not featurize:
                ls.examples.featurize = lambda batch, device=None: batch  # type: ignore[method-assign]
            streams.append(stream)
    start = time.perf_counter()
    for stream in streams:
        next(stream)
    first = time.perf_counter() - start
    start, count = time.perf_counter(), 0
    for stream in itertools.islice(itertools.cycle(streams), batches):
        count += examples(next(stream))
    rate = count / (time.perf_counter() - start)
    for stream in streams:
        stream._loader_iter = None  # ends the workers
    return first, rate


def end_to_end(recipe: dict[str, Any], workers: int, steps: int) -> float:
    """Examples/s of real training steps with ``workers`` workers per linked set (after two warm-up steps)."""
    exp = build(recipe, workers)
    trainer = exp.trainer
    for _ in range(2):
        trainer.step()
    drawn = lambda: sum(s.position + s.epoch * len(s) for s in trainer.streams.values())
    per_batch = trainer.tasks[next(iter(trainer.tasks))].batch_size
    before, start = drawn(), time.perf_counter()
    for _ in range(steps):
        trainer.step()
    rate = (drawn() - before) * per_batch / (time.perf_counter() - start)
    trainer.streams.clear()
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", type=Path, default=REPO / "recipes" / "demo.toml")
    parser.add_argument("--steps", type=int, default=30, help="training steps per measurement")
    parser.add_argument("--batches", type=int, default=120, help="batches drawn per delivery measurement")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the training process")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    recipe = tomllib.loads(args.recipe.read_text())
    import os

    cores = len(os.sched_getaffinity(0))
    per_step, consumed = consumption(recipe, args.steps)
    print(f"{args.recipe.name}: {per_step:.0f} examples per step; {args.threads} torch thread(s), {cores} CPU cores\n")
    print("| | first batch (s) | examples/s | / consumption |\n|---|---|---|---|")
    print(f"| training consumes (batches ready) | - | {consumed:,.1f} | 1.00 |")
    for workers in args.workers:
        first, raw = delivery(recipe, workers, args.batches, featurize=False)
        print(f"| loader, {workers} workers: read + collate | {first:.2f} | {raw:,.1f} | {raw / consumed:.2f} |")
        first, full = delivery(recipe, workers, args.batches, featurize=True)
        print(f"| loader, {workers} workers: read + collate + features | {first:.2f} | {full:,.1f} | "
              f"{full / consumed:.2f} |")
        trained = end_to_end(recipe, workers, args.steps)
        print(f"| training with the loader, {workers} workers | - | {trained:,.1f} | {trained / consumed:.2f} |",
              flush=True)


if __name__ == "__main__":
    main()
