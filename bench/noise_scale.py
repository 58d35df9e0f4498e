"""The gradient noise scale: how close it comes to the analytic value on a linear regression with a known
noise level, and what measuring it costs per step (the same steps with and without, side by side).

    python bench/noise_scale.py [--steps 200] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

import mtlab


class Linear(nn.Module):
    def __init__(self, d: int, hidden: int = 0) -> None:
        super().__init__()
        self.lin = nn.Linear(d, 1, bias=False, dtype=torch.float64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


def regression(d: int, sigma: float, n: int, noise_scale: object, k: int, batch: int) -> tuple[mtlab.Trainer, float]:
    """B_simple = ((d + 1)|δ|² + dσ²) / |δ|² for x ~ N(0, I), y = x·θ* + σε, at θ = θ* + δ (held still)."""
    g = torch.Generator().manual_seed(0)
    theta = torch.randn(d, generator=g, dtype=torch.float64)
    xs = torch.randn(n, 1, d, generator=g, dtype=torch.float64)
    ys = xs @ theta[:, None] + sigma * torch.randn(n, 1, 1, generator=g, dtype=torch.float64)
    examples = [{"x": x, "y": y} for x, y in zip(xs, ys)]
    model = Linear(d)
    task = mtlab.Task("reg", nodes=[mtlab.Node("yhat", model="lin", inputs=["x"])], inputs=["x"], targets=["y"],
                      outputs=["yhat"], loss=mtlab.losses.MSE(output="yhat", target="y"),
                      linkedsets={"train": mtlab.LinkedSet(examples)}, batch_size=batch)
    tr = mtlab.Trainer({"lin": model}, [task], lr=1e-12, numbatches_to_aggregate=k, device="cpu",
                       noise_scale=noise_scale)
    delta2 = float((model.lin.weight.detach()[0] - theta).pow(2).sum())
    return tr, ((d + 1) * delta2 + d * sigma ** 2) / delta2


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    for d, sigma, k, batch in ((6, 0.7, 4, 8), (32, 0.2, 8, 16)):
        tr, want = regression(d, sigma, 8000, mtlab.NoiseScale(beta=0.99), k, batch)
        for _ in range(args.steps):
            tr.step()
        h = tr.history
        ratio = h["gns_trace/reg"].mean() / h["gns_g2/reg"].mean()
        print(f"linear regression d={d} sigma={sigma} k={k} batch={batch}: analytic B_simple {want:.2f}, "
              f"EMA estimate {h['gns/reg'].iloc[-1]:.2f} ({h['gns/reg'].iloc[-1] / want - 1:+.1%}), ratio of means "
              f"{ratio:.2f} ({ratio / want - 1:+.1%}) over {args.steps} steps; suggested minibatches per step "
              f"{tr.noise_scale.suggest(tr)['reg']}")
    # cost: the same trainer twice, with and without, alternating to share the machine's load
    times = {False: [], True: []}
    for _ in range(args.repeats):
        for on in (False, True):
            tr, _ = regression(256, 0.5, 4000, on, 8, 16)
            tr.step()
            t0 = time.perf_counter()
            for _ in range(args.steps // 4):
                tr.step()
            times[on].append((time.perf_counter() - t0) / (args.steps // 4))
    off, on = min(times[False]), min(times[True])
    print(f"step time (d=256, 8 minibatches of 16): {off * 1e3:.2f} ms without, {on * 1e3:.2f} ms with the noise "
          f"scale: x{on / off:.2f}")


if __name__ == "__main__":
    main()
