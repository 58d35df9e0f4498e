"""Shards against the WAV lists they were written from: write time, size, read throughput, what each rank opens.

Writes the sample corpus's training split (one linked set) as shards, then reads one epoch of minibatches side by
side from the lists (one WAV file per mixture and source) and from the shards (ranged reads of tar members), audio
only and with the features computed, and counts the shard files and bytes each rank of 1, 2 and 4 reads in an epoch.

    python bench/shards.py                      # data_samples/ train/clean, 20 utterances per shard
    python bench/shards.py --shard-size 10 --repeats 5
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from mtlab.base.batching import collate
from mtlab.data import load_split
from mtlab.data.shardwriter import write_shards
from mtlab.tasks.sampling import BatchStream


def epoch_seconds(split, featurize: bool, repeats: int) -> float:
    """Best of ``repeats`` epochs (batches of 8, 4 buckets) of reading, and featurizing if asked."""
    best = float("inf")
    for _ in range(repeats):
        stream = BatchStream(split, 8, 4, seed=0)
        t0 = time.perf_counter()
        for indices in stream.epoch_batches():
            batch = collate([split.audio(i) for i in indices])
            if featurize:
                split.featurize(batch, "cpu")
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--linkedset", default="clean")
    parser.add_argument("--shard-size", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    lists = load_split(None, "train", args.linkedset, stream=True, progress=False)
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        folder = write_shards(None, "train", args.linkedset, out, shard_size=args.shard_size, progress=False)
        written = time.perf_counter() - t0
        shards = load_split(out, "train", args.linkedset, stream=True)
        wav_bytes = sum(Path(e.resolve()).stat().st_size for i in range(len(lists))
                        for e in (lists.row(i).mix, *lists.row(i).sources))
        shard_bytes = sum(p.stat().st_size for p in folder.glob("shard-*.tar"))
        hours = int(lists.samples.sum()) / 8000 / 3600
        print(f"train/{args.linkedset}: {len(lists)} utterances, {hours:.2f} h of mixtures; {len(shards.files)} shards "
              f"of {args.shard_size}; written in {written:.1f} s (statistics cached)")
        print(f"bytes: WAVs {wav_bytes / 1e6:.1f} MB, shards {shard_bytes / 1e6:.1f} MB "
              f"(x{shard_bytes / wav_bytes:.3f}), index {(folder / 'index.npz').stat().st_size / 1e3:.1f} kB")
        for featurize in (False, True):
            a, b = epoch_seconds(lists, featurize, args.repeats), epoch_seconds(shards, featurize, args.repeats)
            what = "read + features" if featurize else "read only     "
            print(f"one epoch, {what}: lists {a:.3f} s, shards {b:.3f} s, shards/lists time x{b / a:.2f}")
        for world in (1, 2, 4):
            opened, read = [], []
            for rank in range(world):
                split = load_split(out, "train", args.linkedset, stream=True)
                stream = BatchStream(split, 8, 4, seed=0, shard=(rank, world))
                for indices in stream.epoch_batches():
                    for i in indices:
                        split.audio(i)
                opened.append(len(split.opened))
                read.append(sum(int(split._size[i].sum()) for b in stream.epoch_batches() for i in set(b)))
            print(f"{world} rank(s): shard files opened per rank {opened} of {len(shards.files)}; bytes read per rank "
                  f"{[round(r / 1e6, 1) for r in read]} MB (x{max(read) / shard_bytes:.2f} of all shards at most)")


if __name__ == "__main__":
    main()
