"""`mtlab replay EXPDIR [--expdir NEW]`: rerun an experiment from its journal and compare it with its final.pt.

It shows a progress bar (steps replayed of the journal's) and ends with one verdict line: ``identical ...`` or
where the replay first differed (the first step whose history row differs, else the parameters)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def moved_flag(p: Any) -> None:
    """``--moved OLD=NEW`` of resume, evaluate and replay: data moved without editing the experiment's recipe."""
    p.add_argument("--moved", action="append", default=None, metavar="OLD=NEW",
                   help="the experiment's data moved from the folder OLD to NEW (repeatable); or edit the data "
                        "locations in the experiment's recipe.toml. The data are checked to be the same")


def add_replay_parser(sub: Any) -> None:
    """The ``replay`` subcommand of ``mtlab``."""
    p = sub.add_parser("replay", help="rerun an experiment from its journal.jsonl, bit for bit, and compare it with "
                                      "the experiment's final.pt")
    p.add_argument("expdir", type=Path)
    p.add_argument("--expdir", dest="out", type=Path, default=None,
                   help="write the replayed run here (final.pt, history.csv, journal.jsonl); default: compare only")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    moved_flag(p)


def steps_in(journal: Any) -> int:
    """How many steps the journal's run applied (go-backs included: the steps a replay goes through)."""
    return sum(int(e.get("count", 1)) for e in journal.entries
               if e.get("type") == "call" and e.get("kind") in ("step", "apply") and not e.get("failed")
               and not e.get("inside"))


def first_difference(ours: str, theirs: str) -> str | None:
    """Where two history tables (CSV text) first differ, in words; None when they are the same."""
    a, b = ours.splitlines(), theirs.splitlines()
    if a[:1] != b[:1]:
        return f"the history's columns differ ({len(a[0].split(',')) if a else 0} vs {len(b[0].split(',')) if b else 0})"
    header = a[0].split(",") if a else []
    for row, (x, y) in enumerate(zip(a[1:], b[1:]), start=1):
        if x != y:
            xs, ys = x.split(","), y.split(",")
            cols = [(h, u, v) for h, u, v in zip(header, xs, ys) if u != v]
            step = dict(zip(header, ys)).get("step", str(row))
            shown = ", ".join(f"{h} {v} in the run, {u} in the replay" for h, u, v in cols[:2])
            return f"at step {step} (history row {row}: {shown or 'the row differs'})"
    if len(a) != len(b):
        return f"after history row {min(len(a), len(b)) - 1}: the run has {len(b) - 1} rows, the replay {len(a) - 1}"
    return None


def verdict(trainer: Any, state: Mapping[str, Any], history: str | None, final: Path) -> tuple[bool, str]:
    """(identical, the one line that says so or where the replay first differed)."""
    import torch

    where = first_difference(trainer.history.to_csv(index=False), history) if history is not None else None
    if where is not None:
        return False, f"replay differs from {final.parent}: first {where}"
    if state["step"] != trainer.step_count:
        return False, (f"replay differs from {final}: it ended at step {trainer.step_count}, the run's final.pt is "
                       f"at step {state['step']}")
    ours = {f"{m}.{k}": v for m, model in trainer.models.items() for k, v in model.state_dict().items()}
    theirs = {f"{m}.{k}": v for m, sd in state["models"].items() for k, v in sd.items()}
    differ = sorted(k for k in ours if k not in theirs or not torch.equal(ours[k].cpu(), theirs[k]))
    if differ:
        return False, (f"replay differs from {final} at step {trainer.step_count}: parameters {differ[:5]}"
                       f"{' and more' if len(differ) > 5 else ''} (the history agrees)")
    return True, (f"replay identical to {final}: every parameter of step {trainer.step_count} bit for bit"
                  + (", and the history row for row" if history is not None else ""))


def _bar(trainer: Any, total: int, show: bool) -> tuple[Any, Any]:
    """A progress bar over the steps replayed (a listener of the trainer's apply events) and that listener."""
    from tqdm.auto import tqdm

    from ..core.events import Event, Payload
    from ..training.loop import LOG_PROGRESS_S, LogLines

    tty = sys.stderr.isatty()
    bar = tqdm(total=total, desc="replay", unit="step", dynamic_ncols=True, disable=not show,
               mininterval=0.1 if tty else LOG_PROGRESS_S, file=None if tty else LogLines(sys.stderr))

    def advance(event: Event, info: Payload) -> None:
        if event == Event.APPLY and bar.n < total:
            bar.update(1)

    trainer.add_callback(advance)
    return bar, advance


def check_ranks(state: Mapping[str, Any], expdir: Path) -> None:
    """Refuse, before anything runs, a replay in another world than the run's: each rank drew its own shard of the
    data, so only as many ranks give the same run; the message names the command that does."""
    import os

    from ..base.errors import ConfigError

    streams = state.get("streams") or {}
    ranks = max([int(v.get("world_size", 1)) for v in streams.values() if isinstance(v, Mapping)] or [1])
    here = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if ranks != here:
        command = (f"torchrun --nproc-per-node {ranks} -m mtlab replay {expdir}" if ranks > 1
                   else f"mtlab replay {expdir} (without torchrun)")
        raise ConfigError(f"{expdir} was trained on {ranks} rank{'s' if ranks > 1 else ''} and this replay runs on "
                          f"{here}: each rank drew its own shard of the data, so only {ranks} give the same run. "
                          f"Replay it with `{command}`; nothing was replayed")


def replay_command(expdir: Path, out: Path | None, progress: bool = True, moves: list[str] | None = None) -> int:
    """Rebuild the experiment from its recipe, replay its journal, compare with its final.pt."""
    from ..base.errors import ConfigError
    from ..core.journal import Journal
    from ..core.state import load_safe
    from ..training.checkpoint import save_checkpoint
    from ..training.expdir import held_run
    from ..training.replay import replay
    from .recipe import from_recipe

    if out is not None and held_run(out):  # before the replay's minutes, the same rule as `mtlab train`
        raise ConfigError(f"{out} already holds an experiment ({', '.join(held_run(out))}); give --expdir a new "
                          "folder for the replayed run")
    journal = Journal.read_file(expdir / "journal.jsonl")
    final = expdir / "final.pt"
    state = load_safe(final) if final.exists() else {}
    recipe = state.get("recipe")
    if recipe is None:
        raise ConfigError(f"{expdir} has no final.pt with its recipe; `mtlab replay` rebuilds the trainer from it")
    check_ranks(state, expdir)
    history_file = expdir / "history.csv"
    history = history_file.read_text() if history_file.is_file() else None
    from .relocate import relocated

    recipe = relocated(expdir, recipe, moves)  # data moved: recipe.toml's edited locations, --moved OLD=NEW
    exp = from_recipe(recipe)
    bar, advance = _bar(exp.trainer, steps_in(journal), progress)
    try:
        trainer = replay(journal, exp.trainer)
    finally:
        bar.close()
        exp.trainer.remove_callback(advance)
    print(f"replayed {len(journal)} journal entries ({len(journal.changes())} change(s)) to step {trainer.step_count}")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        save_checkpoint(trainer, exp.schedule, out / "final.pt", recipe=recipe)
        trainer.history.to_csv(out / "history.csv", index=False)
        trainer.journal.write(out / "journal.jsonl")
        print(f"experiment folder: {out}")
    same, line = verdict(trainer, state, history, final)
    sys.stderr.flush()
    print(line, flush=True)
    return 0 if same else 1
