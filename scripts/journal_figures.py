"""The two pictures of the journal and noise-scale docs: a run and two branches side by side with their knob
differences (runs.png), and each task's gradient noise scale (noise_scale.png); prints the journal.

    python scripts/journal_figures.py OUTDIR
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

import mtlab


def examples(n: int, seed: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        x = torch.randn(int(torch.randint(3, 12, (1,), generator=g)), 4, generator=g)
        out.append({"x": x, "y": (x[:, 0] > 0).long() + (x[:, 1] > 0).long(), "spk": (x.mean() > 0).long()})
    return out


class Pool(nn.Module):
    def forward(self, h: torch.Tensor, seq_lengths: torch.Tensor) -> torch.Tensor:
        mask = (torch.arange(h.shape[1])[None, :] < seq_lengths[:, None]).to(h.dtype)
        return (h * mask[..., None]).sum(1) / seq_lengths[:, None].to(h.dtype)


def build() -> mtlab.Trainer:
    torch.manual_seed(0)
    clean, noisy = examples(256, 1), examples(256, 2)
    models = {"enc": nn.Sequential(nn.Linear(4, 32), nn.Tanh()), "frame_head": nn.Linear(32, 3), "pool": Pool(),
              "utt_head": nn.Linear(32, 2)}
    frames = mtlab.Task("frames", nodes=[mtlab.Node("h", model="enc", inputs=["x"]),
                                         mtlab.Node("logits", model="frame_head", inputs=["h"])],
                        inputs=["x"], targets=["y"], outputs=["logits"],
                        loss=mtlab.losses.CrossEntropy(output="logits", target="y"),
                        linkedsets={"clean": mtlab.LinkedSet(clean), "noisy": mtlab.LinkedSet(noisy, weight=0.5)},
                        batch_size=8)
    utt = mtlab.Task("utt", nodes=[mtlab.Node("h", model="enc", inputs=["x"]),
                                   mtlab.Node("pooled", model="pool", inputs=["h"]),
                                   mtlab.Node("logits", model="utt_head", inputs=["pooled"])],
                     inputs=["x"], targets=["spk"], outputs=["logits"],
                     loss=mtlab.losses.CrossEntropy(output="logits", target="spk"),
                     linkedsets={"clean": mtlab.LinkedSet(clean)}, batch_size=8)
    return mtlab.Trainer(models, [frames, utt], lr=1e-2, numbatches_to_aggregate=4, clip_grad_value=1.0,
                         device="cpu", noise_scale=True)


def main(out: Path) -> None:
    torch.set_num_threads(1)
    out.mkdir(parents=True, exist_ok=True)
    main_run = build()
    for _ in range(40):
        main_run.step()
    slow = main_run.fork("lower-lr")
    slow.lr = 2e-3
    noisy = main_run.fork("more-noisy")
    noisy.set_weight("frames", "noisy", 1.0)
    noisy.numbatches_to_aggregate = 2
    for _ in range(80):
        for run in (main_run, slow, noisy):
            run.step()
    mtlab.plots.plot_runs({"main": main_run, "lower-lr": slow, "more-noisy": noisy}).savefig(out / "runs.png")
    mtlab.plots.plot_noise_scale(main_run.history).savefig(out / "noise_scale.png")
    again = mtlab.replay(noisy.journal.to_json(), build())
    same = all(torch.equal(p, again.params[n]) for n, p in noisy.params.items())
    print("\n".join(noisy.journal.lines()))
    print(f"replay of 'more-noisy' bit-identical: {same}; suggested minibatches per step: "
          f"{main_run.noise_scale.suggest(main_run)}; figures in {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "journal_figures"))
