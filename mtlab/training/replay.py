"""Replay a journal: train a freshly built trainer through a run's calls, applying each knob change where it
took effect, and get the same run bit for bit (parameters, optimizer state, history).

``fresh`` is built like the original (same models, tasks and seed); the journal may also be a journal.jsonl
path, a JSON string or a Journal:

>>> fresh = build_trainer()  # doctest: +SKIP
>>> mtlab.replay(original.journal, fresh)  # doctest: +SKIP
>>> torch.equal(fresh.params["enc.lin.weight"], original.params["enc.lin.weight"])  # doctest: +SKIP
True

A journal that does not fit the trainer (another task, linked set, model, shape or seed), a trainer that
already trained, or a journal with something no replay can redo (a minibatch passed by hand, a combination
given as an object, a restore of a state from another run) is refused before anything changes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..base.errors import ConfigError, MtlabError
from ..core.knobs import KNOBS
from ..core.journal import Journal, rng_bytes, graph_mismatch, graph_of
from ..core.state import digest
from ..core.trainer import Trainer

__all__ = ["ReplayError", "as_journal", "replay"]


class ReplayError(MtlabError, RuntimeError):
    """The replay went another way than the journal (a call failed in one run and not in the other)."""


def as_journal(journal: Any) -> Journal:
    """A Journal from a Journal, a trainer, a dict, a JSON string, or a path (journal.jsonl or its folder)."""
    if isinstance(journal, Journal):
        return journal
    if isinstance(journal, Trainer):
        return journal.journal
    if isinstance(journal, Mapping):
        return Journal.from_dict(journal)
    if isinstance(journal, str) and journal.lstrip().startswith("{"):
        return Journal.from_json(journal)
    if isinstance(journal, (str, Path)):
        return Journal.read_file(journal)
    raise ConfigError(f"replay(): cannot read a journal from {type(journal).__name__}; pass trainer.journal, "
                      "its to_json() text, or the path of journal.jsonl")


# what a journal records beside the knobs (mtlab.core.knobs.KNOBS, each replayed through Trainer.set); "clip"
# is the one entry for every clip setting that journals written before the knob table hold
OTHER_CHANGES = ("clip", "restore", "resume", "reinitialize", "fork", "data_position", "abandoned")
FIX = ("correct or remove that entry (journal.jsonl is one JSON object a line), or replay the journal the run "
       "wrote")


def _names(e: Mapping[str, Any], trainer: Trainer, task_needed: bool, linkedset: bool) -> str | None:
    """The task (and linked set) a call entry names, against the trainer's graph."""
    task = e.get("task")
    if task is None and not task_needed:
        return None
    if task not in trainer.tasks:
        return f"unknown task {task!r} (tasks: {list(trainer.tasks)})"
    if linkedset and e.get("linkedset") not in trainer.tasks[task].linkedsets:
        return (f"task {task!r} has no linked set {e.get('linkedset')!r} (linked sets: "
                f"{list(trainer.tasks[task].linkedsets)})")
    return None


def knob_sets(e: Mapping[str, Any]) -> list[tuple[str, Any, str | None, str | None]]:
    """The ``Trainer.set`` calls a knob entry stands for: ``(name, value, task, linkedset)`` each."""
    kind = e["kind"]
    if kind == "clip":  # a journal written before the knob table: every clip setting in one entry
        return [("clip_grad_value", e.get("value"), None, None), ("clip_grad_norm", e.get("norm"), None, None),
                ("clip_grad_percentile", e.get("percentile"), None, None),
                ("normalize_gradients", bool(e.get("normalize")), None, None)]
    value = e["method"] if kind == "combine" and "value" not in e and "method" in e else e.get("value")
    return [(kind, value, e.get("task"), e.get("linkedset"))]


def _bad_value(e: Mapping[str, Any], trainer: Trainer) -> str | None:
    """The entry's names and value checked as ``Trainer.set`` checks them (the message says what was expected)."""
    kind = e["kind"]
    try:
        if kind in KNOBS or kind == "clip":
            for name, value, task, linkedset in knob_sets(e):
                trainer.check_knob(name, value, task, linkedset)
        elif kind == "restore" and not (isinstance(e.get("state"), Mapping) and "n" in e["state"]):
            return "a restore without the position of the state it restored"
    except ConfigError as err:
        return str(err)
    return None


def _unreadable(e: Any, trainer: Trainer) -> str | None:
    """What makes an entry's shape unreadable (before the journal is compared with the trainer's graph)."""
    if not isinstance(e, Mapping):
        return f"an entry must be a JSON object, this one is a {type(e).__name__}"
    typ, kind = e.get("type"), e.get("kind")
    if typ not in ("change", "call") or not isinstance(kind, str):
        return "an entry needs 'type' ('change' or 'call') and 'kind' (what changed or which call)"
    if e.get("inside") and (not isinstance(e.get("tick"), int) or isinstance(e.get("tick"), bool)):
        return "a change made during a call needs its 'tick' (a whole number)"
    if typ == "call":
        calls = {"step", "minibatch", "apply", "finish", "reset", "normalize", "clip", *trainer.chain.calls()}
        if kind not in calls:
            return f"unknown call {kind!r} (calls: {sorted(calls)})"
        count = e.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            return f"'count' must be a whole number >= 1, got {count!r}"
    elif kind not in KNOBS and kind not in OTHER_CHANGES and kind != "stage":
        return f"unknown change {kind!r} (changes: {[*KNOBS, *OTHER_CHANGES]})"
    return None


def _malformed(e: Mapping[str, Any], trainer: Trainer) -> str | None:
    """The names an entry gives, against the trainer's graph, and its value, with the setters' checks."""
    kind = e["kind"]
    if e["type"] == "call":
        return _names(e, trainer, kind == "minibatch", kind == "minibatch")
    return _bad_value(e, trainer)


def _why_not(entry: Mapping[str, Any], trainer: Trainer) -> str | None:
    kind = entry["kind"]
    if entry.get("replayable") is False:
        if kind == "restore":
            return "a restore of a state that is not on this journal's line (another run, or a file without journal)"
        return (f"a {kind} change that cannot be written down ({entry.get('value', entry.get('method'))!r}: pass "
                "the method by name)")
    if kind == "stage":
        return ("a schedule stage (segment-length curriculum: data views, batch sizes and, at a new stage, a fresh "
                "optimizer state) that this replay cannot redo")
    if entry.get("batch") == "explicit":
        return "a minibatch passed by hand (process_minibatch(..., batch=...)); its data are not in the journal"
    return None


def _refuse_first(journal: Journal, problem: Any, trainer: Trainer) -> None:
    """Refuse the journal at its first entry for which ``problem(entry, trainer)`` says something."""
    for i, e in enumerate(journal.entries):
        wrong = problem(e, trainer)
        if wrong:
            text = json.dumps(e, default=str)
            raise ConfigError(f"replay(): entry {i} of the journal cannot be read: {wrong}. The entry: "
                              f"{text[:300]}{'...' if len(text) > 300 else ''}. Nothing was replayed; {FIX}")


def check(journal: Journal, trainer: Trainer) -> None:
    """Refuse, naming the entry, why and the fix, a journal that this trainer cannot replay: every entry is read
    and checked (its shape, the names it gives against the trainer's graph, its value with the setters' own
    checks) before anything changes."""
    _refuse_first(journal, _unreadable, trainer)
    bad = [(i, why) for i, e in enumerate(journal.entries) if (why := _why_not(e, trainer))]
    if bad:
        i, why = bad[0]
        raise ConfigError(f"replay(): entry {i} of the journal cannot be replayed: {why} "
                          f"({len(bad)} such entr{'y' if len(bad) == 1 else 'ies'})")
    if trainer.step_count != 0 or not trainer.journal.pristine():
        raise ConfigError(f"replay(): the trainer has already trained or been changed (step {trainer.step_count}, "
                          f"{len(trainer.journal)} journal entries); build a fresh one the way the original was built")
    trainer.streams.check_reproducible(trainer.tasks, "replay()")  # a DataLoader whose batches would differ
    problems = graph_mismatch(graph_of(trainer), journal.header.get("graph", {}))
    if problems:
        raise ConfigError("replay(): the journal does not fit this trainer (" + "; ".join(problems) + "); build the "
                          "trainer from the same recipe (models, tasks, linked sets, seed) as the journal's run")
    _refuse_first(journal, _malformed, trainer)
    initial = journal.header.get("initial")
    if initial is not None:
        ours = digest({k: m.state_dict() for k, m in trainer.models.items()})
        if ours != initial["weights"]:
            raise ConfigError("replay(): the trainer's initial weights differ from those the journal's run started "
                              "from. Build the models exactly as the original run did: call torch.manual_seed(seed) "
                              "right before building them (a recipe does it for you: mtlab.build_trainer, "
                              "`mtlab train`), and load the same pretrained weights, if any, before replaying")


def apply_change(trainer: Trainer, e: Mapping[str, Any]) -> None:
    """Make one recorded knob change (restore, resume and fork are handled by the replay)."""
    kind = e["kind"]
    if kind in KNOBS or kind == "clip":
        for name, value, task, linkedset in knob_sets(e):
            trainer.set(name, value, task, linkedset)
    elif kind == "data_position":
        trainer.set_data_positions(e["positions"])
    elif kind == "reinitialize":
        trainer.reinitialize()
    else:
        raise ReplayError(f"replay(): no way to apply a {kind!r} change")


def _call(trainer: Trainer, e: Mapping[str, Any]) -> None:
    kind = e["kind"]
    if kind == "step":
        trainer.step()
    elif kind == "minibatch":
        trainer.process_minibatch(e["task"], e["linkedset"])
    elif kind in ("apply", "finish"):
        getattr(trainer, kind)()
    elif kind == "reset":
        trainer.reset(e.get("task"))
    else:  # a call of the chain: normalize, clip, a user transform's
        trainer.call(kind, e.get("task"))


def replay(journal: Any, trainer: Trainer, steps: int | None = None) -> Trainer:
    """Train ``trainer`` (freshly built, same models, tasks and seed) through ``journal``; returns it.

    ``steps``: stop once the trainer has applied that many steps (None: the whole journal). The trainer's own
    generator starts where the original run's started."""
    j = as_journal(journal)
    check(j, trainer)
    jr = trainer.journal
    targets = {(e["state"]["n"], e["state"]["k"]) for e in j.entries if e["kind"] == "restore" and e.get("state")}
    captured: dict[tuple[int, int | None], dict[str, Any]] = {}
    jr.id, jr.lineage, jr.header = j.id, [dict(a) for a in j.lineage], json.loads(json.dumps(j.header))
    initial = j.header.get("initial")
    if initial is not None:  # the run's generator, and its root's: a replayed reinitialize() goes back there too
        rng = {"torch": rng_bytes(initial["rng"]), **({"cuda": rng_bytes(initial["cuda_rng"])}
                                                      if "cuda_rng" in initial else {})}
        trainer.rng.load_state_dict(rng)
        trainer.root["rng"] = trainer.rng.state_dict()

    def as_recorded(e: dict[str, Any], fn: Any) -> None:
        before, jr.replaying = jr.replaying, e
        try:
            fn()
        finally:
            jr.replaying = before

    def change(e: dict[str, Any]) -> None:
        kind = e["kind"]
        if kind == "restore":
            key = (e["state"]["n"], e["state"]["k"])
            if key not in captured:
                raise ReplayError(f"replay(): the state restored at step {e['step']} was never reached in the replay")
            as_recorded(e, lambda: trainer.load_state_dict(captured[key], history=e.get("history", True)))
        elif kind == "abandoned":  # the loop rolled back the step before it: as if it never ran, its knob reads too
            jr.tick = max(jr.tick, int(e.get("tick", jr.tick)))
            jr.entries.append(dict(e))
        elif kind in ("resume", "fork"):
            if kind == "resume" and trainer.step_count != e["to_step"]:
                raise ReplayError(f"replay(): the run resumed at step {e['to_step']}, the replay is at step "
                                  f"{trainer.step_count}")
            jr.entries.append(dict(e))  # changes nothing: the state continues (resume) or branches off (fork)
        else:
            as_recorded(e, lambda: apply_change(trainer, e))

    def capture() -> None:
        pos = jr.position()
        key = (pos["n"], pos["k"])
        if key in targets and key not in captured:
            captured[key] = trainer.state_dict()

    def done() -> bool:
        return steps is not None and trainer.step_count >= steps

    entries = j.entries
    i = 0
    capture()
    while i < len(entries) and not done():
        e = dict(entries[i])
        inside = []
        k = i + 1
        while k < len(entries) and entries[k].get("inside"):
            inside.append(dict(entries[k]))
            k += 1
        if e["type"] == "change":
            change(e)
            capture()
            i += 1
            continue
        for x in inside:  # made while this call ran: at the knob read where the original took them
            jr.due.setdefault(x["tick"], []).append(lambda x=x: change(x))
        abandoned = (e.get("failed") and k < len(entries) and entries[k].get("type") == "change"
                     and entries[k].get("kind") == "abandoned")
        for _ in range(0 if abandoned else e.get("count", 1)):  # an abandoned step left nothing to redo
            failed = e.get("failed")
            try:
                as_recorded(e, lambda e=e: _call(trainer, e))
            except Exception as exc:  # noqa: BLE001 (compared with the journal below)
                if not failed:
                    raise ReplayError(f"replay(): entry {i} ({e['kind']} at step {e['step']}) failed in the replay "
                                      f"but not in the original run: {type(exc).__name__}: {exc}") from exc
            else:
                if failed:
                    raise ReplayError(f"replay(): entry {i} ({e['kind']} at step {e['step']}) failed in the original "
                                      f"run ({failed}) but not in the replay")
            capture()
            if done():
                break
        for tick in sorted(jr.due):  # made after the call's last knob read: before the next call, as then
            for fn in jr.due.pop(tick):
                fn()
        capture()
        i = k
    return trainer
