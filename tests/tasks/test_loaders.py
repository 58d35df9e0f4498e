"""A linked set drawn from one's own DataLoader (mtlab/tasks/loaders.py): each draw its next batch, against a loop
written by hand over the same loader; resume, fork and workers bit for bit; what cannot be restored is refused."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import mtlab
from helpers import make_examples, make_models
from helpers.trainers import ce_sum
from mtlab.base.errors import BatchError, ConfigError
from mtlab.tasks.loaders import LoaderStream, unreproducible

EXAMPLES = make_examples(11, 3)  # variable lengths: dict examples collated by mtlab.collate


def seeded_loader(batch_size: int = 4, seed: int = 7, num_workers: int = 0, loader: type = DataLoader,
                  **kw: object) -> DataLoader:
    return loader(EXAMPLES, batch_size=batch_size, shuffle=True, collate_fn=mtlab.collate,  # type: ignore[call-arg]
                  generator=torch.Generator().manual_seed(seed), num_workers=num_workers, **kw)


def frames_task(loader: DataLoader, **kw: object) -> mtlab.Task:
    return mtlab.Task("a", nodes=[mtlab.Node("h", "enc", ["x"]), mtlab.Node("logits", "head_a", ["h"])],
                      inputs=["x"], targets=["y"], outputs=["logits"],
                      loss=mtlab.losses.CrossEntropy(output="logits", target="y"),
                      linkedsets={"train": mtlab.LinkedSet(loader, **kw)}, batch_size=2)  # type: ignore[arg-type]


def build(loader: DataLoader) -> mtlab.Trainer:
    return mtlab.Trainer(make_models(), frames_task(loader), lr=1e-2, device="cpu")


def params(tr: mtlab.Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in tr.params.items()}


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_each_step_is_the_loaders_next_batch_as_a_plain_loop_over_epochs() -> None:
    steps = 8  # 3 batches an epoch (11 examples, 4 a batch): two epochs and more
    tr = build(seeded_loader())
    for _ in range(steps):
        tr.step()
    models = make_models()
    used = [p for n in ("enc", "head_a") for p in models[n].parameters()]
    opt = torch.optim.Adam(used, lr=1e-2)
    loader, done = seeded_loader(), 0
    while done < steps:
        for batch in loader:  # the loop a PyTorch user writes
            opt.zero_grad()
            loss, norm = ce_sum(models, batch)
            (loss / norm).backward()
            opt.step()
            done += 1
            if done == steps:
                break
    for name, p in tr.params.items():
        if name.startswith(("enc.", "head_a.")):
            m, pn = name.split(".", 1)
            torch.testing.assert_close(p, dict(models[m].named_parameters())[pn], atol=1e-12, rtol=0)
    stream = tr.stream("a", "train")
    assert (stream.epoch, stream.position) == (2, 2)
    assert tr.state("a").records[-1].num_examples == 4  # the loader's batch size, not the task's (2)


def test_resume_from_a_file_mid_epoch_and_at_an_epoch_end_is_bit_for_bit(tmp_path) -> None:  # noqa: ANN001
    for at in (2, 3):  # mid-epoch; at the end of the first epoch (3 batches)
        tr = build(seeded_loader())
        for _ in range(at):
            tr.step()
        tr.save(tmp_path / f"at{at}.pt")
        for _ in range(5):
            tr.step()
        again = build(seeded_loader())
        again.load_checkpoint(tmp_path / f"at{at}.pt")
        for _ in range(5):
            again.step()
        assert_same(params(tr), params(again))


def test_a_fork_draws_what_the_parent_draws_and_changes_nothing_of_it() -> None:
    alone = build(seeded_loader())
    for _ in range(9):
        alone.step()
    tr = build(seeded_loader())
    for _ in range(2):
        tr.step()
    branch = tr.fork("b")
    for _ in range(7):  # in turn, from one DataLoader object: each stream owns its generator's state
        branch.step()
        tr.step()
    assert_same(params(tr), params(alone))
    assert_same(params(branch), params(alone))


def test_a_refused_minibatch_and_a_peek_read_the_same_batch_again() -> None:
    reads = []

    class Counted(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(EXAMPLES)

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            reads.append(i)
            return EXAMPLES[i]

    loader = DataLoader(Counted(), batch_size=4, shuffle=True, collate_fn=mtlab.collate,
                        generator=torch.Generator().manual_seed(7))
    stream = LoaderStream(loader)
    first = next(stream)
    state = stream.state_dict()
    second = next(stream)
    stream.load_state_dict(state)  # a peek: back one batch
    assert all(torch.equal(a, b) for a, b in zip(next(stream)[0].values(), second[0].values()))
    stream.seek(0, 0)  # a refused minibatch goes back to where its draw started
    assert torch.equal(next(stream)[0]["x"], first[0]["x"])
    assert len(reads) == 8  # both batches read once: going back took them from memory


def test_a_loader_shuffled_by_the_global_generator_trains_and_is_refused_at_save_and_fork(tmp_path) -> None:  # noqa: ANN001
    loader = DataLoader(EXAMPLES, batch_size=4, shuffle=True, collate_fn=mtlab.collate)
    assert "global generator" in (unreproducible(loader) or "")
    tr = build(loader)
    tr.step()
    before = params(tr)
    for refused in (lambda: tr.save(tmp_path / "c.pt"), lambda: tr.fork("b"), tr.state_dict):
        with pytest.raises(ConfigError, match=r"linked set 'train'.*generator=torch.Generator\(\).*StatefulDataLoader"):
            refused()
    assert not (tmp_path / "c.pt").exists()
    assert_same(before, params(tr))
    tr.step()  # it goes on training


def test_a_sequential_loader_needs_no_generator(tmp_path) -> None:  # noqa: ANN001
    def loader() -> DataLoader:
        return DataLoader(EXAMPLES, batch_size=4, collate_fn=mtlab.collate)

    assert unreproducible(loader()) is None
    tr = build(loader())
    for _ in range(4):
        tr.step()
    state = tr.state_dict()
    tr.step()
    again = build(loader())
    again.load_state_dict(state)
    again.step()
    assert_same(params(tr), params(again))


def test_stateful_dataloader_resumes_through_its_state_dict(tmp_path) -> None:  # noqa: ANN001
    sdl = pytest.importorskip("torchdata.stateful_dataloader")
    for own in (True, False):  # its sampler's own generator; a seeded one
        def loader(own: bool = own) -> DataLoader:
            if own:
                torch.manual_seed(5)
                return sdl.StatefulDataLoader(EXAMPLES, batch_size=4, shuffle=True, collate_fn=mtlab.collate)
            return seeded_loader(loader=sdl.StatefulDataLoader)

        tr = build(loader())
        for _ in range(4):
            tr.step()
        tr.save(tmp_path / "s.pt")
        for _ in range(4):
            tr.step()
        again = build(loader())
        again.load_checkpoint(tmp_path / "s.pt")
        for _ in range(4):
            again.step()
        assert_same(params(tr), params(again))


def test_tuple_batches_are_named_by_fields_and_refused_unnamed() -> None:
    x, y = torch.randn(6, 3, dtype=torch.float64), torch.randn(6, 2, dtype=torch.float64)
    loader = DataLoader(TensorDataset(x, y), batch_size=4)
    data, lengths = next(LoaderStream(loader, fields=("x", "y")))
    assert torch.equal(data["x"], x[:4]) and torch.equal(data["y"], y[:4])
    assert lengths["x"].tolist() == [3] * 4  # [B, T]: every example full length
    with pytest.raises(BatchError, match=r"fields=\('x0', 'x1'\)"):
        next(LoaderStream(loader))


def test_a_loader_takes_its_own_workers_and_batch_size() -> None:
    with pytest.raises(ConfigError, match="DataLoader.*num_workers=2"):
        mtlab.LinkedSet(seeded_loader(), num_workers=2)
    tr = build(seeded_loader())
    with pytest.raises(ConfigError, match="batch_size=3"):
        tr.stream("a", "train").set_batch_size(3)


@pytest.mark.slow
def test_workers_give_the_same_run_as_none() -> None:
    runs = []
    for workers in (0, 2):
        tr = build(seeded_loader(num_workers=workers))
        for _ in range(5):
            tr.step()
        state = tr.state_dict()  # resumed from in the middle of the second epoch, with workers too
        again = build(seeded_loader(num_workers=workers))
        again.load_state_dict(state)
        for _ in range(2):
            tr.step()
            again.step()
        assert_same(params(tr), params(again))
        runs.append(params(tr))
    assert_same(*runs)


def test_replay_redraws_a_seeded_loader_and_refuses_one_it_cannot() -> None:
    tr = build(seeded_loader())
    for _ in range(5):
        tr.step()
    again = build(seeded_loader())
    mtlab.replay(tr.journal, again)
    assert_same(params(tr), params(again))
    unseeded = build(DataLoader(EXAMPLES, batch_size=4, shuffle=True, collate_fn=mtlab.collate))
    unseeded.step()
    fresh = build(DataLoader(EXAMPLES, batch_size=4, shuffle=True, collate_fn=mtlab.collate))
    with pytest.raises(ConfigError, match=r"replay\(\): task 'a', linked set 'train'.*StatefulDataLoader"):
        mtlab.replay(unseeded.journal, fresh)
    assert fresh.step_count == 0 and fresh.journal.pristine()


def test_evaluate_reads_a_validation_loader_once_through() -> None:
    valid = DataLoader(EXAMPLES, batch_size=5, collate_fn=mtlab.collate)
    tr = mtlab.Trainer(make_models(), frames_task(seeded_loader(), valid=valid), device="cpu")
    loss_sum, normalizer = tr.evaluate_totals("a", "train")
    models = make_models()
    with torch.no_grad():
        sums = [ce_sum(models, batch) for batch in valid]
    assert normalizer == pytest.approx(float(sum(n for _, n in sums)))
    assert loss_sum == pytest.approx(float(sum(s for s, _ in sums)), rel=1e-12)
