"""Data that moved: an experiment's own ``recipe.toml`` (or ``recipe.json``) is where its data locations change.

``mtlab resume``, ``mtlab evaluate`` and ``mtlab replay`` rebuild an experiment from the recipe its checkpoint
carries. When the user has edited the experiment's copy of the recipe, the data locations written there (a linked
set's ``root`` or ``corpus``, ``feature_inputs``, the ``ivec`` lists, ``dynamic_mix``'s noise, and ``init_file``)
replace the checkpoint's; any other edit is refused naming the key. The data found at the new place are then
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


def relocated(expdir: str | Path, recipe: Mapping[str, Any]) -> dict[str, Any]:
    """The recipe a checkpoint carries, with the data locations of the experiment's edited ``recipe.toml`` (or
    ``recipe.json``); errors name that file. Anything else edited there is refused (ConfigError naming the key
    and its value when the run started); a file that was not edited changes nothing."""
    expdir = Path(expdir)
    out = copy.deepcopy(dict(recipe))
    edited = _edited(expdir, recipe)
    own = expdir / "recipe.toml" if (expdir / "recipe.toml").is_file() else expdir / "recipe.json"
    if edited is None:
        if own.is_file():
            out["source"] = str(own)  # the file to edit, should its data move
        return out
    path, raw, base = edited
    new = resolve_recipe(raw, origin=str(path), base=base)
    old = {k: v for k, v in recipe.items() if k not in MADE_BY_MTLAB}
    new = {k: v for k, v in new.items() if k not in MADE_BY_MTLAB}
    was, now = trainer_settings({**old, "source": str(path)}), trainer_settings({**new, "source": str(path)})
    changed = [(f"trainer.{k}", was[k], now[k]) for k in was if was[k] != now[k]
               and not (k in SET_BY_FLAGS and k not in new.get("trainer", {}))]
    changed += [d for d in _differences({k: v for k, v in old.items() if k != "trainer"},
                                        {k: v for k, v in new.items() if k != "trainer"})]
    refused = [d for d in changed if not LOCATIONS.match(d[0])]
    if refused:
        key, before, after = refused[0]
        more = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
        raise ConfigError(f"{path}: {_shown(key)} is {after!r} here, {before!r} when the run started{more}: only "
                          f"data locations may change in an experiment's recipe ({WHAT_MAY_CHANGE}); put back "
                          f"{_shown(key)} = {before!r}, or start a new experiment with these settings: "
                          f"`mtlab train {path} --expdir NEW_FOLDER`")
    moved = [d for d in changed if LOCATIONS.match(d[0])]
    stats = dict(out.get("stats") or {})
    for tname, task in new.get("tasks", {}).items():
        for sname, sspec in task["linkedsets"].items():
            before = out["tasks"][tname]["linkedsets"][sname]
            key_was, key_now = stats_key(before["data"], sname), stats_key(sspec["data"], sname)
            if key_was in stats:  # the statistics the run normalized with, under the data's new name
                stats.setdefault(key_now, stats[key_was])
            before["data"], before["valid"] = sspec["data"], sspec.get("valid", before.get("valid"))
    if "init_file" in new.get("trainer", {}):
        out["trainer"]["init_file"] = new["trainer"]["init_file"]
    out["stats"], out["source"] = stats, str(path)
    for key, before, after in moved:
        say(f"{path}: {_shown(key)} moved: {before} -> {after}")
    return out
