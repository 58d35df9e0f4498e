"""mtlab against the loop a user writes, PyTorch Lightning and Accelerate, all in one run.

K = 4 minibatches per optimizer step, clip by value 1.0, Adam (lr 1e-3), variable-length sequences, per-frame
classes (40-dim inputs). Two kinds of case:

- **The loop a user writes** (``overhead``, ``compute``): a ``torch.nn.LSTM`` (bidirectional) and a linear head
  on zero-padded batches, all built before any timing. The baseline is plain PyTorch with no mtlab code in it:
  padded targets are -100, ``F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100,
  reduction="sum")``, gradients divided once by the window's frame count, ``clip_grad_value_``, torch's
  ``Adam``. mtlab gets the same model and the same minibatches through its public API: each made once, before
  any timing, the way a user makes a batch for mtlab (``mtlab.collate`` of the examples, which makes the frame
  mask with it), then ``process_minibatch(task, linkedset, batch=...)`` for each minibatch and ``finish()``;
  Accelerate and Lightning get the padded batches too.
- **With packing and streaming** (``overhead-streaming``, ``compute-streaming``, ``multitask``): every system
  runs mtlab's ``BLSTM`` (packed sequences) and draws its batches from mtlab's ``BatchStream`` inside the
  timed region (``bench/common.py``: ``UserLoop``), which adds the same fixed cost to every system.

Cases (layers, hidden, batch, lengths):

- overhead, overhead-streaming:  1-layer BLSTM, hidden 16,  batch 4,  lengths 5-20   (overhead-bound)
- compute, compute-streaming:    1-layer BLSTM, hidden 128, batch 16, lengths 50-150 (compute-bound: the
                                 LSTM's kernels dominate; sized so that a run fits in minutes on one thread)
- multitask: two tasks sharing a 1-layer BLSTM encoder (hidden 64, batch 8, lengths 20-100), mtlab
             against the loop a user writes for it (per-task gradients, normalize, clip, combine);
             Lightning and Accelerate have no such loop of their own: not measured

Times: every system draws the same batches in the same round, so a system's ratio is the median over
rounds of time(system) / time(loop) in that round; ``spread`` is the half-range of those per-round ratios
(how noisy the machine was). Within a round mtlab, the loop and Accelerate take turns step by step (the order
rotating), so a burst of load from other processes falls on all of them alike. On the CPU the clock is the process's CPU time by default
(``--clock wall`` for wall time): with one torch thread it is the work done, which other processes on a
shared machine disturb far less than the wall clock; on a GPU it is wall time with a synchronize. Lightning runs one ``fit`` per round on the round's
batches, pre-collated (its start-up and first step excluded). Peak tensor memory: parameters, gradients,
optimizer state and every allocation of one step (torch profiler on CPU, the CUDA allocator's peak on
a GPU). One torch thread unless MTLAB_BENCH_THREADS is set.

    pip install "mtlab[bench]"            # Lightning and Accelerate (optional: missing ones are reported)
    python bench/peers.py                 # all cases
    python bench/peers.py --case overhead --rounds 9
    python bench/peers.py --device cuda   # on a GPU (bench/gpu_check.py runs this)
    python bench/peers.py --precision bf16   # every system in bf16-mixed: mtlab's precision=, the AMP loop
                                             # (autocast), Lightning's precision=, Accelerate's mixed_precision=
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
import common  # noqa: E402

import mtlab  # noqa: E402
from mtlab.base.batching import to_device  # noqa: E402
from mtlab.models import BLSTM, MeanPool  # noqa: E402
from mtlab.tasks.sampling import BatchStream  # noqa: E402

K = common.K
LOOP = "loop"
SYSTEMS = ("mtlab", LOOP, "lightning", "accelerate")
SETTINGS = {
    # case: (layers, hidden, batch, min_len, max_len, steps per round)
    "overhead": (1, 16, 4, 5, 20, 40),  # the loop a user writes: nn.LSTM, padded batches built before timing
    "compute": (1, 128, 16, 50, 150, 2),
    "overhead-streaming": (1, 16, 4, 5, 20, 40),  # with packing and streaming: mtlab's BLSTM and BatchStream
    "compute-streaming": (1, 128, 16, 50, 150, 2),
    "multitask": (1, 64, 8, 20, 100, 6),
}
PLAIN = ("overhead", "compute")  # the cases of the loop a user writes; the others run with packing and streaming
IGNORE = common.IGNORE
SPK = 6


def batches_for(examples, batch: int, n: int, offset: int = 0) -> list:
    stream = BatchStream(examples, batch, 1, seed=mtlab.sampling.derived_seed(0, "tag", "train"))
    return [next(stream) for _ in range(offset + n)][offset:]


def available(name: str) -> bool:
    try:
        __import__(name)
        return True
    except ImportError:
        return False


# ----------------------------------------------------------------------------- single task systems
class System:
    """A step function plus what peak-memory accounting needs (parameters, optimizers, extra buffers, and
    ``settle``: what the step would free first anyway, done before measuring, since the CPU profiler does not
    see the freeing of tensors allocated before it started)."""

    def __init__(self, step: Callable[[], None], params=(), optimizers=(), extra=lambda: (),
                 settle: Callable[[], None] = lambda: None) -> None:
        self.step, self.params, self.optimizers, self.extra = step, list(params), list(optimizers), extra
        self.settle = settle


def system_mtlab(models, examples, batch, device, precision: str = "32") -> System:
    tr = common.make_trainer(models, examples, batch, device=device, precision=precision)
    return System(tr.step, tr.params.values(), [tr.optimizer],
                  lambda: [b for t in tr.tasks for b in tr.state(t).buffers] + tr.update.buffers())


def system_loop(models, examples, batch, device, precision: str = "32") -> System:
    loop = common.UserLoop(models, examples, batch, device=device, precision=precision)
    return System(loop.step, loop.params, [loop.opt], settle=loop.opt.zero_grad)


def system_accelerate(models, examples, batch, device, precision: str = "32") -> System:
    acc = _accelerator(device, precision)
    model = nn.ModuleDict(models)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model, opt = acc.prepare(model, opt)
    stream = BatchStream(examples, batch, 1, seed=mtlab.sampling.derived_seed(0, "tag", "train"))

    def step() -> None:
        for _ in range(K):
            data, lens = next(stream)
            x, y, n = data["x"].to(acc.device), data["y"].to(acc.device), lens["y"].to(acc.device)
            with acc.accumulate(model):
                loss, count = common.user_frame_loss(model["head"](model["enc"](x, n)), y, n)
                acc.backward(loss / count)
                if acc.sync_gradients:
                    acc.clip_grad_value_(model.parameters(), 1.0)
                opt.step()
                opt.zero_grad()

    return System(step, model.parameters(), [opt], settle=opt.zero_grad)


def run_lightning(models, examples, batch, steps: int, device: str, offset_steps: int = 0,
                  clock: Callable[[], float] = time.perf_counter, precision: str = "32",
                  plain: list[Padded] | None = None) -> list[float]:
    """Seconds per optimizer step of a Lightning fit (start-up and its first step excluded); the
    measured steps use the batches the other systems use in the same round. With ``plain`` (prebuilt padded
    batches), ``models`` is the user's one model and ``training_step`` takes those batches as they are."""
    import lightning as L

    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)  # its start-up tips and notices, once per round

    class Tagger(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.enc, self.head = models["enc"], models["head"]

        def training_step(self, b, idx):
            data, lens = b
            loss, count = common.user_frame_loss(self.head(self.enc(data["x"], lens["x"])), data["y"], lens["y"])
            return loss / count

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    class PlainModule(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.tagger = models

        def training_step(self, b, idx):
            x, y, _ = b
            loss = F.cross_entropy(self.tagger(x).flatten(0, 1), y.flatten(), ignore_index=IGNORE, reduction="sum")
            return loss / (y != IGNORE).sum()

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    stamps: list[float] = []

    class Clock(L.Callback):
        def on_train_batch_end(self, trainer, module, outputs, b, idx):
            if (idx + 1) % K == 0:
                if device == "cuda":
                    torch.cuda.synchronize()
                stamps.append(clock())

    n = (steps + 1) * K
    if plain is None:
        items, module = batches_for(examples, batch, n, offset=offset_steps * K), Tagger()
    else:
        items, module = [plain[(offset_steps * K + i) % len(plain)] for i in range(n)], PlainModule()
    loader = torch.utils.data.DataLoader(_Fixed(items), batch_size=None)
    trainer = L.Trainer(accelerator="gpu" if device == "cuda" else "cpu", devices=1, max_steps=steps + 1,
                        accumulate_grad_batches=K, gradient_clip_val=1.0, gradient_clip_algorithm="value",
                        precision={"32": "32-true"}.get(precision, precision),
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, callbacks=[Clock()])
    trainer.fit(module, loader)
    return [b - a for a, b in zip(stamps, stamps[1:])]


class _Fixed(torch.utils.data.Dataset):
    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


# ----------------------------------------------------------------------------- the loop a user writes
class PlainTagger(nn.Module):
    """The user's model: torch's bidirectional LSTM on zero-padded batches (no packing), a linear head per frame."""

    def __init__(self, layers: int, hidden: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(common.DIN, hidden, num_layers=layers, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * hidden, common.CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(x)[0])


def plain_model(layers: int, hidden: int, seed: int = 0) -> PlainTagger:
    torch.manual_seed(seed)
    return PlainTagger(layers, hidden)


Padded = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # x [B, T, D], y [B, T] (-100 on padding), lengths [B]


def plain_batches(batch: int, lo: int, hi: int, device: str, n: int = 64, seed: int = 1) -> list[Padded]:
    """``n`` zero-padded minibatches, built once, before any timing (what a user's collate_fn gives)."""
    examples = common.make_examples(n * batch, lo, hi, seed=seed)
    out = []
    for i in range(n):
        chunk = examples[i * batch:(i + 1) * batch]
        lengths = torch.tensor([e["x"].shape[0] for e in chunk])
        x = torch.zeros(batch, int(lengths.max()), common.DIN)
        y = torch.full((batch, int(lengths.max())), IGNORE, dtype=torch.long)
        for j, e in enumerate(chunk):
            x[j, :len(e["y"])] = e["x"]
            y[j, :len(e["y"])] = e["y"]
        out.append((x.to(device), y.to(device), lengths.to(device)))
    return out


def cycle(batches: list[Padded]):
    """The prebuilt batches over and over; each system holds its own, so all draw the same ones in lockstep."""
    while True:
        yield from batches


def plain_trainer(model: nn.Module, batch: int, device: str, precision: str = "32") -> mtlab.Trainer:
    """mtlab's trainer for the loop a user writes: one task on the user's model, K minibatches per step."""
    task = mtlab.Task("tag", nodes=[mtlab.Node("logits", "tagger", ["x"])], inputs=["x"], targets=["y"],
                      outputs=["logits"], loss=mtlab.losses.CrossEntropy(output="logits", target="y"),
                      linkedsets={"train": mtlab.LinkedSet(None)},  # no stream: every batch is given
                      batch_size=batch)
    return mtlab.Trainer({"tagger": model}, [task], lr=1e-3, clip_grad_value=1.0, numbatches_to_aggregate=K,
                         device=device, seed=0, precision=precision)


def collated(batches: list[Padded], device: str) -> list:
    """The same minibatches the public way a user builds them for mtlab: each example cut from the padded batch,
    ``mtlab.collate`` (zero-padded, with their lengths and frame masks), moved to ``device``; built once."""
    out = []
    for x, y, n in batches:
        x, y = x.cpu(), y.cpu()
        chunk = [{"x": x[i, :t], "y": y[i, :t]} for i, t in enumerate(n.tolist())]
        out.append(to_device(mtlab.collate(chunk), torch.device(device)))
    return out


def plain_mtlab(model: nn.Module, batches: list[Padded], batch: int, device: str, precision: str = "32") -> System:
    """The same model and minibatches through mtlab's public calls: K ``process_minibatch(batch=...)`` on batches
    made by ``mtlab.collate`` before any timing, then ``finish()`` (normalize by the window's frames, clip, one Adam
    step)."""
    tr = plain_trainer(model, batch, device, precision)
    it = cycle(collated(batches, device))

    def step() -> None:
        for _ in range(K):
            tr.process_minibatch("tag", "train", batch=next(it))
        tr.finish()

    return System(step, tr.params.values(), [tr.optimizer],
                  lambda: [b for t in tr.tasks for b in tr.state(t).buffers] + tr.update.buffers())


def plain_loop(model: nn.Module, batches: list[Padded], batch: int, device: str, precision: str = "32") -> System:
    """The loop a user writes: summed frame losses over K minibatches, divided once by the frame count,
    ``clip_grad_value_``, Adam; under bf16-mixed the forward under ``autocast``. No mtlab code."""
    model = model.to(device)
    params = list(model.parameters())
    opt = torch.optim.Adam(params, lr=1e-3)
    dtype = common.AUTOCAST[precision]
    kind = torch.device(device).type
    it = cycle(batches)

    def step() -> None:
        opt.zero_grad()
        frames = 0
        for _ in range(K):
            x, y, _ = next(it)
            with torch.autocast(kind, dtype=dtype, enabled=dtype is not None):
                logits = model(x)
            F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=IGNORE, reduction="sum").backward()
            frames = frames + (y != IGNORE).sum()
        for p in params:
            p.grad.div_(frames)
        torch.nn.utils.clip_grad_value_(params, 1.0)
        opt.step()

    return System(step, params, [opt], settle=opt.zero_grad)


def plain_accelerate(model: nn.Module, batches: list[Padded], batch: int, device: str, precision: str = "32") -> System:
    """Accelerate's accumulate() on the same model and prebuilt batches (each minibatch's summed loss over its
    frame count, as its guide's loop)."""
    acc = _accelerator(device, precision)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model, opt = acc.prepare(model, opt)
    it = cycle(batches)

    def step() -> None:
        for _ in range(K):
            x, y, _ = next(it)
            with acc.accumulate(model):
                with acc.autocast():
                    logits = model(x)
                loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=IGNORE, reduction="sum")
                acc.backward(loss / (y != IGNORE).sum())
                if acc.sync_gradients:
                    acc.clip_grad_value_(model.parameters(), 1.0)
                opt.step()
                opt.zero_grad()

    return System(step, model.parameters(), [opt], settle=opt.zero_grad)


def _accelerator(device: str, precision: str):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    # Accelerate keeps one process-wide state; a new precision in the same process needs it cleared first
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    mixed = {"32": "no", "bf16-mixed": "bf16", "16-mixed": "fp16"}[precision]
    return Accelerator(gradient_accumulation_steps=K, cpu=device == "cpu", mixed_precision=mixed)


# ----------------------------------------------------------------------------- multi-task systems
def mt_models(hidden: int, seed: int = 0) -> dict[str, nn.Module]:
    torch.manual_seed(seed)
    return {"enc": BLSTM(common.DIN, hidden), "frames": nn.Linear(2 * hidden, common.CLASSES),
            "pool": MeanPool(), "spk": nn.Linear(2 * hidden, SPK)}


def mt_examples(n, lo, hi):
    ex = common.make_examples(n, lo, hi, seed=2)
    g = torch.Generator().manual_seed(3)
    for e in ex:
        e["spk"] = torch.randint(0, SPK, (), generator=g)
    return ex


def mt_mtlab(models, examples, batch, device, precision: str = "32") -> System:
    n = mtlab.Node
    frames = mtlab.Task("frames", [n("h", "enc", ["x"]), n("o", "frames", ["h"])], ["x"], ["y"], ["o"],
                        mtlab.losses.CrossEntropy(output="o", target="y"),
                        {"train": mtlab.LinkedSet(examples)}, batch_size=batch)
    spk = mtlab.Task("spk", [n("h", "enc", ["x"]), n("p", "pool", ["h"]), n("o", "spk", ["p"])], ["x"], ["spk"], ["o"],
                     mtlab.losses.CrossEntropy(output="o", target="spk"),
                     {"train": mtlab.LinkedSet(examples)}, batch_size=batch, weight=0.5)
    tr = mtlab.Trainer(models, [frames, spk], lr=1e-3, clip_grad_value=1.0, numbatches_to_aggregate=K, device=device,
                       precision=precision)
    return System(tr.step, tr.params.values(), [tr.optimizer],
                  lambda: [b for t in tr.tasks for b in tr.state(t).buffers] + tr.update.buffers())


def mt_loop(models, examples, batch, device, precision: str = "32") -> System:
    """Two tasks as a user writes them: each task's gradients accumulated and kept, normalized and
    clipped, then the shared encoder's gradient is their weighted sum (bf16: forward and loss under
    autocast; fp16 would need a scaler per task: not measured)."""
    dtype = common.AUTOCAST[precision]
    enc, fr, pool, sp = (models[k].to(device) for k in ("enc", "frames", "pool", "spk"))
    params = list(enc.parameters()) + list(fr.parameters()) + list(sp.parameters())
    opt = torch.optim.Adam(params, lr=1e-3)
    s_fr = BatchStream(examples, batch, 1, seed=mtlab.sampling.derived_seed(0, "frames", "train"))
    s_sp = BatchStream(examples, batch, 1, seed=mtlab.sampling.derived_seed(0, "spk", "train"))
    enc_params = list(enc.parameters())

    def task_grads(stream, forward, own):
        for p in enc_params + own:
            p.grad = None
        norm = 0
        for _ in range(K):
            data, lens = next(stream)
            data = {k: v.to(device) for k, v in data.items()}
            lens = {k: v.to(device) for k, v in lens.items()}
            with torch.autocast(torch.device(device).type, dtype=dtype, enabled=dtype is not None):
                loss, n = forward(data, lens)
            loss.backward()
            norm = norm + n
        grads = [p.grad for p in enc_params + own]
        for g in grads:
            g.div_(norm)
        torch.nn.utils.clip_grad_value_(enc_params + own, 1.0)
        return grads

    def f_fr(data, lens):
        return common.user_frame_loss(fr(enc(data["x"], lens["x"])), data["y"], lens["y"])

    def f_sp(data, lens):
        logits = sp(pool(enc(data["x"], lens["x"]), lens["x"]))
        return F.cross_entropy(logits, data["spk"], reduction="sum"), data["spk"].shape[0]

    def step() -> None:
        ga = task_grads(s_fr, f_fr, list(fr.parameters()))
        gb = task_grads(s_sp, f_sp, list(sp.parameters()))
        ne = len(enc_params)
        for i, p in enumerate(enc_params):
            p.grad = ga[i] + 0.5 * gb[i]
        for p, g in zip(fr.parameters(), ga[ne:]):
            p.grad = g
        for p, g in zip(sp.parameters(), gb[ne:]):
            p.grad = g * 0.5
        opt.step()

    return System(step, params, [opt])


# ----------------------------------------------------------------------------- driver
def build(system: str, case: str, device: str, precision: str = "32") -> System:
    layers, hidden, batch, lo, hi, _ = SETTINGS[case]
    if case == "multitask":
        fn = {"mtlab": mt_mtlab, LOOP: mt_loop}[system]
        return fn(mt_models(hidden), mt_examples(256, lo, hi), batch, device, precision)
    if case in PLAIN:
        plain = {"mtlab": plain_mtlab, LOOP: plain_loop, "accelerate": plain_accelerate}[system]
        return plain(plain_model(layers, hidden), plain_batches(batch, lo, hi, device), batch, device, precision)
    builders = {"mtlab": system_mtlab, LOOP: system_loop, "accelerate": system_accelerate}
    return builders[system](common.make_models(layers, hidden), common.make_examples(256, lo, hi, seed=1), batch,
                            device, precision)


def synced(step: Callable[[], None], device: str) -> Callable[[], None]:
    if device != "cuda":
        return step

    def run() -> None:
        step()
        torch.cuda.synchronize()

    return run


_WARMED: set[tuple[str, str]] = set()


def warm_cuda_libraries(case: str, precision: str) -> None:
    """Run the loop's step once before any GPU memory is measured: cuBLAS and cuDNN allocate their workspaces
    (2 x 32 MB on an H200) on first use and keep them, which would otherwise be charged to whichever system
    is measured first."""
    if (case, precision) not in _WARMED:
        s = build(LOOP, case, "cuda", precision)
        s.step()
        s.step()
        torch.cuda.synchronize()
        del s
        _WARMED.add((case, precision))


def peak_memory(system: str, case: str, device: str, precision: str = "32") -> int:
    """Peak tensor bytes of one step after one warm-up step (each system built afresh; on a GPU, counted
    from what was allocated before it was built, so other live objects do not count)."""
    if device == "cuda":
        warm_cuda_libraries(case, precision)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
    s = build(system, case, device, precision)
    s.step()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        s.step()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        s.settle()
        peak = common.peak_step_bytes(s.step, s.params, s.optimizers, s.extra)
    del s
    return peak


def run_case(case: str, rounds: int, device: str, steps: int | None = None,
             clock: Callable[[], float] = time.perf_counter, precision: str = "32",
             lightning: bool = True) -> list[dict]:
    """One row per system: ms/step, ratio to the loop (median of per-round ratios) and its spread,
    peak tensor memory and its ratio to the loop's."""
    layers, hidden, batch, lo, hi, default_steps = SETTINGS[case]
    steps = steps or default_steps
    single = case != "multitask"
    names = ["mtlab", LOOP] + (["accelerate"] if single and available("accelerate") else [])
    if case in ("multitask", *PLAIN) and precision == "16-mixed":  # their loops have no GradScaler
        return [{"case": case, "system": n, "note": "not measured (fp16)"} for n in SYSTEMS]
    systems = {n: build(n, case, device, precision) for n in names}
    fns = {n: synced(s.step, device) for n, s in systems.items()}
    for fn in fns.values():
        fn()  # warm up (optimizer state, allocator)
    times: dict[str, list[float]] = {n: [] for n in names}
    use_lightning = single and lightning and available("lightning")
    if use_lightning:
        times["lightning"] = []
        if case in PLAIN:
            models_l, ex_l, plain_l = plain_model(layers, hidden), None, plain_batches(batch, lo, hi, device)
        else:
            models_l, ex_l, plain_l = common.make_models(layers, hidden), common.make_examples(256, lo, hi, seed=1), None
    for r in range(rounds):
        for n, t in common.timed_in_turns({n: fns[n] for n in names}, steps, clock).items():
            times[n].append(t)
        if use_lightning:
            per = run_lightning(models_l, ex_l, batch, steps, device, offset_steps=r * steps, clock=clock,
                                precision=precision, plain=plain_l)
            times["lightning"].append(sum(per) / len(per))
    del systems, fns
    mem = {n: peak_memory(n, case, device, precision) for n in names}
    rows = []
    for n in SYSTEMS:
        if n not in times:
            why = "not installed" if n in ("lightning", "accelerate") and not available(n) else "not measured"
            rows.append({"case": case, "system": n, "note": why})
            continue
        ratios = [a / b for a, b in zip(times[n], times[LOOP])]
        row = {"case": case, "system": n, "ms_per_step": statistics.median(times[n]) * 1e3,
               "ratio": statistics.median(ratios), "spread": (max(ratios) - min(ratios)) / 2, "note": ""}
        if n in mem:
            row["peak_mb"] = mem[n] / 2**20
            row["mem_ratio"] = mem[n] / mem[LOOP]
        rows.append(row)
    return rows


def format_row(r: dict) -> str:
    if "ms_per_step" not in r:
        return f"{r['case']:<20}{r['system']:<12}{r['note']:>10}"
    mem = (f"{r['peak_mb']:>12.2f}{r['mem_ratio']:>8.3f}" if "peak_mb" in r else f"{'':>12}{'':>8}")
    return (f"{r['case']:<20}{r['system']:<12}{r['ms_per_step']:>10.2f}{r['ratio']:>8.3f}"
            f"{'±' + format(r['spread'], '.3f'):>9}{mem}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", default="all", choices=["all", *SETTINGS])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=None, help="steps per round (default: per case)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--precision", default="32", choices=["32", "bf16", "16"],
                    help="every system in the same precision: bf16 = bf16-mixed (autocast), 16 = 16-mixed "
                         "(autocast and a GradScaler)")
    ap.add_argument("--no-lightning", action="store_true", help="leave Lightning out (its start-up is slow)")
    ap.add_argument("--clock", default=None, choices=["cpu", "wall"],
                    help="process CPU time or wall time (default: cpu on the CPU, wall on a GPU)")
    args = ap.parse_args()
    clock_name = args.clock or ("wall" if args.device == "cuda" else "cpu")
    if clock_name == "cpu" and args.device == "cuda":
        sys.exit("--clock cpu measures no GPU work; use --clock wall with --device cuda")
    clock = time.process_time if clock_name == "cpu" else time.perf_counter
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: CUDA is not available here")
    common.set_threads()
    cases = list(SETTINGS) if args.case == "all" else [args.case]
    precision = {"32": "32", "bf16": "bf16-mixed", "16": "16-mixed"}[args.precision]
    missing = [p for p in ("lightning", "accelerate") if not available(p)]
    if missing:
        print(f"not installed (rows say so): {missing}; pip install \"mtlab[bench]\"")
    print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} before (1-minute average)")
    print(f"torch {torch.__version__}, device {args.device}, threads {torch.get_num_threads()}, K={K}, "
          f"rounds={args.rounds}, clock {clock_name}, precision {precision}; ratio = median per-round time / loop's, ± half-range of the per-round ratios")
    print(f"{'case':<20}{'system':<12}{'ms/step':>10}{'ratio':>8}{'spread':>9}{'peak MB':>12}{'ratio':>8}")
    for case in cases:
        for r in run_case(case, args.rounds, args.device, args.steps, clock, precision, not args.no_lightning):
            print(format_row(r), flush=True)
        print(f"load {os.getloadavg()[0]:.1f} after {case}", flush=True)


if __name__ == "__main__":
    main()
