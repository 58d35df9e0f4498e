"""torch CPU threads for the Python API, chosen as the command line chooses them.

torch starts with one thread per physical core. On a shared machine that oversubscribes the CPUs: at load 9 on 2
cores a demo step took 18-33 s with 2 threads against 1.3-2.0 s with 1. So ``mtlab.Trainer``, ``mtlab.from_recipe``
and ``mtlab.run`` set torch's thread count when the program has not set it itself:

1. ``threads=N`` of ``from_recipe`` / ``run``;
2. else the environment variable ``MTLAB_THREADS=N``;
3. else the CPUs this process may use less the machine's load (other programs' busy threads), shared among the
   local ranks: at least 1, at most torch's own choice (:func:`default_threads`).

A program that called ``torch.set_num_threads`` itself keeps its count; if that count is more than the free CPUs,
``mtlab.run`` says so at its first step (:func:`oversubscribed`).
"""

from __future__ import annotations

import os

import torch

from .errors import ConfigError
from .report import say

ENV = "MTLAB_THREADS"
_STARTED = torch.get_num_threads()  # torch's own choice, before anyone set it
_CHOSEN: int | None = None  # what mtlab's default chose last (it may choose again, e.g. when the load changed)
_FIXED = False  # threads= (or the command line's --threads) chose: later calls without one keep it


def usable_cpus() -> int:
    """CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0


def default_threads(cpus: int | None = None, hint: str = "threads=N or MTLAB_THREADS=N to choose") -> tuple[int, str]:
    """torch CPU threads that do not oversubscribe the machine, and why: the CPUs this process may use less
    the machine's load (other programs' busy threads), shared among the local ranks; at least 1, at most
    torch's own choice. On a shared 2-core machine under load, more threads made steps 10-15x slower."""
    cpus = usable_cpus() if cpus is None else cpus
    load = _load()
    ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    free = max(1, round(cpus - load)) // ranks
    n = max(1, min(torch.get_num_threads(), free))
    shared = f", {ranks} local ranks" if ranks > 1 else ""
    return n, f"{n} torch thread{'s' if n > 1 else ''} ({cpus} CPUs, load {load:.1f}{shared}; {hint})"


def _count(value: object, where: str) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{where} must be a positive number of torch CPU threads, got {value!r}")
    return value


def apply_threads(threads: int | None = None, announce: bool = True) -> str | None:
    """Set torch's CPU thread count as the module docstring says; returns why (None: the count was kept: the
    program set its own, or an earlier ``threads=`` / ``--threads`` fixed it). Said once (logger ``mtlab``) whenever
    it changes the count, unless ``announce`` is False (the command line prints its own line)."""
    global _CHOSEN, _FIXED
    if threads is not None:
        n = _count(threads, "threads")
        why = f"{n} torch thread{'s' if n > 1 else ''} (threads={n})"
        _FIXED, _CHOSEN = True, None
    elif os.environ.get(ENV):
        n = _count(os.environ[ENV], ENV)
        why = f"{n} torch thread{'s' if n > 1 else ''} ({ENV}={n})"
    elif _FIXED or torch.get_num_threads() not in (_STARTED, _CHOSEN):
        return None  # chosen on purpose: by the program, threads= or --threads
    else:
        n, why = default_threads()
        _CHOSEN = n
    if n != torch.get_num_threads():
        torch.set_num_threads(n)
        if announce:
            say(f"threads: {why}")
    return why


def oversubscribed() -> str | None:
    """A warning when torch runs more CPU threads than the machine has free CPUs (None when it does not)."""
    n, cpus, load = torch.get_num_threads(), usable_cpus(), _load()
    free = max(1, round(cpus - load))
    if n <= free:
        return None
    return (f"the machine is oversubscribed: {n} torch threads, {free} of {cpus} CPUs free (load {load:.1f}); steps "
            f"can be 10x slower. torch.set_num_threads({free}), threads={free} or {ENV}={free} for a faster step")
