"""mtlab against a hand-written loop, PyTorch Lightning and Accelerate, doing the same work.

Same model (BLSTM tagger, 40-dim inputs, per-frame classes), same variable-length batches,
K = 4 minibatches per optimizer step, clip by value, Adam. Cases:

- compute:   2-layer BLSTM, hidden 128, batch 16, lengths 50-300 (compute-bound)
- overhead:  1-layer BLSTM, hidden 16,  batch 4,  lengths 5-20   (overhead-bound)
- multitask: two tasks sharing a 1-layer BLSTM encoder (hidden 64, batch 8, lengths 20-100),
             mtlab against the hand-written equivalent (per-task buffers, normalize, clip, combine)

Times: every system draws the same batches in the same round, so the ratio is the median over
interleaved rounds of time(system) / time(hand-written) in that round; ms/step is the median.
Memory (RSS+): growth of the process's peak RSS during training, each system in its own process
(Lightning's includes its own setup). bench/overhead.py measures peak tensor memory exactly.
One torch thread unless MTLAB_BENCH_THREADS is set.

    pip install lightning accelerate      # the peers (optional: missing ones are reported)
    python bench/peers.py                 # all cases
    python bench/peers.py --case overhead --rounds 9
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
import common  # noqa: E402

import mtlab  # noqa: E402
from mtlab.sampling import BatchStream  # noqa: E402
from mtlab.models import BLSTM, MeanPool  # noqa: E402

K = common.K
SETTINGS = {
    # case: (layers, hidden, batch, min_len, max_len, steps per round)
    "compute": (2, 128, 16, 50, 300, 1),
    "overhead": (1, 16, 4, 5, 20, 40),
    "multitask": (1, 64, 8, 20, 100, 6),
}
SPK = 6


def frame_loss(logits: torch.Tensor, y: torch.Tensor, lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    mask = torch.arange(y.shape[1])[None] < lens[:, None]
    per = F.cross_entropy(logits.transpose(1, 2), y, reduction="none")
    return torch.where(mask, per, per.new_zeros(())).sum(), mask.sum()


def batches_for(examples, batch: int, n: int, seed_name=("tag", "train"), offset: int = 0) -> list:
    stream = BatchStream(examples, batch, 1, seed=mtlab.sampling.derived_seed(0, *seed_name))
    return [next(stream) for _ in range(offset + n)][offset:]


# ----------------------------------------------------------------------------- single task systems
def system_mtlab(models, examples, batch):
    return common.make_trainer(models, examples, batch).step


def system_hand(models, examples, batch):
    return common.HandLoop(models, examples, batch).step


def system_accelerate(models, examples, batch):
    from accelerate import Accelerator

    acc = Accelerator(gradient_accumulation_steps=K, cpu=True)
    model = nn.ModuleDict(models)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model, opt = acc.prepare(model, opt)
    stream = BatchStream(examples, batch, 1, seed=mtlab.sampling.derived_seed(0, "tag", "train"))

    def step() -> None:
        for _ in range(K):
            data, lens = next(stream)
            with acc.accumulate(model):
                logits = model["head"](model["enc"](data["x"], lens["x"]))
                loss, norm = frame_loss(logits, data["y"], lens["y"])
                acc.backward(loss / norm)
                if acc.sync_gradients:
                    acc.clip_grad_value_(model.parameters(), 1.0)
                opt.step()
                opt.zero_grad()

    return step


def run_lightning(models, examples, batch, steps: int, offset_steps: int = 0) -> list[float]:
    """Seconds per optimizer step of a Lightning fit (startup and its first step excluded); the
    measured steps use the batches the other systems use in the same round."""
    import lightning as L

    class Tagger(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.enc, self.head = models["enc"], models["head"]

        def training_step(self, b, idx):
            data, lens = b
            loss, norm = frame_loss(self.head(self.enc(data["x"], lens["x"])), data["y"], lens["y"])
            return loss / norm

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    stamps: list[float] = []

    class Clock(L.Callback):
        def on_train_batch_end(self, trainer, module, outputs, b, idx):
            if (idx + 1) % K == 0:
                stamps.append(time.perf_counter())

    loader = torch.utils.data.DataLoader(
        _Fixed(batches_for(examples, batch, (steps + 1) * K, offset=offset_steps * K)), batch_size=None)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=steps + 1, accumulate_grad_batches=K,
                        gradient_clip_val=1.0, gradient_clip_algorithm="value", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, callbacks=[Clock()])
    trainer.fit(Tagger(), loader)
    return [b - a for a, b in zip(stamps, stamps[1:])]


class _Fixed(torch.utils.data.Dataset):
    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


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


def mt_mtlab(models, examples, batch):
    n = mtlab.Node
    frames = mtlab.Task("frames", [n("h", "enc", ["x"]), n("o", "frames", ["h"])], ["x"], ["y"], ["o"],
                        mtlab.losses.CrossEntropy(output="o", target="y"),
                        {"train": mtlab.LinkedSet(examples)}, batch_size=batch)
    spk = mtlab.Task("spk", [n("h", "enc", ["x"]), n("p", "pool", ["h"]), n("o", "spk", ["p"])], ["x"], ["spk"], ["o"],
                     mtlab.losses.CrossEntropy(output="o", target="spk"),
                     {"train": mtlab.LinkedSet(examples)}, batch_size=batch, weight=0.5)
    tr = mtlab.Trainer(models, [frames, spk], lr=1e-3, clip_grad_value=1.0, numbatches_to_aggregate=K, device="cpu")
    return tr.step


def mt_hand(models, examples, batch):
    enc, fr, pool, sp = models["enc"], models["frames"], models["pool"], models["spk"]
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
            loss, n = forward(data, lens)
            loss.backward()
            norm = norm + n
        grads = [p.grad for p in enc_params + own]
        for g in grads:
            g.div_(norm).clamp_(-1.0, 1.0)
        return grads

    def f_fr(data, lens):
        return frame_loss(fr(enc(data["x"], lens["x"])), data["y"], lens["y"])

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

    return step


# ----------------------------------------------------------------------------- driver
def build(system: str, case: str):
    layers, hidden, batch, lo, hi, _ = SETTINGS[case]
    if case == "multitask":
        return {"mtlab": mt_mtlab, "hand-written": mt_hand}[system](mt_models(hidden), mt_examples(256, lo, hi), batch)
    builders = {"mtlab": system_mtlab, "hand-written": system_hand, "accelerate": system_accelerate}
    return builders[system](common.make_models(layers, hidden), common.make_examples(256, lo, hi, seed=1), batch)


def available(name: str) -> bool:
    try:
        __import__(name)
        return True
    except ImportError:
        return False


def memory_child(system: str, case: str, steps: int) -> None:
    common.set_threads()
    layers, hidden, batch, lo, hi, _ = SETTINGS[case]
    if system == "lightning":
        models, ex = common.make_models(layers, hidden), common.make_examples(256, lo, hi, seed=1)
        base = common.reset_peak_rss()
        run_lightning(models, ex, batch, steps)
    else:
        step = build(system, case)
        base = common.reset_peak_rss()
        for _ in range(steps + 1):
            step()
    print(json.dumps({"peak_growth": common.rss("VmHWM") - base}))


def run_case(case: str, rounds: int) -> list[dict]:
    layers, hidden, batch, lo, hi, steps = SETTINGS[case]
    names = ["hand-written", "mtlab"]
    if case != "multitask" and available("accelerate"):
        names.append("accelerate")
    fns = {n: build(n, case) for n in names}
    for fn in fns.values():
        fn()  # warm up (optimizer state, allocator)
    times: dict[str, list[float]] = {n: [] for n in names}
    use_lightning = case != "multitask" and available("lightning")
    if use_lightning:
        times["lightning"] = []
        models_l = common.make_models(layers, hidden)
        ex_l = common.make_examples(256, lo, hi, seed=1)
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        for n in order:
            times[n].append(common.timed(fns[n], steps))
        if use_lightning:
            per = run_lightning(models_l, ex_l, batch, steps, offset_steps=r * steps)
            times["lightning"].append(sum(per) / len(per))
    import statistics

    med = {n: statistics.median(v) for n, v in times.items()}
    # Same batches in the same round for every system: compare round by round.
    paired = {n: common.paired_ratio(times, n, "hand-written") for n in times}
    rows = []
    for n in times:
        out = subprocess.run([sys.executable, __file__, "--memory-child", n, case], capture_output=True, text=True)
        peak = json.loads(out.stdout.strip().splitlines()[-1])["peak_growth"] if out.returncode == 0 else float("nan")
        rows.append({"case": case, "system": n, "ms_per_step": med[n] * 1e3,
                     "ratio": paired[n], "peak_mb": peak / 2**20})
    hand_mem = next(r["peak_mb"] for r in rows if r["system"] == "hand-written")
    for r in rows:
        r["mem_ratio"] = r["peak_mb"] / hand_mem if hand_mem else float("nan")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", default="all", choices=["all", *SETTINGS])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--memory-child", nargs=2, metavar=("SYSTEM", "CASE"))
    args = ap.parse_args()
    if args.memory_child:
        memory_child(args.memory_child[0], args.memory_child[1], steps=3)
        return
    common.set_threads()
    cases = list(SETTINGS) if args.case == "all" else [args.case]
    missing = [p for p in ("lightning", "accelerate") if not available(p)]
    if missing:
        print(f"not installed (left out): {missing}; pip install {' '.join(missing)}")
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, K={K}, rounds={args.rounds}")
    print(f"{'case':<10}{'system':<14}{'ms/step':>10}{'ratio':>8}{'RSS+ MB':>10}{'mem ratio':>10}")
    for case in cases:
        for r in run_case(case, args.rounds):
            print(f"{r['case']:<10}{r['system']:<14}{r['ms_per_step']:>10.2f}{r['ratio']:>8.3f}"
                  f"{r['peak_mb']:>10.1f}{r['mem_ratio']:>10.3f}", flush=True)


if __name__ == "__main__":
    main()
