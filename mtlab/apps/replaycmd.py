"""`mtlab replay EXPDIR [--expdir NEW]`: rerun an experiment from its journal and compare it with its final.pt."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def add_replay_parser(sub: Any) -> None:
    """The ``replay`` subcommand of ``mtlab``."""
    p = sub.add_parser("replay", help="rerun an experiment from its journal.jsonl, bit for bit, and compare it with "
                                      "the experiment's final.pt")
    p.add_argument("expdir", type=Path)
    p.add_argument("--expdir", dest="out", type=Path, default=None,
                   help="write the replayed run here (final.pt, history.csv, journal.jsonl); default: compare only")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")


def replay_command(expdir: Path, out: Path | None) -> int:
    """Rebuild the experiment from its recipe, replay its journal, compare with its final.pt."""
    from ..base.errors import ConfigError
    from ..core.journal import Journal
    from ..core.state import load_safe
    from ..training.checkpoint import save_checkpoint
    from ..training.replay import replay
    from .recipe import from_recipe

    journal = Journal.read_file(expdir / "journal.jsonl")
    final = expdir / "final.pt"
    state = load_safe(final) if final.exists() else {}
    recipe = state.get("recipe")
    if recipe is None:
        raise ConfigError(f"{expdir} has no final.pt with its recipe; `mtlab replay` rebuilds the trainer from it")
    exp = from_recipe(recipe)
    trainer = replay(journal, exp.trainer)
    print(f"replayed {len(journal)} journal entries ({len(journal.changes())} change(s)) to step {trainer.step_count}")
    if out is not None:
        if (out / "final.pt").exists():
            raise ConfigError(f"{out} already holds an experiment; give --expdir a new folder for the replayed run")
        out.mkdir(parents=True, exist_ok=True)
        save_checkpoint(trainer, exp.schedule, out / "final.pt", recipe=recipe)
        trainer.history.to_csv(out / "history.csv", index=False)
        trainer.journal.write(out / "journal.jsonl")
        print(f"experiment folder: {out}")
    import torch

    ours = {f"{m}.{k}": v for m, model in trainer.models.items() for k, v in model.state_dict().items()}
    theirs = {f"{m}.{k}": v for m, sd in state["models"].items() for k, v in sd.items()}
    differ = sorted(k for k in ours if k not in theirs or not torch.equal(ours[k].cpu(), theirs[k]))
    if state["step"] != trainer.step_count or differ:
        print(f"differs from {final} (step {state['step']}): {differ[:5] or 'step count'}", file=sys.stderr)
        return 1
    print(f"bit-identical to {final}: every parameter of step {trainer.step_count}")
    return 0
