"""Starting the data-parallel workers (gloo on CPU) and comparing their parameters."""

from __future__ import annotations

import torch
import torch.multiprocessing as mp

from helpers.servers import free_port


def spawn(fn, out, nprocs: int = 2, join: bool = True):
    return mp.start_processes(fn, args=(nprocs, free_port(), str(out)), nprocs=nprocs, join=join, start_method="spawn")


def assert_params_close(got: dict, expected: dict, atol=1e-6) -> None:
    assert got.keys() == expected.keys()
    for k in got:
        torch.testing.assert_close(torch.tensor(got[k], dtype=torch.float64),
                                   torch.tensor(expected[k], dtype=torch.float64), atol=atol, rtol=0)
