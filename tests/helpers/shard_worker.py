"""Worker functions of the shard tests: ranks that train from a shard folder (spawned, gloo on CPU)."""

from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist
from torch import nn

import mtlab
import mtlab.data.shards as shards
import mtlab.training.distributed
from helpers import Encoder, MeanPool
from helpers.dist_worker import init, params_of

STEPS = 3
SHARD_SIZE = 20  # the 120 training utterances of data_samples/ as 6 shards: 3 per rank of 2


def build(examples, distributed: bool | None = None) -> mtlab.Trainer:
    """Two tasks over one linked set of speech features: per-frame classes and the utterance's speaker."""
    torch.manual_seed(0)
    models = {"enc": Encoder(129, 8), "frame_head": nn.Linear(8, 3), "pool": MeanPool(), "spk_head": nn.Linear(8, 10)}
    frames = mtlab.Task(
        "frames", nodes=[mtlab.Node("h", model="enc", inputs=["features"]),
                         mtlab.Node("logits", model="frame_head", inputs=["h"])],
        inputs=["features"], targets=["frame_target"], outputs=["logits"],
        loss=mtlab.losses.CrossEntropy(output="logits", target="frame_target"),
        linkedsets={"clean": mtlab.LinkedSet(examples)}, batch_size=3, numbuckets=2)
    spk = mtlab.Task(
        "spk", nodes=[mtlab.Node("h", model="enc", inputs=["features"]),
                      mtlab.Node("pooled", model="pool", inputs=["h"]),
                      mtlab.Node("logits", model="spk_head", inputs=["pooled"])],
        inputs=["features"], targets=["spk"], outputs=["logits"],
        loss=mtlab.losses.CrossEntropy(output="logits", target="spk"),
        linkedsets={"clean": mtlab.LinkedSet(examples)}, batch_size=4, weight=0.5)
    tr = mtlab.Trainer(models, [frames, spk], lr=1e-2, clip_grad_value=0.5, numbatches_to_aggregate=2, device="cpu",
                       seed=5, distributed=False if distributed is False else None)
    return tr if distributed is False else mtlab.distributed.attach_if_distributed(tr)


def train_from_shards(rank: int, world: int, port: int, out: str) -> None:
    init(rank, world, port)
    opened: list[str] = []
    real_open = shards._open_file

    def watched(path: str):  # every read of a shard or index file goes through this function
        opened.append(path)
        return real_open(path)

    shards._open_file = watched
    train = mtlab.data.load_split(os.path.join(out, "shards"), "train", "clean", targets=("frame_target", "spk"),
                                  stream=True)
    tr = build(train)
    for _ in range(STEPS):
        tr.step()
    result = {"params": params_of(tr), "opened": sorted(set(opened)), "world": tr.parallel.world_size,
              "positions": tr.streams.state_dict(), "loss": tr.history["frames/loss"].tolist()}
    with open(os.path.join(out, f"shards{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()
