"""The history of a run of many tasks (what the dashboard's plots draw), shared by the plot tests."""

from __future__ import annotations

import math

import pandas as pd


def many_tasks(n: int, clipped: bool, method: bool = False, steps: int = 200) -> tuple[list[str], pd.DataFrame, list]:
    """``n`` tasks with linked sets clean and noisy, validation points of every task and set, two
    combined directions, weight and lr changes; clipping (and a combination method) optional."""
    tasks = ["frames", *(f"task{i}" for i in range(1, n))]
    rows = []
    for s in range(1, steps + 1):
        r = {"step": s, "lr": 1e-2 if s < 60 else 5e-3, "direction_norm": 0.7, "direction_norm/enc": 0.5}
        for i, t in enumerate(tasks):
            r.update({f"{t}/weight": 0.5 if s >= 100 and i == 0 else 1.0, f"{t}/loss": (1 + i) / math.sqrt(s),
                      f"{t}/clean/loss": (1.1 + i) / math.sqrt(s), f"{t}/noisy/loss": (1.3 + i) / math.sqrt(s),
                      f"{t}/grad_norm": (1 + i) / s, f"{t}/grad_norm_clipped": min((1 + i) / s, 0.05 if clipped else 9),
                      f"{t}/clip_fraction": 0.1 if clipped and s % 7 == 0 else 0.0})
            if method:
                r[f"combine/enc/{t}"] = 0.4 + 0.001 * s * i
                r.update({f"cos/enc/{t},{u}": math.cos(s / 30 + i + j) for j, u in enumerate(tasks) if j > i})
        rows.append(r)
    valid = [{"step": s, "loss": 1.0, **{t: 1 / math.sqrt(s) for t in tasks},
              **{f"{t}/{ls}": 1 / math.sqrt(s) + 0.1 * k for t in tasks for k, ls in enumerate(("clean", "noisy"))}}
             for s in (50, 100, 150, 200)]
    return tasks, pd.DataFrame(rows), valid
