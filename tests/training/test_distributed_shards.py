"""Two ranks reading only their own shards train like one process over the union (gloo, 2 CPU processes)."""

from __future__ import annotations

import json

import pytest
import torch.distributed as dist

from helpers import shard_worker as w
from helpers.distributed import assert_params_close, spawn
from mtlab.base.batching import collate
from mtlab.data import load_split
from mtlab.data.shardwriter import write_shards
from mtlab.tasks.sampling import BatchStream, derived_seed

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built in this torch")]


def test_two_ranks_over_their_own_shards_equal_one_process_over_the_union(tmp_path) -> None:
    folder = write_shards(None, "train", "clean", tmp_path / "shards", shard_size=w.SHARD_SIZE, progress=False)
    spawn(w.train_from_shards, tmp_path)
    ranks = [json.loads((tmp_path / f"shards{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["world"] == 2 and ranks[0]["params"] == ranks[1]["params"]

    # each rank opened the index and shards of its own only (shard i belongs to rank i % 2)
    sharded = load_split(tmp_path / "shards", "train", "clean", targets=("frame_target", "spk"), stream=True)
    files = sharded.files
    assert len(files) == 6
    for r, res in enumerate(ranks):
        read = [f for f in res["opened"] if f.endswith(".tar")]
        assert read and set(read) <= {f for i, f in enumerate(files) if i % 2 == r}, (r, read)
        assert set(res["opened"]) - set(read) == {str(folder / "index.npz")}

    # the oracle: one process reading the corpus's own WAV lists (the streamed path), each step accumulating the
    # union of what both ranks drew
    lists = load_split(None, "train", "clean", targets=("frame_target", "spk"), stream=True, progress=False)
    assert lists.names == sharded.names
    tr = w.build(lists, distributed=False)
    streams = {(t, r): BatchStream(sharded, task.batch_size, task.numbuckets, seed=derived_seed(tr.seed, t, "clean"),
                                   shard=(r, 2)) for t, task in tr.tasks.items() for r in (0, 1)}
    for _ in range(w.STEPS):
        for t in tr.tasks:
            for _ in range(tr.numbatches_to_aggregate):
                for r in (0, 1):
                    indices = streams[(t, r)].next_indices()
                    assert {int(sharded.shard_of[i]) % 2 for i in indices} == {r}
                    batch = lists.featurize(collate([lists.audio(i) for i in indices]), "cpu")
                    tr.process_minibatch(t, "clean", batch=batch)
        tr.normalize(); tr.clip(); tr.apply()
    assert_params_close(ranks[0]["params"], w.params_of(tr))
    assert ranks[0]["loss"] == pytest.approx(tr.history["frames/loss"].tolist(), abs=1e-6)
    for r in (0, 1):  # both ranks stand at the same place of their streams
        assert ranks[r]["positions"] == {f"{t}/clean": streams[(t, r)].state_dict() for t in tr.tasks}
