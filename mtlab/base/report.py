"""Messages for the person running training: the ``mtlab`` logger (above a progress bar when one is shown), and
tables of values in HTML."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

logger = logging.getLogger("mtlab")


def say(message: str, progress: bool = False) -> None:
    """Log ``message`` (logger ``mtlab``); with a progress bar also print it above the bar."""
    logger.info(message)
    if progress:
        from tqdm.auto import tqdm

        tqdm.write(message)


def values_html(values: Mapping[str, Any], caption: str) -> str:
    """A two-column HTML table of names and values (floats to 6 significant digits, None empty)."""
    rows = "".join(f"<tr><td>{k}</td><td>{'' if v is None else (f'{v:.6g}' if isinstance(v, float) else v)}</td></tr>"
                   for k, v in values.items())
    return f"<table><caption>{caption}</caption>{rows}</table>"


class _Weighted(Protocol):
    @property
    def weight(self) -> float: ...


class _Task(Protocol):
    @property
    def weight(self) -> float: ...

    @property
    def linkedsets(self) -> Mapping[str, _Weighted]: ...


class _Plan(Protocol):
    @property
    def model_names(self) -> Iterable[str]: ...


class _State(Protocol):
    @property
    def phase(self) -> object: ...

    @property
    def minibatches(self) -> int: ...


class Rounds(Protocol):
    """What ``own_rounds`` reads of a trainer."""

    @property
    def minibatches_per_step(self) -> Mapping[str, int]: ...

    @property
    def numbatches_to_aggregate(self) -> int: ...


class Reported(Rounds, Protocol):
    """What ``trainer_html`` reads of a trainer (``mtlab.Trainer`` is one; the foundations import no trainer)."""

    @property
    def step_count(self) -> int: ...

    @property
    def lr(self) -> float: ...

    @property
    def chain(self) -> object: ...

    @property
    def device(self) -> object: ...

    @property
    def tasks(self) -> Mapping[str, _Task]: ...

    @property
    def plans(self) -> Mapping[str, _Plan]: ...

    def state(self, task: str) -> _State: ...


def own_rounds(trainer: Rounds) -> str:
    """`` (a: 3)``: the tasks whose minibatches per step differ from the trainer's K, or ``""``."""
    own = {n: k for n, k in trainer.minibatches_per_step.items() if k != trainer.numbatches_to_aggregate}
    return f" ({', '.join(f'{n}: {k}' for n, k in own.items())})" if own else ""


def trainer_html(trainer: Reported) -> str:
    """A trainer as an HTML table (its ``_repr_html_``): step, lr, chain, and per task its weights, models,
    phase and minibatches."""
    tr = trainer
    rows = "".join(
        f"<tr><td>{n}</td><td>{t.weight:g}</td><td>{', '.join(f'{s} ({ls.weight:g})' for s, ls in t.linkedsets.items())}"
        f"</td><td>{', '.join(tr.plans[n].model_names)}</td><td>{tr.state(n).phase}</td>"
        f"<td>{tr.state(n).minibatches}</td></tr>" for n, t in tr.tasks.items())
    return ("<div><b>mtlab.Trainer</b> "
            f"step {tr.step_count} &middot; lr {tr.lr:g} &middot; {tr.chain} &middot; "
            f"K={tr.numbatches_to_aggregate}{own_rounds(tr)} &middot; {tr.device}"
            "<table><tr><th>task</th><th>weight</th><th>linked sets (weight)</th><th>models</th>"
            f"<th>phase</th><th>minibatches</th></tr>{rows}</table></div>")
