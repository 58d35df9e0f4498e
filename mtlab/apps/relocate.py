"""Data that moved: an experiment's own ``recipe.toml`` (or ``recipe.json``) is where its data locations change.

``mtlab resume``, ``mtlab evaluate`` and ``mtlab replay`` rebuild an experiment from the recipe its checkpoint
carries. When the user has edited the experiment's copy of the recipe, the data locations written there (a linked
set's ``root`` or ``corpus``, ``feature_inputs``, the ``ivec`` lists, ``dynamic_mix``'s noise, and ``init_file``)
replace the checkpoint's, as does ``--moved OLD=NEW`` on those commands; any other edit is refused naming the key. The data found at the new place are then
checked against the fingerprints the run recorded when it started (``mtlab.apps.recipe.fingerprint``).

Examples:
    >>> recipe = relocated("exp/run", load_safe("exp/run/final.pt")["recipe"])  # doctest: +SKIP
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..base.errors import ConfigError
from ..base.report import say
from ..training.expdir import COPY_MARK
from .recipe import resolve_recipe, stats_key
from .settings import trainer_settings

# Where a recipe names places rather than settings (paths relative to its tables)
LOCATIONS = re.compile(r"^(trainer\.init_file|tasks\.[^.]+\.linkedsets\.[^.]+\.(data|valid)\.(root|corpus|"
                       r"feature_inputs\.[^.]+|ivec\.list|ivec\.stats_list|dynamic_mix\.noise))$")
SET_BY_FLAGS = ("precision", "compile")  # --precision and --compile write these into the run's recipe
MADE_BY_MTLAB = ("source", "stats", "fingerprints", "trainer_cfg")
WHAT_MAY_CHANGE = "root, corpus, feature_inputs, the ivec lists, dynamic_mix noise and init_file"


def _edited(expdir: Path, recipe: Mapping[str, Any]) -> tuple[Path, dict[str, Any], Path] | None:
    """(the file, its recipe as written, the folder its relative paths are read from) when the experiment's copy
    of the recipe differs from what the run started with; None when it does not, or there is none."""
    toml, js = expdir / "recipe.toml", expdir / "recipe.json"
    if toml.is_file():
        text = toml.read_text()
        lines = text.splitlines(keepends=True)
        marks = [i for i, line in enumerate(lines) if line.startswith(COPY_MARK)]
        if not marks:
            return None  # a copy without the mark (an older mtlab's): its relative paths cannot be placed
        fields = dict(re.findall(r"(\w+)=(\S.*?)(?=\s+\w+=|$)", lines[marks[0]][len(COPY_MARK):].strip()))
        body = "".join(lines[marks[0] + 1:])
        if hashlib.sha1(body.encode()).hexdigest() == fields.get("sha1"):
            return None
        try:
            raw = tomllib.loads(body)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{toml}: not valid TOML ({exc}); fix the line it names") from None
        return toml, raw, Path(fields.get("base", str(expdir)))
    if js.is_file():
        try:
            raw = json.loads(js.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{js}: not valid JSON ({exc}); fix the line it names") from None
        if raw == json.loads(json.dumps(recipe)):
            return None
        return js, {k: v for k, v in raw.items() if k not in MADE_BY_MTLAB}, expdir
    return None


def _differences(a: Any, b: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """Every leaf where ``a`` and ``b`` differ, as (dotted path, value in a, value in b); a missing key is None."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        out = []
        for key in dict.fromkeys([*a, *b]):
            out += _differences(a.get(key), b.get(key), f"{path}.{key}" if path else str(key))
        return out
    return [] if a == b else [(path, a, b)]


def _shown(path: str) -> str:
    """A dotted path as the recipe's TOML writes it: ``[tasks.spk.linkedsets.clean] data.root``."""
    parts = path.split(".")
    if parts[0] == "tasks" and len(parts) > 4 and parts[2] == "linkedsets":
        return f"[{'.'.join(parts[:4])}] {'.'.join(parts[4:])}"
    if parts[0] in ("tasks", "models") and len(parts) > 2:
        return f"[{'.'.join(parts[:2])}] {'.'.join(parts[2:])}"
    return f"[{parts[0]}] {'.'.join(parts[1:])}" if len(parts) > 1 else parts[0]


def _under(value: str, old: str, new: str) -> str | None:
    """``value`` with its leading ``old`` folder replaced by ``new``; None when it is not under ``old``."""
    if value == old or value.startswith(old.rstrip("/") + "/"):
        return new.rstrip("/") + value[len(old.rstrip("/")):] if value != old else new
    return None


def _apply_moves(recipe: dict[str, Any], moves: list[tuple[str, str]]) -> None:
    """Every data location of ``recipe`` under a moved folder (``--moved OLD=NEW``), rewritten in place."""
    places: list[tuple[dict[str, Any], str]] = []  # (table, key) of each location
    if isinstance(recipe.get("trainer", {}).get("init_file"), str):
        places.append((recipe["trainer"], "init_file"))
    for task in recipe.get("tasks", {}).values():
        for sspec in task["linkedsets"].values():
            for part in ("data", "valid"):
                data = sspec.get(part)
                if not isinstance(data, dict):
                    continue
                places += [(data, "root")] if isinstance(data.get("root"), str) else []
                for table, keys in ((data.get("feature_inputs"), None), (data.get("ivec"), ("list", "stats_list")),
                                    (data.get("dynamic_mix"), ("noise",))):
                    if isinstance(table, dict):
                        places += [(table, k) for k in (keys or table) if isinstance(table.get(k), str)]
    for old, new in moves:
        hits = [(t, k, moved) for t, k in places if (moved := _under(t[k], old, new)) is not None]
        if not hits:
            shown = sorted({t[k] for t, k in places})
            raise ConfigError(f"--moved {old}={new}: no data location of the experiment is under {old}; its data are "
                              f"at {shown[:4]}; give the folder that moved as OLD")
        for table, key, moved in hits:
            table[key] = moved


def _parse_moves(moves: list[str] | None) -> list[tuple[str, str]]:
    out = []
    for text in moves or []:
        old, sep, new = text.partition("=")
        if not sep or not old or not new:
            raise ConfigError(f"--moved {text}: write --moved OLD=NEW, the folder the data were in and where they are "
                              "now (e.g. --moved /scratch/corpus=/data/corpus)")
        out.append((str(Path(old).expanduser().absolute()), str(Path(new).expanduser().resolve())))
    return out


def relocated(expdir: str | Path, recipe: Mapping[str, Any], moves: list[str] | None = None) -> dict[str, Any]:
    """The recipe a checkpoint carries, with the data locations of the experiment's edited ``recipe.toml`` (or
    ``recipe.json``) and of ``moves`` (``["OLD=NEW", ...]``: every location under the folder OLD is now under NEW);
    errors name that file. Anything else edited there is refused (ConfigError naming the key and its value when
    the run started); a file that was not edited changes nothing."""
    expdir = Path(expdir)
    out = copy.deepcopy(dict(recipe))
    pairs = _parse_moves(moves)
    edited = _edited(expdir, recipe)
    own = expdir / "recipe.toml" if (expdir / "recipe.toml").is_file() else expdir / "recipe.json"
    if own.is_file():
        out["source"] = str(own)  # the file to edit, should its data move
    if edited is not None:
        path, raw, base = edited
        new = resolve_recipe(raw, origin=str(path), base=base)
        old = {k: v for k, v in recipe.items() if k not in MADE_BY_MTLAB}
        new = {k: v for k, v in new.items() if k not in MADE_BY_MTLAB}
        was, now = trainer_settings({**old, "source": str(path)}), trainer_settings({**new, "source": str(path)})
        changed = [(f"trainer.{k}", was[k], now[k]) for k in was if was[k] != now[k]
                   and not (k in SET_BY_FLAGS and k not in new.get("trainer", {}))]
        changed += _differences({k: v for k, v in old.items() if k != "trainer"},
                                {k: v for k, v in new.items() if k != "trainer"})
        refused = [d for d in changed if not LOCATIONS.match(d[0])]
        if refused:
            key, before, after = refused[0]
            more = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
            raise ConfigError(f"{path}: {_shown(key)} is {after!r} here, {before!r} when the run started{more}: "
                              f"only data locations may change in an experiment's recipe ({WHAT_MAY_CHANGE}); put "
                              f"back {_shown(key)} = {before!r}, or start a new experiment with these settings: "
                              f"`mtlab train {path} --expdir NEW_FOLDER`")
        for tname, task in new.get("tasks", {}).items():
            for sname, sspec in task["linkedsets"].items():
                into = out["tasks"][tname]["linkedsets"][sname]
                into["data"], into["valid"] = sspec["data"], sspec.get("valid", into.get("valid"))
        if "init_file" in new.get("trainer", {}):
            out["trainer"]["init_file"] = new["trainer"]["init_file"]
    _apply_moves(out, pairs)
    stats = dict(out.get("stats") or {})
    for tname, task in out.get("tasks", {}).items():
        for sname, sspec in task["linkedsets"].items():
            before = recipe["tasks"][tname]["linkedsets"][sname]["data"]
            key_was, key_now = stats_key(before, sname), stats_key(sspec["data"], sname)
            if key_was in stats:  # the statistics the run normalized with, under the data's new name
                stats.setdefault(key_now, stats[key_was])
    if "stats" in out or stats:
        out["stats"] = stats
    where = f"{out['source']}" if edited is not None else "--moved"
    for key, before, after in _differences({k: recipe.get(k) for k in ("trainer", "tasks")},
                                           {k: out.get(k) for k in ("trainer", "tasks")}):
        if LOCATIONS.match(key):
            say(f"{where}: {_shown(key)} moved: {before} -> {after}")
    return out
