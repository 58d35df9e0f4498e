"""Padding fraction of length bucketing, and data-loader throughput, on the sample training split.

    python bench/padding.py [--batch-size 8] [--linkedset clean] [--epochs 3]

Padding fraction = padded frames / all frames of the collated ``features`` over whole epochs
(BatchStream's batches, collated by mtlab.base.batching.collate). Throughput = examples/s drawn through
``torch.utils.data.DataLoader`` with that collate, num_workers 0 and 2, after the first batch (worker
start-up is reported separately), next to the rate at which a training step of the Core
benchmark model (2-layer BLSTM, hidden 128, K=4) consumes examples: the loader must be faster.
"""
from __future__ import annotations

import argparse
import time

import torch

from mtlab.base.batching import collate
from mtlab.data import load_split
from mtlab.tasks.sampling import BatchStream


def padding_fraction(dataset: torch.utils.data.Dataset, batch_size: int, numbuckets: int, epochs: int) -> float:
    """Padded / total frames of ``features`` over ``epochs`` epochs of a seeded BatchStream."""
    stream = BatchStream(dataset, batch_size=batch_size, numbuckets=numbuckets, seed=0)
    padded = total = 0
    for epoch in range(epochs):
        for indices in stream.epoch_batches(epoch):
            data, seq_lengths = collate([dataset[i] for i in indices])
            frames = data["features"].shape[0] * data["features"].shape[1]
            total += frames
            padded += frames - int(seq_lengths["features"].sum())
    return padded / total


def throughput(
    dataset: torch.utils.data.Dataset, batch_size: int, num_workers: int, epochs: int
) -> tuple[float, float]:
    """(seconds to the first batch, examples/s after it) through a shuffling DataLoader with persistent workers."""
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, shuffle=True, collate_fn=collate, num_workers=num_workers,
        persistent_workers=num_workers > 0, generator=torch.Generator().manual_seed(0),
    )
    start = time.perf_counter()
    first = None
    count = 0
    for _ in range(epochs):
        for data, _lengths in loader:
            if first is None:
                first = time.perf_counter()
                continue
            count += data["features"].shape[0]
    return first - start, count / (time.perf_counter() - first)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--linkedset", default="clean")
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()

    start = time.perf_counter()
    train = load_split(split="train", linkedset=args.linkedset)
    load_s = time.perf_counter() - start
    print(f"{train!r}\nloaded in {load_s:.2f} s; lengths {min(train.lengths)}-{max(train.lengths)} frames\n")

    print(f"| numbuckets | padding fraction (batch_size={args.batch_size}) | vs numbuckets=1 |")
    print("|---|---|---|")
    base = None
    for numbuckets in (1, 4, 8):
        frac = padding_fraction(train, args.batch_size, numbuckets, args.epochs)
        base = frac if base is None else base
        print(f"| {numbuckets} | {frac:.3f} | {frac / base:.2f}x |")

    print("\n| loader | first batch (s) | examples/s |\n|---|---|---|")
    start = time.perf_counter()
    for i in range(len(train) * args.epochs):
        train[i % len(train)]
    print(f"| dataset[i] alone | - | {len(train) * args.epochs / (time.perf_counter() - start):,.0f} |")
    rates: dict[int, float] = {}
    for workers in (0, 2):
        latency, rate = throughput(train, args.batch_size, workers, args.epochs)
        print(f"| DataLoader num_workers={workers} (+collate) | {latency:.3f} | {rate:,.0f} |")
        rates[workers] = rate
    consume = training_rate(train, args.batch_size)
    print(f"| training step consumes (BLSTM 2x128, K=4) | - | {consume:,.1f} |")
    print(f"\nloader (0 workers) / training consumption = {rates[0] / consume:,.1f}x: "
          f"{'the loader is not the bottleneck' if rates[0] > consume else 'THE LOADER IS THE BOTTLENECK'}")


def training_rate(train: torch.utils.data.Dataset, batch_size: int, steps: int = 3) -> float:
    """Examples per second a Core-benchmark training step consumes on these features."""
    import mtlab
    from mtlab.models import BLSTM

    torch.manual_seed(0)
    models = {"enc": BLSTM(train[0]["features"].shape[-1], 128, num_layers=2), "head": torch.nn.Linear(256, 3)}
    task = mtlab.Task("frames", [mtlab.Node("h", "enc", ["features"]), mtlab.Node("o", "head", ["h"])],
                      ["features"], ["frame_target"], ["o"],
                      mtlab.losses.CrossEntropy(output="o", target="frame_target"),
                      {"train": mtlab.LinkedSet(train)}, batch_size=batch_size)
    tr = mtlab.Trainer(models, [task], clip_grad_value=1.0, numbatches_to_aggregate=4, device="cpu")
    tr.step()
    start = time.perf_counter()
    for _ in range(steps):
        tr.step()
    return steps * 4 * batch_size / (time.perf_counter() - start)


if __name__ == "__main__":
    main()
