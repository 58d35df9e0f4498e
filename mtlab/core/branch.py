"""Branches and restores of a trainer, journaled: ``Trainer.fork`` and the journal side of ``load_state_dict``."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from . import state as checkpoint
from ..base.errors import ConfigError
from .events import Event, ForkInfo
from .noise import NoiseScale



def restore_journaled(trainer: Any, state: Mapping[str, Any], history: bool = True,
                      source: str = "the state") -> None:
    """Load a state and journal it: a fresh trainer continues the state's journal (a resume); any other
    records a restore naming where that state stood in its journal (a replay can take it again)."""
    journal = trainer.journal
    saved = state.get("journal") if isinstance(state, Mapping) else None
    adopt = journal.pristine() and trainer.step_count == 0 and saved is not None
    if not adopt:
        journal.begin(trainer)
    with journal.lock, journal.quiet():
        checkpoint.load_trainer_state(trainer, state, history, source=source)
    if adopt:
        journal.adopt(saved)
        trainer.record_change("resume", to_step=trainer.step_count)
        return
    position = saved["position"] if saved is not None else None
    trainer.record_change("restore", state=position, to_step=trainer.step_count, history=bool(history),
                           **({} if position is not None and journal.knows(position) else {"replayable": False}))


def fork_trainer(trainer: Any, name: str, state: Mapping[str, Any] | None = None) -> Any:
    """``Trainer.fork``: the same constructor arguments, copies of the models, the tasks' weights and batch
    sizes (their data shared), then this trainer's state and journal."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"fork(): name must be a non-empty string, got {name!r}")
    if trainer.parallel.reducer is not None:
        raise ConfigError("fork(): not while data parallel training is attached; fork in a single process")
    with trainer.lock:
        build = dict(trainer.build_args)
        if build.get("combine") is not None and not isinstance(build["combine"], (str, Mapping)):
            build["combine"] = copy.deepcopy(build["combine"])  # a stateful method object: the branch's own
        if trainer.noise_scale is not None:  # given to the constructor or attached since
            build["noise_scale"] = NoiseScale(trainer.noise_scale.beta)
        models = {k: copy.deepcopy(getattr(m, "_orig_mod", m)) for k, m in trainer.models.items()}
        tasks = []
        for t in trainer.tasks.values():
            twin = copy.copy(t)  # the data are shared; weights and batch size are the branch's own
            twin.linkedsets = {k: copy.copy(ls) for k, ls in t.linkedsets.items()}
            tasks.append(twin)
        branch = type(trainer)(models, tasks, **build)
        branch.name = name
        branch.root = trainer.root  # "initial" means the run's: reinitialize() goes there on every branch
        with branch.journal.quiet():
            checkpoint.load_trainer_state(branch, trainer.state_dict(), source=f"the state of {trainer.name!r}")
        if state is not None:  # a state the branch cannot take is refused before the parent records anything
            checkpoint.check_trainer_state(branch, state, source="fork(state=...)")
        trainer.journal.begin(trainer)
        with trainer.journal.lock:
            trainer.journal.change("fork", trainer.step_count, name=name, branch=branch.journal.id,
                                   parent=trainer.name)
            parent = trainer.journal.to_dict()
        j = branch.journal
        j.header, j.entries, j.tick = parent["header"], parent["entries"], parent["tick"]
        j.lineage = [*parent["lineage"], {"id": parent["id"], "n": len(parent["entries"]), "name": trainer.name}]
        trainer.events.emit(Event.FORK, ForkInfo(name=name, step=trainer.step_count))
    if state is not None:
        branch.load_state_dict(state)
    return branch
