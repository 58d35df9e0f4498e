"""Shared benchmark pieces: the BLSTM tagger, variable-length data, timing and memory helpers."""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import mtlab
from mtlab.tasks.sampling import BatchStream
from mtlab.models import BLSTM

CASES = {
    # name: (layers, hidden, batch, min_len, max_len)
    "compute": (2, 128, 16, 50, 300),
    "overhead": (1, 16, 4, 5, 20),
}
DIN, CLASSES, K = 40, 10, 4


def make_examples(n: int, min_len: int, max_len: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        t = int(torch.randint(min_len, max_len + 1, (1,), generator=g))
        out.append({"x": torch.randn(t, DIN, generator=g), "y": torch.randint(0, CLASSES, (t,), generator=g)})
    return out


def make_models(layers: int, hidden: int, seed: int = 0) -> dict[str, nn.Module]:
    torch.manual_seed(seed)
    return {"enc": BLSTM(DIN, hidden, num_layers=layers), "head": nn.Linear(2 * hidden, CLASSES)}


def make_trainer(models, examples, batch: int, clip: float = 1.0, device: str = "cpu", **kw) -> mtlab.Trainer:
    task = mtlab.Task("tag", nodes=[mtlab.Node("h", "enc", ["x"]), mtlab.Node("logits", "head", ["h"])],
                      inputs=["x"], targets=["y"], outputs=["logits"],
                      loss=mtlab.losses.CrossEntropy(output="logits", target="y"),
                      linkedsets={"train": mtlab.LinkedSet(examples)}, batch_size=batch)
    return mtlab.Trainer(models, [task], lr=1e-3, clip_grad_value=clip, numbatches_to_aggregate=K,
                         device=device, seed=0, **kw)


IGNORE = -100


def user_frame_loss(logits: torch.Tensor, y: torch.Tensor, lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The frame loss as a user writes it: padded targets set to -100, ``cross_entropy`` with
    ``ignore_index`` on the flattened logits, summed; the normalizer is the number of valid frames."""
    y = y.masked_fill(torch.arange(y.shape[1], device=y.device)[None] >= lens[:, None], IGNORE)
    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=IGNORE, reduction="sum")
    return loss, (y != IGNORE).sum()


AUTOCAST = {"32": None, "bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


class UserLoop:
    """The loop a user writes for the same math: K minibatches of summed frame losses, gradients
    divided once by the frame count, ``clip_grad_value_``, torch's default ``Adam``. With a mixed
    ``precision``, torch's AMP recipe: forward and loss under ``autocast``; for ``16-mixed`` a GradScaler
    (``scale(loss).backward()``, ``unscale_`` before the division and clipping, ``step``, ``update``)."""

    def __init__(self, models, examples, batch: int, clip: float = 1.0, device: str = "cpu",
                 precision: str = "32") -> None:
        self.enc, self.head = models["enc"].to(device), models["head"].to(device)
        self.params = list(self.enc.parameters()) + list(self.head.parameters())
        self.opt = torch.optim.Adam(self.params, lr=1e-3)
        self.stream = BatchStream(examples, batch, 1, seed=mtlab.sampling.derived_seed(0, "tag", "train"))
        self.clip = clip
        self.device = torch.device(device)
        self.dtype = AUTOCAST[precision]
        self.scaler = torch.amp.GradScaler(self.device.type) if precision == "16-mixed" else None

    def step(self) -> None:
        self.opt.zero_grad()
        frames = 0
        for _ in range(K):
            data, lens = next(self.stream)
            x, y, n = (data["x"].to(self.device), data["y"].to(self.device), lens["y"].to(self.device))
            with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype is not None):
                loss, count = user_frame_loss(self.head(self.enc(x, n)), y, n)
            (self.scaler.scale(loss) if self.scaler else loss).backward()
            frames = frames + count
        if self.scaler:
            self.scaler.unscale_(self.opt)
        for p in self.params:
            p.grad.div_(frames)
        torch.nn.utils.clip_grad_value_(self.params, self.clip)
        if self.scaler:
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            self.opt.step()


HandLoop = UserLoop  # the name earlier benchmark scripts used


def timed(fn, n: int, clock=time.perf_counter) -> float:
    """Seconds per call of ``fn`` over ``n`` calls; ``clock=time.process_time`` counts this process's CPU
    time only, which other processes on a shared machine disturb far less than the wall clock."""
    t0 = clock()
    for _ in range(n):
        fn()
    return (clock() - t0) / n


def timed_in_turns(fns: dict, n: int, clock=time.perf_counter) -> dict[str, float]:
    """Seconds per call of each of ``fns`` over ``n`` calls each, the systems taking turns call by call (the
    order rotating each turn): a burst of load elsewhere on a shared machine, which slows whatever runs
    during it, falls on every system alike instead of on the one whose block of calls it hit."""
    names = list(fns)
    spent = dict.fromkeys(names, 0.0)
    for i in range(n):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            t0 = clock()
            fns[name]()
            spent[name] += clock() - t0
    return {name: t / n for name, t in spent.items()}


def interleaved_times(systems: dict, rounds: int, steps: int, warmup: int = 1) -> dict[str, list[float]]:
    """Seconds per step of each system in each round. The systems draw the same batches in
    lockstep, so round r does the same work in every system: compare round by round."""
    for s in systems.values():
        for _ in range(warmup):
            s()
    times: dict[str, list[float]] = {k: [] for k in systems}
    for r in range(rounds):
        keys = list(systems) if r % 2 == 0 else list(reversed(systems))
        for k in keys:
            times[k].append(timed(systems[k], steps))
    return times


def paired_ratio(times: dict[str, list[float]], system: str, base: str) -> float:
    """Median over rounds of time(system) / time(base) in the same round (same batches)."""
    return statistics.median(a / b for a, b in zip(times[system], times[base]))


def interleaved(systems: dict, rounds: int, steps: int, warmup: int = 1) -> dict[str, float]:
    """Median seconds per step of each system, measured in interleaved rounds."""
    times = interleaved_times(systems, rounds, steps, warmup)
    return {k: statistics.median(v) for k, v in times.items()}


def reset_peak_rss() -> int:
    """Reset the kernel's peak-RSS counter; return the current RSS in bytes (Linux)."""
    Path("/proc/self/clear_refs").write_text("5")
    return rss("VmRSS")


def rss(field: str = "VmHWM") -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def set_threads() -> None:
    # One thread by default: on a small shared machine more threads oversubscribe the cores and
    # make timings swing; set MTLAB_BENCH_THREADS to measure with more.
    torch.set_num_threads(int(os.environ.get("MTLAB_BENCH_THREADS", 1)))


def tensor_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (a view into a buffer counts once, with its buffer)."""
    seen, total = set(), 0
    for t in tensors:
        if isinstance(t, torch.Tensor):
            storage = t.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
    return total


def live_training_bytes(params, optimizers, extra=()) -> int:
    """Bytes of parameters, gradients, optimizer state and extra buffers alive right now."""
    tensors = list(params) + [p.grad for p in params if p.grad is not None] + list(extra)
    for opt in optimizers:
        for state in opt.state.values():
            tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
    return tensor_bytes(tensors)


def peak_step_bytes(step, params, optimizers, extra=lambda: ()) -> int:
    """Peak tensor memory of one step: what is alive before it (parameters, gradients, optimizer
    state, extra buffers) plus the highest point of the allocations the profiler records during it.
    The profiler does not see the freeing of tensors allocated before it started: free first what the
    step would free anyway (a loop's ``zero_grad()``), or that memory counts twice."""
    from torch.profiler import ProfilerActivity, profile

    base = live_training_bytes(params, optimizers, extra())
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    # Every op's own allocations minus frees, in start order: the running total of live bytes.
    cur = peak = 0
    for e in sorted(prof.events(), key=lambda e: e.time_range.start):
        cur += e.self_cpu_memory_usage
        peak = max(peak, cur)
    return base + peak
