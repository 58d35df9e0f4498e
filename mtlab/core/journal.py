"""The journal of a run: every knob change and every training call, at the point where it took effect.

``trainer.journal`` records two kinds of entries, in order:

- **changes** (``type: "change"``): linked-set weight, task weight, lr, clip settings, combination method,
  minibatches per step, batch size, restore, resume, re-initialise, fork, data positions (a go-back that goes on
  with the data) and a schedule's next stage, each with its value and its ``source`` (``code``,
  ``dashboard``, ``schedule``, ``validation``);
- **calls** (``type: "call"``): ``step`` (consecutive steps as one entry with a ``count``), ``minibatch``,
  ``normalize``, ``clip``, ``apply``, ``finish``, ``reset``.

Every entry carries ``step`` (steps applied before it), ``minibatch`` (minibatches begun in the accumulation
in progress) and ``tick``: how many times the trainer had read its knobs (at each step's start, each
minibatch, each normalize/clip/apply) before it. A change made from another thread while a step runs (a
dashboard slider) is marked ``inside`` and took effect at the next tick, which is where
``mtlab.replay`` applies it again: the record is exact, not approximate. The journal is plain JSON
(``to_json``/``from_json``, ``journal.jsonl`` in the experiment folder) and part of ``state_dict()``.
"""

from __future__ import annotations

import base64
import contextlib
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from ..base.errors import ConfigError
from .knobtable import change_words


FORMAT = "mtlab-journal"
VERSION = 1
SOURCES = ("code", "dashboard", "schedule", "validation", "attached")
CALLS = ("step", "minibatch", "normalize", "clip", "apply", "finish", "reset")


def graph_of(trainer: Any) -> dict[str, Any]:
    """What a journal must fit: models with parameter shapes, tasks with linked sets and models, seed."""
    return {
        "models": {m: {k: list(v.shape) for k, v in model.state_dict().items()} for m, model in trainer.models.items()},
        "tasks": {n: {"linkedsets": list(t.linkedsets), "models": sorted({p.split(".", 1)[0]
                                                                          for p in trainer.task_params[n]})}
                  for n, t in trainer.tasks.items()},
        "seed": trainer.seed, "acc_steps": trainer.acc_steps,
        "settings": {"lr": trainer.lr, "numbatches_to_aggregate": trainer.numbatches_to_aggregate,
                     "normalize_gradients": trainer.normalize_gradients, "clip": list(trainer.clip_settings()),
                     "nonfinite": trainer.nonfinite, "combine": str(trainer.update.method),
                     "precision": trainer.precision.mode, "weights": trainer.weights(),
                     "optimizer": str(getattr(trainer, "optimizer_name", None)),
                     "linkedset_weights": getattr(trainer, "linkedset_weights", "absolute"),
                     "noise_scale": trainer.noise_scale is not None,
                     "batch_size": {n: t.batch_size for n, t in trainer.tasks.items()}},
    }


def graph_mismatch(ours: Mapping[str, Any], theirs: Mapping[str, Any]) -> list[str]:
    """The differences between two ``graph_of`` signatures, in words (empty: they fit)."""
    out: list[str] = []
    for key, what in (("models", "models"), ("tasks", "tasks")):
        a, b = set(ours.get(key, {})), set(theirs.get(key, {}))
        if a != b:
            out.append(f"{what}: the journal has {sorted(b)}, the trainer {sorted(a)}")
    for m in set(ours.get("models", {})) & set(theirs.get("models", {})):
        if ours["models"][m] != theirs["models"][m]:
            out.append(f"model {m!r} has other parameters or shapes")
    for t in set(ours.get("tasks", {})) & set(theirs.get("tasks", {})):
        for part in ("linkedsets", "models"):
            if ours["tasks"][t][part] != theirs["tasks"][t][part]:
                out.append(f"task {t!r}: {part} {theirs['tasks'][t][part]} in the journal, "
                           f"{ours['tasks'][t][part]} in the trainer")
    for key in ("seed", "acc_steps"):
        if ours.get(key) != theirs.get(key):
            out.append(f"{key}: {theirs.get(key)!r} in the journal, {ours.get(key)!r} in the trainer")
    mine, saved = ours.get("settings", {}), theirs.get("settings", {})
    out += [f"initial {key}: {saved.get(key)!r} in the journal, {mine.get(key)!r} in the trainer"
            for key in sorted(set(mine) | set(saved)) if mine.get(key) != saved.get(key)]
    return out


def b64(t: torch.Tensor) -> str:
    """An RNG state (uint8 tensor) as base64 text, for the JSON header."""
    return base64.b64encode(t.contiguous().numpy().tobytes()).decode("ascii")


def rng_bytes(s: str) -> torch.Tensor:
    """The RNG state ``b64`` wrote."""
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8).clone()


def jsonl_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of ``journal.jsonl``, one a line (its header first); a damaged line is refused naming the
    file and the line."""
    if not path.is_file():
        raise ConfigError(f"no journal at {path}; an experiment folder written by mtlab.run holds journal.jsonl")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot be read as a journal ({exc})") from exc
    lines: list[dict[str, Any]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}, line {number}: not a JSON line ({exc.msg} at column {exc.colno}); the "
                              "journal is damaged (a killed write, an edit?): restore it from a copy or replay "
                              "the lines before it") from None
        if not isinstance(item, dict):
            raise ConfigError(f"{path}, line {number}: a journal entry must be a JSON object, got "
                              f"{type(item).__name__}; the journal is damaged") from None
        if lines and (item.get("type") not in ("change", "call") or not isinstance(item.get("kind"), str)):
            raise ConfigError(f"{path}, line {number}: not a journal entry (it needs 'type': 'change' or 'call' "
                              "and a 'kind'); the journal is damaged") from None
        lines.append(item)
    if not lines:
        raise ConfigError(f"{path} is empty")
    return lines


class Journal:
    """Ordered record of one run's changes and calls; see the module docstring.

    >>> trainer.set_weight("a", "noisy", 0.2); trainer.step()  # doctest: +SKIP
    >>> trainer.journal.lines()[-1]  # doctest: +SKIP
    'step 0: a/noisy weight -> 0.2 (code)'
    >>> with trainer.journal.source("schedule"):  # doctest: +SKIP
    ...     trainer.lr = 1e-4
    """

    def __init__(self, graph: Mapping[str, Any] | None = None) -> None:
        self.lock = threading.RLock()  # setters and the trainer's knob reads, in one order
        self.id = uuid.uuid4().hex
        self.lineage: list[dict[str, Any]] = []  # ancestors: [{"id", "n", "name"}] (forks)
        self.header: dict[str, Any] = {"graph": dict(graph or {}), "initial": None}
        self.entries: list[dict[str, Any]] = []
        self.tick = 0
        self.minibatch = 0
        self.depth = 0  # 1 while a call of the trainer runs: changes recorded then are marked inside
        self._local = threading.local()
        self._quiet = 0
        self.replaying: dict[str, Any] | None = None  # set by mtlab.replay: the entry being applied
        self.due: dict[int, list[Any]] = {}  # tick -> callables mtlab.replay applies at that tick
        # knob changes made while a call of the trainer runs (mtlab.core.scope): (what, apply), applied at the
        # call's next knob read, or when it ends
        self.pending: list[tuple[str, Callable[[], None]]] = []
        self.pending_lock = threading.Lock()

    # ------------------------------------------------------------------ sources
    @contextlib.contextmanager
    def source(self, name: str) -> Iterator[None]:
        """Record the changes made inside the block as coming from ``name``."""
        if name not in SOURCES:
            raise ConfigError(f"journal source {name!r} is not one of {SOURCES}")
        stack = self._local.__dict__.setdefault("stack", [])
        stack.append(name)
        try:
            yield
        finally:
            stack.pop()

    def current_source(self) -> str:
        """Where a change made now comes from (this thread's innermost ``source()``; ``code`` outside any)."""
        stack = self._local.__dict__.get("stack")
        return stack[-1] if stack else "code"

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        """Changes made inside (a restore setting every knob) are not recorded one by one."""
        with self.lock:
            self._quiet += 1
        try:
            yield
        finally:
            with self.lock:
                self._quiet -= 1

    # ------------------------------------------------------------------ recording
    def pristine(self) -> bool:
        """Nothing recorded yet (a freshly built trainer)."""
        return not self.entries and self.header.get("initial") is None

    def begin(self, trainer: Any) -> None:
        """Before the first call or restore: the initial weights' digest and the RNG state, so a replay can
        check it starts from the same weights and draws the same random numbers."""
        if self.header.get("initial") is not None:
            return
        from .state import digest  # a light module; imported here to keep this one free of the checkpoint code

        rng = trainer.rng  # the run's own generator (mtlab.core.scope.RunRandom)
        initial: dict[str, Any] = {"weights": digest({k: m.state_dict() for k, m in trainer.models.items()}),
                                   "rng": b64(rng.cpu)}
        if rng.cuda is not None:
            initial["cuda_rng"] = b64(rng.cuda)
        self.header["initial"] = initial

    def _entry(self, typ: str, kind: str, step: int, payload: Mapping[str, Any]) -> dict[str, Any]:
        r = self.replaying
        if r is not None:  # a replay writes the original's entry again
            out = {k: v for k, v in r.items() if k != "failed"}
            if typ == "call" and kind == "step":
                out["count"] = 1
            return out
        return {"type": typ, "kind": kind, "step": step, "minibatch": self.minibatch, "tick": self.tick,
                "source": self.current_source(), "inside": self.depth > 0, "time": round(time.time(), 3), **payload}

    def change(self, kind: str, step: int, **payload: Any) -> dict[str, Any] | None:
        """Record a knob change (callers hold ``lock`` while changing the knob and recording it)."""
        with self.lock:
            if self._quiet:
                return None
            entry = self._entry("change", kind, step, payload)
            self.entries.append(entry)
            return entry

    def enter_call(self, trainer: Any, kind: str, payload: Mapping[str, Any]) -> dict[str, Any] | None:
        """An outer call begins (``mtlab.core.scope.Scope``): its entry (None while quiet; consecutive steps share
        one, counted). Changes recorded until ``exit_call`` are marked ``inside``. Written out rather than split
        in helpers: this runs at every call of every step."""
        with self.lock:
            entry = None
            if not self._quiet:
                if self.header.get("initial") is None:
                    self.begin(trainer)
                step, entries, r = trainer.step_count, self.entries, self.replaying
                last = entries[-1] if entries else None
                if kind == "step" and last is not None and last["type"] == "call" and last["kind"] == "step" \
                        and "failed" not in last and last["step"] + last["count"] == step:
                    last["count"] += 1
                    entry = last
                else:
                    if r is not None:  # a replay writes the original's entry again
                        entry = {k: v for k, v in r.items() if k != "failed"}
                    else:
                        stack = self._local.__dict__.get("stack")
                        entry = {"type": "call", "kind": kind, "step": step, "minibatch": self.minibatch,
                                 "tick": self.tick, "source": stack[-1] if stack else "code", "inside": False,
                                 "time": round(time.time(), 3), **payload}
                    if kind == "step":
                        entry["count"] = 1
                    entries.append(entry)
            self.depth += 1
            return entry

    def exit_call(self, entry: dict[str, Any] | None, kind: str, step: int, error: str | None) -> None:
        """The outer call ends (``error``: the name of the exception it raised); a failed call is marked."""
        with self.lock:
            self.depth -= 1
            if error is not None and entry is not None:
                self._fail_call(entry, kind, step, error)

    def _fail_call(self, entry: dict[str, Any], kind: str, step: int, error: str) -> None:
        """An outer call raised ``error`` (hold ``lock``): a failed step gets an entry of its own."""
        if kind == "step" and entry["count"] > 1:
            entry["count"] -= 1
            failed = {**entry, "count": 1, "step": step, "failed": error}
            at = next(i for i, e in enumerate(self.entries) if e is entry)
            self.entries.insert(at + 1, failed)  # before the changes made during the failed step
        else:
            entry["failed"] = error

    def read(self, kind: str) -> None:
        """The trainer is about to read its knobs (step start, minibatch, normalize, clip, apply); hold ``lock``.
        The knob changes made meanwhile from another thread take effect here; a replay applies here the changes
        that were made at this point of the original run."""
        if self.pending:
            self.run_pending()
        for apply_change in self.due.pop(self.tick, ()):
            apply_change()
        self.tick += 1
        if kind == "minibatch":
            self.minibatch += 1
        elif kind == "step":
            self.minibatch = 0

    def run_pending(self) -> None:
        """Apply the queued knob changes, in the order they were made (the trainer's lock held)."""
        with self.pending_lock:
            todo, self.pending = self.pending, []
        for _, apply in todo:
            apply()

    def applied(self) -> None:
        """A step was applied (or its accumulation reset): the next minibatch is the first of a new one."""
        self.minibatch = 0

    # ------------------------------------------------------------------ reading
    def changes(self) -> list[dict[str, Any]]:
        """The knob changes only (no training calls)."""
        return [e for e in self.entries if e["type"] == "change"]

    def position(self) -> dict[str, Any]:
        """Where the run stands in this journal (kept in ``state_dict()``: a restore of that state names it)."""
        last = self.entries[-1] if self.entries else None
        return {"id": self.id, "n": len(self.entries),
                "k": last["count"] if last is not None and last["kind"] == "step" and last["type"] == "call" else None}

    def knows(self, position: Mapping[str, Any]) -> bool:
        """True when ``position`` (of a state's journal) lies on this journal's own line: a replay can
        reproduce that state."""
        if position.get("id") == self.id:
            return position["n"] <= len(self.entries)
        return any(a["id"] == position.get("id") and position["n"] <= a["n"] for a in self.lineage)

    def frame(self) -> Any:
        """A pandas DataFrame, one row per entry."""
        import pandas as pd

        return pd.DataFrame(self.entries)

    def lines(self, calls: bool = False) -> list[str]:
        """One line of text per change (and per call with ``calls=True``), for logs and the dashboard."""
        out = []
        for e in self.entries:
            if e["type"] == "call" and not calls:
                continue
            if e["type"] == "change":
                what = change_words(e) or e["kind"]
            else:
                skip = {"type", "kind", "step", "minibatch", "tick", "source", "inside", "time"}
                what = f"{e['kind']} " + ", ".join(f"{k}={v}" for k, v in e.items() if k not in skip)
            where = f"step {e['step']}" + (f", minibatch {e['minibatch']}" if e["minibatch"] else "")
            out.append(f"{where}: {what.rstrip()} ({e['source']}{', during the step' if e['inside'] else ''})")
        return out

    def __len__(self) -> int:
        return len(self.entries)

    def __repr__(self) -> str:
        return (f"Journal({len(self.changes())} change(s), {len(self.entries) - len(self.changes())} call "
                f"entries, id={self.id[:8]})")

    # ------------------------------------------------------------------ plain JSON
    def to_dict(self) -> dict[str, Any]:
        """The whole journal as plain JSON-compatible containers (a copy)."""
        with self.lock:
            return json.loads(json.dumps({"format": FORMAT, "version": VERSION, "id": self.id,
                                          "lineage": self.lineage, "header": self.header,
                                          "entries": self.entries, "tick": self.tick}))

    def to_json(self) -> str:
        """The whole journal as one JSON text (``from_json`` reads it back)."""
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Journal:
        """A journal from ``to_dict()``'s containers; refuses anything else, naming what it expected."""
        if not isinstance(data, Mapping) or data.get("format") != FORMAT:
            raise ConfigError("not an mtlab journal (expected the JSON Journal.to_json() writes, with "
                              f"'format': {FORMAT!r})")
        if data.get("version") != VERSION:
            raise ConfigError(f"journal version {data.get('version')!r} is not supported ({VERSION}); replay it "
                              "with the mtlab that wrote it")
        j = cls()
        j.id, j.lineage, j.header = data["id"], [dict(a) for a in data["lineage"]], dict(data["header"])
        j.entries = [dict(e) if isinstance(e, Mapping) else e for e in data["entries"]]  # replay names a bad one
        j.tick = int(data.get("tick", 0))
        return j

    @classmethod
    def from_json(cls, text: str) -> Journal:
        """A journal from ``to_json()``'s text."""
        return cls.from_dict(json.loads(text))

    def to_jsonl(self) -> list[str]:
        """The lines of ``journal.jsonl``: a header, then one per entry."""
        data = self.to_dict()
        entries = data.pop("entries")
        return [json.dumps(x) for x in [data, *entries]]

    def write(self, path: str | Path) -> Path:
        """``journal.jsonl``: a header line, then one line per entry. Written whole or not at all: a failed
        write (a full disk) leaves the previous file as it was, no temporary file, and names the file."""
        from .state import CheckpointError

        path = Path(path)
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            tmp.write_text("".join(line + "\n" for line in self.to_jsonl()))
            tmp.replace(path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise CheckpointError(f"{path}: the journal could not be written ({exc.strerror or exc}); "
                                  f"{'the previous one is unchanged' if path.exists() else 'nothing was written'}; "
                                  "free some space (or choose another folder) and save again") from exc
        return path

    @classmethod
    def read_file(cls, path: str | Path) -> Journal:
        """A journal from ``journal.jsonl`` (or the experiment folder that holds it). A damaged file (a truncated
        or garbled line, an entry that is not an object) is refused naming the file and the line."""
        path = Path(path)
        if path.is_dir():
            path = path / "journal.jsonl"
        lines = jsonl_lines(path)
        try:
            return cls.from_dict({**lines[0], "entries": lines[1:]})
        except ConfigError as exc:
            raise ConfigError(f"{path}, line 1: {exc}") from None
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{path}, line 1: not a journal header ({type(exc).__name__}: {exc})") from None

    def state_dict(self) -> dict[str, Any]:
        """As kept in a trainer state: the JSON text and the position (plain containers)."""
        return {"json": self.to_json(), "position": self.position()}

    def adopt(self, state: Mapping[str, Any]) -> None:
        """Continue the journal of a loaded state (a resumed run)."""
        other = Journal.from_json(state["json"])
        with self.lock:
            self.id, self.lineage, self.header = other.id, other.lineage, other.header
            self.entries, self.tick = other.entries, other.tick


def knob_differences(journals: Mapping[str, Journal]) -> dict[str, list[str]]:
    """Run name -> its knob changes after the entries all the journals share (a fork's common past), one
    line each: what sets the runs apart. Unrelated runs share nothing, and list all their changes."""
    lists = [j.entries for j in journals.values()]
    shared = 0
    if lists:
        for shared in range(min(len(e) for e in lists) + 1):
            if shared == min(len(e) for e in lists) or any(e[shared] != lists[0][shared] for e in lists[1:]):
                break
    out: dict[str, list[str]] = {}
    for name, j in journals.items():
        tail = Journal()
        tail.entries = [e for e in j.entries[shared:] if e["type"] == "change" and e["kind"] != "fork"]
        out[name] = tail.lines()
    return out

