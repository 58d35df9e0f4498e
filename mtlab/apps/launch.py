"""Start data-parallel CPU workers on a recipe from Python (a notebook, a test): ``launch(recipe, nprocs=2)``.

Each worker joins a gloo process group on 127.0.0.1, builds the recipe (which attaches data parallelism),
trains through the one loop and writes its history; rank 0 writes the checkpoint.
"""

from __future__ import annotations

import datetime
import os
import socket
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..base.errors import ConfigError
from ..training.loop import run
from .recipe import from_recipe


def _worker(rank: int, world: int, port: int, recipe: Any, steps: int, out_dir: str, threads: int) -> None:
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    try:
        exp = from_recipe(recipe)
        run(exp, steps=steps, progress=False)
        exp.trainer.history.to_csv(os.path.join(out_dir, f"history{rank}.csv"), index=False)
        exp.save(os.path.join(out_dir, "final.pt"))  # rank 0 writes; the others say so and return
        dist.barrier()  # nobody tears the group down while another rank still talks
    finally:
        dist.destroy_process_group()


def launch(recipe: Any, nprocs: int = 2, steps: int = 3, out_dir: str | None = None, threads: int = 1) -> dict[str, Any]:
    """Run ``steps`` data-parallel steps of a recipe on ``nprocs`` CPU processes (gloo) and return each rank's
    history and rank 0's checkpoint path.

    Examples:
        >>> res = mtlab.launch.launch("recipes/demo.toml", nprocs=2, steps=2)  # doctest: +SKIP
        >>> res["history"][0]    # pandas DataFrame of rank 0  # doctest: +SKIP
    """
    import pandas as pd
    import torch.multiprocessing as mp

    if not dist.is_available():
        raise ConfigError("this torch build has no torch.distributed")
    if nprocs < 1:
        raise ConfigError(f"nprocs must be >= 1, got {nprocs}")
    out = out_dir or tempfile.mkdtemp(prefix="mtlab-launch-")
    os.makedirs(out, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_worker, args=(nprocs, port, recipe, steps, out, threads), nprocs=nprocs, start_method="spawn")
    return {"history": {r: pd.read_csv(Path(out) / f"history{r}.csv") for r in range(nprocs)},
            "checkpoint": str(Path(out) / "final.pt"), "out_dir": out}
