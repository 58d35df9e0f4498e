"""Is an accumulated step the big-batch step? mtlab, the loop a user writes, HF Transformers, Accelerate, Lightning.

Every system trains the same small per-frame tagger (Linear 6 -> 16, tanh, Linear 16 -> 5, frame-level
cross-entropy over the valid frames of variable-length sequences, plain SGD at lr 0.5) from the same initial
weights on the same minibatches: 3 sequences a minibatch, K minibatches a step, 3 full windows then a ragged
last one (K/2 minibatches, its last minibatch one sequence short). The reference is plain PyTorch in float64
taking one SGD step on the one big batch each window holds (every frame of the window counted once). A row
says how far a system's weights end from the reference's: the largest absolute difference of any weight, and
that divided by the largest absolute weight. Each row is the worst case over sequence lengths drawn from
[2, 2s] for the spreads s in {1, 3, 10, 30} and K in {1, 2, 4, 8}.

Peers are optional (``pip install "mtlab[bench]"``); a peer that is not installed gets a row saying so.
Each peer is driven through its own documented API:

- HF Transformers: ``Trainer`` with ``gradient_accumulation_steps=K`` on an ``nn.Module`` whose ``forward``
  returns the loss; "with num_items_in_batch" its forward takes ``**kwargs`` and divides the summed loss by
  the ``num_items_in_batch`` the Trainer passes (the window's count of labels that are not -100); "without",
  it returns the minibatch's mean loss (the fallback for models without loss kwargs).
- Accelerate: ``Accelerator(gradient_accumulation_steps=K)``, ``with accelerator.accumulate(model)``,
  ``accelerator.backward(loss)``; "mean loss" as its guide's first example, "num_items recipe" as its guide's
  section on variable-size samples (the window's minibatches read ahead, their label count gathered over the
  processes, summed loss × K × processes / count, one optimizer step a window).
- Lightning: ``Trainer(accumulate_grad_batches=K)``, ``training_step`` returning the minibatch's mean loss.

Two ranks (gloo, two processes started here): each window holds K minibatches a rank; mtlab with
``mtlab.distributed.attach(trainer)``, torch's ``DistributedDataParallel`` with ``no_sync()`` as its docs show
accumulation. bf16 rows run the forward under autocast, against the same float64 reference.

    pip install "mtlab[bench]"
    python bench/accumulation.py                       # the table; --write-docs puts it into docs/benchmarks.md
    python bench/accumulation.py --grid                # also each (spread, K) of every row
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import logging
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import mtlab

DIN, HIDDEN, CLASSES = 6, 16, 5
BATCH = 3  # sequences a minibatch
LR = 0.5
FULL_WINDOWS = 3  # then one ragged window
MIN_LEN = 2
SPREADS = (1, 3, 10, 30)
KS = (1, 2, 4, 8)
IGNORE = -100
DOCS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
COMMAND = "python bench/accumulation.py --write-docs"

Example = dict[str, torch.Tensor]
Minibatch = list[Example]
State = dict[str, torch.Tensor]


# ----------------------------------------------------------------------------- data, model, reference
def make_minibatches(spread: int, k: int, ranks: int = 1, seed: int = 0, ragged: bool = True) -> list[Minibatch]:
    """``FULL_WINDOWS`` windows of ``k * ranks`` minibatches, then (``ragged``) a window of ``max(1, k // 2) *
    ranks`` whose last minibatch holds one sequence less. Lengths are drawn from [MIN_LEN, MIN_LEN * spread];
    the first two sequences are the shortest and the longest, so every spread is reached."""
    g = torch.Generator().manual_seed(seed * 1000 + spread * 10 + k)
    n_mb = (FULL_WINDOWS * k + (max(1, k // 2) if ragged else 0)) * ranks
    hi = MIN_LEN * spread
    out = []
    for i in range(n_mb):
        size = BATCH - 1 if ragged and i == n_mb - 1 else BATCH
        mb = []
        for j in range(size):
            t = (MIN_LEN, hi)[i * BATCH + j] if i * BATCH + j < 2 else int(torch.randint(MIN_LEN, hi + 1, (1,), generator=g))
            mb.append({"x": torch.randn(t, DIN, generator=g), "y": torch.randint(0, CLASSES, (t,), generator=g)})
        out.append(mb)
    return out


def windows(minibatches: list[Minibatch], per_window: int) -> list[list[Minibatch]]:
    return [minibatches[i:i + per_window] for i in range(0, len(minibatches), per_window)]


class Tagger(nn.Module):
    """Per-frame: padding cannot leak between frames, so the big batch is simply every frame of the window."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(DIN, HIDDEN)
        self.out = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.inp(x)))


def initial_state(seed: int = 0) -> State:
    torch.manual_seed(seed)
    return {k: v.detach().clone() for k, v in Tagger().state_dict().items()}


def tagger(state: State, dtype: torch.dtype = torch.float32) -> Tagger:
    m = Tagger().to(dtype)
    m.load_state_dict({k: v.to(dtype) for k, v in state.items()})
    return m


def padded(mb: Minibatch, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [B, T, D]`` zero-padded and ``y [B, T]`` with -100 on the padding (what a user's collate gives)."""
    t = max(e["x"].shape[0] for e in mb)
    x = torch.zeros(len(mb), t, DIN, dtype=dtype)
    y = torch.full((len(mb), t), IGNORE, dtype=torch.long)
    for i, e in enumerate(mb):
        x[i, :e["x"].shape[0]] = e["x"].to(dtype)
        y[i, :e["y"].shape[0]] = e["y"]
    return x, y


def frame_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, reduction: str) -> torch.Tensor:
    return F.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=IGNORE, reduction=reduction)


def reference(state: State, minibatches: list[Minibatch], per_window: int, dtype: torch.dtype = torch.float64) -> State:
    """One SGD step per window on all of its frames at once: the mean loss over every frame of the window."""
    model = tagger(state, dtype)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for win in windows(minibatches, per_window):
        x = torch.cat([e["x"] for mb in win for e in mb]).to(dtype)
        y = torch.cat([e["y"] for mb in win for e in mb])
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return final(model)


def final(model: nn.Module) -> State:
    return {k: v.detach().to(torch.float64).clone() for k, v in model.state_dict().items()}


def difference(got: State, ref: State) -> tuple[float, float]:
    """(largest absolute weight difference, that over the largest absolute reference weight)."""
    dw = max(float((got[k].to(torch.float64) - ref[k]).abs().max()) for k in ref)
    scale = max(float(v.abs().max()) for v in ref.values())
    return dw, dw / scale


# ----------------------------------------------------------------------------- the systems
def run_mtlab(state: State, minibatches: list[Minibatch], k: int, dtype: torch.dtype = torch.float32,
              precision: str = "32") -> State:
    """mtlab's public calls: process_minibatch(batch=...) for each minibatch of a window, then finish()
    (normalize: the summed gradient over the summed frame count, once; apply: one SGD step)."""
    model = tagger(state, dtype)
    examples = [{"x": e["x"].to(dtype), "y": e["y"]} for mb in minibatches for e in mb]
    task = mtlab.Task("tag", nodes=[mtlab.Node("logits", "tagger", ["x"])], inputs=["x"], targets=["y"],
                      outputs=["logits"], loss=mtlab.losses.CrossEntropy(output="logits", target="y"),
                      linkedsets={"train": mtlab.LinkedSet(examples)}, batch_size=BATCH)
    tr = mtlab.Trainer({"tagger": model}, task, lr=LR,
                       optimizer=lambda ps: torch.optim.SGD(ps, lr=LR),
                       numbatches_to_aggregate=k, device="cpu", precision=precision)
    for win in windows(minibatches, k):
        for mb in win:
            tr.process_minibatch("tag", "train", batch=mtlab.collate([{"x": e["x"].to(dtype), "y": e["y"]} for e in mb]))
        tr.finish()
    return final(model)


def run_mean_of_means(state: State, minibatches: list[Minibatch], k: int, dtype: torch.dtype = torch.float32) -> State:
    """The loop most tutorials show: each minibatch's mean loss divided by K, backward, step every K."""
    model = tagger(state, dtype)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for win in windows(minibatches, k):
        opt.zero_grad()
        for mb in win:
            x, y = padded(mb, dtype)
            (frame_loss(model, x, y, "mean") / k).backward()
        opt.step()
    return final(model)


def run_sum_then_divide(state: State, minibatches: list[Minibatch], k: int, dtype: torch.dtype = torch.float32,
                        autocast: torch.dtype | None = None) -> State:
    """The exact loop by hand: summed losses, gradients divided once by the window's frame count."""
    model = tagger(state, dtype)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for win in windows(minibatches, k):
        opt.zero_grad()
        frames = 0
        for mb in win:
            x, y = padded(mb, dtype)
            with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
                logits = model(x)
            F.cross_entropy(logits.flatten(0, 1).to(dtype), y.flatten(), ignore_index=IGNORE,
                            reduction="sum").backward()
            frames += int((y != IGNORE).sum())
        for p in model.parameters():
            p.grad.div_(frames)
        opt.step()
    return final(model)


class _Padded(torch.utils.data.Dataset):
    """Prebuilt padded minibatches, one item each (a DataLoader with ``batch_size=None`` yields them as they are)."""

    def __init__(self, minibatches: list[Minibatch], dtype: torch.dtype = torch.float32) -> None:
        self.items = [padded(mb, dtype) for mb in minibatches]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.items[i]


class _Sequences(torch.utils.data.Dataset):
    """One sequence an item, for HF's Trainer (which batches ``per_device_train_batch_size`` of them)."""

    def __init__(self, minibatches: list[Minibatch]) -> None:
        self.items = [{"x": e["x"], "labels": e["y"]} for mb in minibatches for e in mb]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.items[i]


def _hf_collate(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    x, y = padded([{"x": it["x"], "y": it["labels"]} for it in items])
    return {"x": x, "labels": y}


class HFTaggerItems(nn.Module):
    """The model's forward takes ``**kwargs``, so HF's Trainer passes ``num_items_in_batch`` (the window's
    count of labels that are not -100) and treats the returned loss as already scaled for accumulation."""

    def __init__(self, model: Tagger) -> None:
        super().__init__()
        self.tagger = model

    def forward(self, x: torch.Tensor, labels: torch.Tensor, **kwargs) -> dict[str, torch.Tensor]:
        total = frame_loss(self.tagger, x, labels, "sum")
        n = kwargs.get("num_items_in_batch")
        return {"loss": total / (n if n is not None else (labels != IGNORE).sum())}


class HFTaggerMean(nn.Module):
    """A forward without loss kwargs: HF's Trainer divides the returned minibatch mean by K itself."""

    def __init__(self, model: Tagger) -> None:
        super().__init__()
        self.tagger = model

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": frame_loss(self.tagger, x, labels, "mean")}


def run_transformers(state: State, minibatches: list[Minibatch], k: int, items: bool, bf16: bool = False) -> State:
    from transformers import Trainer, TrainingArguments
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    model = tagger(state)
    wrapped = HFTaggerItems(model) if items else HFTaggerMean(model)
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=BATCH, gradient_accumulation_steps=k,
                                 num_train_epochs=1, learning_rate=LR, lr_scheduler_type="constant",
                                 warmup_steps=0, weight_decay=0.0, max_grad_norm=0.0, optim="sgd",
                                 train_sampling_strategy="sequential", remove_unused_columns=False,
                                 report_to="none", save_strategy="no", logging_strategy="no", use_cpu=True,
                                 disable_tqdm=True, dataloader_num_workers=0, bf16=bf16, seed=0)
        trainer = Trainer(model=wrapped, args=args, train_dataset=_Sequences(minibatches), data_collator=_hf_collate)
        trainer.train()
    return final(model)


def _fresh_accelerator(**kw):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    # Accelerate keeps one process-wide state; each run in this process builds its own
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    return Accelerator(cpu=True, **kw)


def run_accelerate(state: State, minibatches: list[Minibatch], k: int, recipe: str) -> State:
    """``recipe="mean"``: its guide's loop (each minibatch's mean loss; ``backward`` divides by K).
    ``recipe="items"``: its guide's variable-size samples: the window's label count read ahead, summed
    loss × K / count, so that ``backward``'s division by K leaves the summed loss over the window's count."""
    acc = _fresh_accelerator(gradient_accumulation_steps=k)
    model = tagger(state)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    loader = torch.utils.data.DataLoader(_Padded(minibatches), batch_size=None)
    model, opt, loader = acc.prepare(model, opt, loader)
    if recipe == "mean":
        for x, y in loader:
            with acc.accumulate(model):
                acc.backward(frame_loss(model, x, y, "mean"))
                opt.step()
                opt.zero_grad()
    else:
        it = iter(loader)
        for win in windows(minibatches, k):
            samples = [next(it) for _ in win]
            items = acc.gather(sum((y != IGNORE).sum() for _, y in samples)).sum()
            for x, y in samples:
                acc.backward(frame_loss(model, x, y, "sum") * k * acc.num_processes / items)
            opt.step()
            opt.zero_grad()
    return final(acc.unwrap_model(model))


def run_lightning(state: State, minibatches: list[Minibatch], k: int, precision: str = "32-true") -> State:
    import lightning as L

    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    model = tagger(state)

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.tagger = model

        def training_step(self, batch, idx):
            x, y = batch
            return frame_loss(self.tagger, x, y, "mean")

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=LR)

    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, accumulate_grad_batches=k, precision=precision,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its notices about workers and the log interval
        trainer.fit(Module(), torch.utils.data.DataLoader(_Padded(minibatches), batch_size=None))
    return final(model)


# ----------------------------------------------------------------------------- two ranks (gloo)
def _rank_main(rank: int, world: int, port: int, system: str, cases: list, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    results = []
    for state, minibatches, k in cases:
        mine = [mb for win in windows(minibatches, k * world) for mb in win[rank::world]]
        results.append((_mtlab_rank if system == "mtlab" else _ddp_rank)(state, mine, k))
    torch.save(results, os.path.join(out, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


def _mtlab_rank(state: State, mine: list[Minibatch], k: int) -> State:
    import mtlab.training.distributed

    model = tagger(state)
    examples = [e for mb in mine for e in mb]
    task = mtlab.Task("tag", nodes=[mtlab.Node("logits", "tagger", ["x"])], inputs=["x"], targets=["y"],
                      outputs=["logits"], loss=mtlab.losses.CrossEntropy(output="logits", target="y"),
                      linkedsets={"train": mtlab.LinkedSet(examples)}, batch_size=BATCH)
    tr = mtlab.Trainer({"tagger": model}, task, lr=LR,
                       optimizer=lambda ps: torch.optim.SGD(ps, lr=LR),
                       numbatches_to_aggregate=k, device="cpu")
    mtlab.distributed.attach(tr)
    for win in windows(mine, k):
        for mb in win:
            tr.process_minibatch("tag", "train", batch=mtlab.collate(mb))
        tr.finish()
    return final(model)


def _ddp_rank(state: State, mine: list[Minibatch], k: int) -> State:
    """torch's DistributedDataParallel as its docs show accumulation: ``no_sync()`` but for the window's
    last minibatch, each minibatch's mean loss / K; DDP averages the ranks' gradients."""
    model = tagger(state)
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    for win in windows(mine, k):
        opt.zero_grad()
        for i, mb in enumerate(win):
            x, y = padded(mb)
            with ddp.no_sync() if i < len(win) - 1 else contextlib.nullcontext():
                (F.cross_entropy(ddp(x).flatten(0, 1), y.flatten(), ignore_index=IGNORE) / k).backward()
        opt.step()
    return final(model)


def run_ranks(cases: list[tuple[State, list[Minibatch], int]], system: str, world: int = 2) -> list[State]:
    """Each case ``(state, minibatches, k)`` on ``world`` gloo ranks (one start of the processes for all):
    each window holds ``k`` minibatches a rank, rank r taking the window's minibatches r, r + world, ..."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(_rank_main, args=(world, port, system, cases, out), nprocs=world, join=True,
                           start_method="spawn")
        results = [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(world)]
    for per_rank in zip(*results):
        if any(not torch.equal(r[n], per_rank[0][n]) for r in per_rank[1:] for n in r):
            raise RuntimeError(f"{system} on {world} ranks: the ranks' weights differ")
    return list(results[0])


# ----------------------------------------------------------------------------- the table
@dataclass(frozen=True)
class Row:
    system: str
    setting: str
    run: Callable[..., State]  # (state, minibatches, k) -> final state
    needs: str | None = None  # the package a peer needs
    ranks: int = 1  # > 1: ``run`` takes every case at once, [(state, minibatches, k)] -> [State]
    limit: float | None = None  # mtlab's rows: the largest difference allowed (the float floor)
    why: str = ""  # the row's cause, in one sentence


ROWS: tuple[Row, ...] = (
    Row("mtlab", "fp32", lambda s, m, k: run_mtlab(s, m, k), limit=1e-6,
        why="It adds up every minibatch's summed loss and frame count and divides once at the end of the window, "
            "so the step is the big batch's step up to float32 rounding."),
    Row("mtlab", "float64", lambda s, m, k: run_mtlab(s, m, k, torch.float64), limit=1e-12,
        why="The same sums in float64, so only float64 rounding is left."),
    Row("mtlab", "2 ranks (gloo), fp32", lambda cases: run_ranks(cases, "mtlab"), ranks=2, limit=1e-6,
        why="The two processes add their summed gradients and their frame counts together before the one "
            "division, so two ranks give the big batch's step too."),
    Row("mtlab", "bf16-mixed", lambda s, m, k: run_mtlab(s, m, k, precision="bf16-mixed"),
        why="The forward pass runs in bfloat16, which keeps about three significant digits: exactly as far off "
            "as the exact loop under the same autocast, so the drift is bfloat16's, not the accumulation's."),
    Row("plain PyTorch, summed loss / window's frames", "fp32", lambda s, m, k: run_sum_then_divide(s, m, k),
        why="The loop written correctly by hand (sum the losses, count the frames, divide once), at the same "
            "floor as mtlab."),
    Row("plain PyTorch, summed loss / window's frames", "bf16 autocast",
        lambda s, m, k: run_sum_then_divide(s, m, k, autocast=torch.bfloat16),
        why="The exact loop with its forward under bfloat16 autocast: the floor of bf16 rounding."),
    Row("plain PyTorch, mean of per-minibatch means", "fp32", lambda s, m, k: run_mean_of_means(s, m, k),
        why="Each minibatch's mean counts the same, so a frame of a short minibatch weighs more than a frame of "
            "a long one, and the short last window is still divided by K."),
    Row("plain PyTorch, mean of per-minibatch means", "float64",
        lambda s, m, k: run_mean_of_means(s, m, k, torch.float64),
        why="The same in float64: the difference is the recipe's, not rounding."),
    Row("torch DDP, no_sync", "2 ranks (gloo), mean loss / K", lambda cases: run_ranks(cases, "ddp"), ranks=2,
        why="DDP averages the ranks' gradients, and each is already a mean of means, so neither the "
            "minibatches' nor the ranks' frame counts are respected."),
    Row("HF Transformers Trainer", "with num_items_in_batch", lambda s, m, k: run_transformers(s, m, k, True),
        needs="transformers",
        why="The Trainer counts the labels of the whole window before its first forward and passes the count to "
            "a forward that takes **kwargs, which divides the summed loss by it."),
    Row("HF Transformers Trainer", "without num_items_in_batch", lambda s, m, k: run_transformers(s, m, k, False),
        needs="transformers",
        why="A forward without **kwargs gets no count and returns its minibatch's mean, which the Trainer divides "
            "by the number of minibatches in the window: a mean of means."),
    Row("HF Transformers Trainer", "with num_items_in_batch, bf16=True",
        lambda s, m, k: run_transformers(s, m, k, True, bf16=True), needs="transformers",
        why="Exact accumulation, with the bfloat16 forward's rounding on top."),
    Row("Accelerate accumulate()", "mean loss", lambda s, m, k: run_accelerate(s, m, k, "mean"), needs="accelerate",
        why="accelerator.backward divides each minibatch's mean loss by K, also in the short last window: a "
            "mean of means."),
    Row("Accelerate accumulate()", "num_items recipe", lambda s, m, k: run_accelerate(s, m, k, "items"),
        needs="accelerate",
        why="Its guide for variable-size samples reads the window ahead and counts its labels: exact, but the "
            "user writes that loop."),
    Row("Lightning accumulate_grad_batches", "fp32, mean loss", lambda s, m, k: run_lightning(s, m, k),
        needs="lightning",
        why="Lightning divides each training_step's loss by K, also in the short last window, and a "
            "training_step cannot see how many frames the rest of the window holds."),
    Row("Lightning accumulate_grad_batches", "bf16-mixed, mean loss",
        lambda s, m, k: run_lightning(s, m, k, "bf16-mixed"), needs="lightning",
        why="The same mean of means, with bfloat16 rounding on top."),
)


def installed(package: str | None) -> bool:
    if package is None:
        return True
    try:
        __import__(package)
        return True
    except ImportError:
        return False


def measure(row: Row, spread: int, k: int, seed: int = 0, ragged: bool = True) -> tuple[float, float]:
    """One row's difference from the reference on one (spread, K)."""
    return measure_grid(row, [(spread, k)], seed, ragged)[spread, k]


def measure_grid(row: Row, keys: list[tuple[int, int]], seed: int = 0, ragged: bool = True
                 ) -> dict[tuple[int, int], tuple[float, float]]:
    """A row's difference from the reference for each (spread, K) of ``keys`` (``ragged=False``: full windows
    of full minibatches only, so that the lengths alone make the difference)."""
    state = initial_state(seed)
    cases = {key: (state, make_minibatches(key[0], key[1], row.ranks, seed, ragged), key[1]) for key in keys}
    with contextlib.redirect_stdout(io.StringIO()):  # peers' banners and progress lines
        if row.ranks > 1:
            got = dict(zip(keys, row.run(list(cases.values()))))
        else:
            got = {key: row.run(*case) for key, case in cases.items()}
    return {key: difference(got[key], reference(state, mbs, k * row.ranks)) for key, (_, mbs, k) in cases.items()}


@dataclass
class Result:
    row: Row
    grid: dict[tuple[int, int], tuple[float, float]]  # (spread, K) -> (max abs dw, relative)
    note: str = ""

    @property
    def worst(self) -> tuple[float, float]:
        return max(self.grid.values())


def evaluate(rows=ROWS, spreads=SPREADS, ks=KS, seed: int = 0, progress: Callable[[str], None] = lambda s: None
             ) -> list[Result]:
    out = []
    for row in rows:
        if not installed(row.needs):
            out.append(Result(row, {}, f"not installed (pip install {row.needs})"))
            progress(f"{row.system} / {row.setting}: not installed")
            continue
        grid = measure_grid(row, [(s, k) for s in spreads for k in ks], seed)
        out.append(Result(row, grid))
        progress(f"{row.system} / {row.setting}: {max(grid.values())[0]:.2e}")
    return out


def table(results: list[Result]) -> str:
    lines = ["| system | setting | max abs dw | relative to the weights |", "|---|---|---|---|"]
    for r in results:
        if r.note:
            lines.append(f"| {r.row.system} | {r.row.setting} | {r.note} | |")
        else:
            dw, rel = r.worst
            lines.append(f"| {r.row.system} | {r.row.setting} | {dw:.1e} | {rel:.1e} |")
    return "\n".join(lines)


def grid_table(results: list[Result]) -> str:
    keys = sorted({key for r in results for key in r.grid}, key=lambda sk: (sk[0], sk[1]))
    head = "| system | setting | " + " | ".join(f"1:{s}, K={k}" for s, k in keys) + " |"
    lines = [head, "|---|---|" + "---|" * len(keys)]
    for r in results:
        if r.grid:
            lines.append(f"| {r.row.system} | {r.row.setting} | " + " | ".join(f"{r.grid[key][0]:.0e}" for key in keys) + " |")
    return "\n".join(lines)


BEGIN, END = "<!-- bench/accumulation.py: begin -->", "<!-- bench/accumulation.py: end -->"


def write_docs(text: str, path: Path = DOCS) -> None:
    """Replace the block between the markers in docs/benchmarks.md (it must be there once)."""
    doc = path.read_text()
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if len(pattern.findall(doc)) != 1:
        raise SystemExit(f"{path}: expected the markers {BEGIN} ... {END} once")
    path.write_text(pattern.sub(lambda _: f"{BEGIN}\n{text}\n{END}", doc))


def failures(results: list[Result]) -> list[str]:
    return [f"{r.row.system} / {r.row.setting}: {r.worst[0]:.2e} > {r.row.limit:.0e}" for r in results
            if r.row.limit is not None and r.grid and r.worst[0] > r.row.limit]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grid", action="store_true", help="also print each (spread, K) of every row")
    ap.add_argument("--write-docs", action="store_true", help="write the table into docs/benchmarks.md")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    missing = [p for p in ("transformers", "accelerate", "lightning") if not installed(p)]
    if missing:
        print(f"not installed (their rows say so): {missing}; pip install \"mtlab[bench]\"", file=sys.stderr)
    results = evaluate(seed=args.seed, progress=lambda s: print(s, file=sys.stderr, flush=True))
    text = table(results)
    print(text)
    if args.grid:
        print()
        print(grid_table(results))
    if args.write_docs:
        versions = ", ".join(f"{p} {__import__(p).__version__}" for p in ("torch", "transformers", "accelerate", "lightning")
                             if installed(p))
        write_docs(f"`{COMMAND}` ({versions}; worst case over spreads {'/'.join(map(str, SPREADS))} and K "
                   f"{'/'.join(map(str, KS))}):\n\n{text}")
    bad = failures(results)
    if bad:
        sys.exit("mtlab above the float floor:\n" + "\n".join(bad))


if __name__ == "__main__":
    main()
