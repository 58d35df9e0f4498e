"""Length bucketing and stream positions."""

from __future__ import annotations

import pytest
import torch

from mtlab.base.batching import collate
from mtlab.tasks.sampling import BatchStream, bucket_batches


def examples(n=53, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [{"x": torch.randn(int(torch.randint(5, 300, (1,), generator=g)), 3), "id": torch.tensor(i)} for i in range(n)]


def test_collate_pads_with_zeros_and_reports_exact_lengths():
    ex = [{"x": torch.ones(3, 2), "c": torch.tensor(4)}, {"x": 2 * torch.ones(5, 2), "c": torch.tensor(1)}]
    data, lens = collate(ex)
    assert data["x"].shape == (2, 5, 2) and lens["x"].tolist() == [3, 5]
    assert torch.equal(data["x"][0, 3:], torch.zeros(2, 2)) and torch.equal(data["x"][0, :3], torch.ones(3, 2))
    assert data["c"].tolist() == [4, 1] and lens["c"].tolist() == [1, 1]


def test_buckets_never_mix_and_cover_every_example_once_per_epoch():
    ex = examples()
    lengths = [e["x"].shape[0] for e in ex]
    order = sorted(range(len(ex)), key=lambda i: (lengths[i], i))
    nb = 4
    bounds = [round(k * len(ex) / nb) for k in range(nb + 1)]
    bucket_of = {i: k for k in range(nb) for i in order[bounds[k]:bounds[k + 1]]}
    for epoch in range(3):
        batches = bucket_batches(lengths, 6, nb, seed=1, epoch=epoch)
        flat = sorted(i for b in batches for i in b)
        assert flat == list(range(len(ex)))
        for b in batches:
            assert len({bucket_of[i] for i in b}) == 1
    assert bucket_batches(lengths, 6, nb, 1, 0) == bucket_batches(lengths, 6, nb, 1, 0)
    assert bucket_batches(lengths, 6, nb, 1, 0) != bucket_batches(lengths, 6, nb, 2, 0)
    assert bucket_batches(lengths, 6, nb, 1, 0) != bucket_batches(lengths, 6, nb, 1, 1)


def test_bucketing_reduces_padding():
    ex = examples(200)
    lengths = [e["x"].shape[0] for e in ex]

    def padding(nb):
        pad = tot = 0
        for b in bucket_batches(lengths, 8, nb, 0, 0):
            m = max(lengths[i] for i in b)
            pad += sum(m - lengths[i] for i in b)
            tot += m * len(b)
        return pad / tot

    assert padding(8) < padding(4) < padding(1)


def test_stream_is_endless_and_position_restores_exactly():
    ex = examples(20)
    s = BatchStream(ex, batch_size=6, numbuckets=2, seed=3)
    assert len(s) == 4  # two buckets of 10 -> 2 batches each
    seen = []
    for _ in range(len(s)):
        seen += next(s)[0]["id"].tolist()
    assert sorted(seen) == list(range(20)) and s.epoch == 0
    next(s)
    assert s.epoch == 1
    state = s.state_dict()
    a = [next(s)[0]["id"].tolist() for _ in range(6)]
    s.load_state_dict(state)
    b = [next(s)[0]["id"].tolist() for _ in range(6)]
    assert a == b
    fresh = BatchStream(ex, batch_size=6, numbuckets=2, seed=3)
    fresh.load_state_dict(state)
    assert [next(fresh)[0]["id"].tolist() for _ in range(6)] == a


@pytest.mark.slow
def test_stream_with_dataloader_workers_matches_in_process():
    ex = examples(30)
    s0 = BatchStream(ex, batch_size=4, numbuckets=3, seed=5)
    s2 = BatchStream(ex, batch_size=4, numbuckets=3, seed=5, num_workers=2)
    for _ in range(12):  # crosses an epoch boundary
        a, b = next(s0), next(s2)
        assert torch.equal(a[0]["id"], b[0]["id"]) and torch.equal(a[0]["x"], b[0]["x"])
    state = s2.state_dict()
    nxt = next(s0)
    s2.load_state_dict(state)
    assert torch.equal(next(s2)[0]["id"], nxt[0]["id"])
