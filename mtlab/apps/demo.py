"""``mtlab demo``: the main job a newcomer runs first. recipes/demo.toml (two tasks on one shared BLSTM, each on a
clean and a noisy linked set) trained for its first ``DEMO_EPOCHS`` epochs into exp/demo, under a minute of CPU,
ending with what it wrote and the next commands; ``--full`` trains the whole recipe."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

DEMO_EPOCHS = 8  # `mtlab demo` trains this many of demo.toml's epochs: 120 steps, under a minute of CPU (bench/demo_time.py)
DEMO_CPU_S = 50  # what bench/demo_time.py measured for them on 2 cores (said at the demo's start)


def _demo_recipe() -> Path:
    here = Path(__file__).resolve().parent  # a checkout has recipes/ beside mtlab/, a wheel inside it
    path = next((p for p in (here.parent / "recipes" / "demo.toml", here / "recipes" / "demo.toml") if p.is_file()),
                here.parent / "recipes" / "demo.toml")
    if not path.is_file():
        from ..base.errors import ConfigError

        raise ConfigError(f"{path}: the demo recipe is not here; run from a checkout of the mtlab repository "
                          "(pip install -e .) or give a recipe to `mtlab train`")
    return path


def _demo(args: argparse.Namespace) -> int:
    """``mtlab demo``: recipes/demo.toml into exp/demo (exp/demo-2, ... when it holds a run)."""
    from ..base.errors import ConfigError
    from ..training.expdir import held_run
    from . import cli
    from .recipe import from_recipe

    if args.steps is not None and args.steps < 1:  # refused before anything is written: no empty folder
        raise ConfigError(f"--steps {args.steps}: the demo would train nothing; leave --steps out to train it all, "
                          "or give --steps N with N >= 1")
    expdir = args.expdir
    if expdir is None:
        expdir, n = Path("exp/demo"), 1
        while held_run(expdir):
            n += 1
            expdir = Path(f"exp/demo-{n}")
    cli._fresh_expdir(expdir)
    recipe: Any = cli._with_flags(_demo_recipe(), args)
    if not args.full:
        from .recipe import load_recipe

        recipe = dict(load_recipe(recipe) if isinstance(recipe, (str, Path)) else recipe)
        recipe["trainer"] = {**recipe["trainer"], "num_epochs": DEMO_EPOCHS}
        print(f"demo: two tasks (speaker id, frame dominance) on one shared BLSTM, each on a clean and a noisy linked "
              f"set; {DEMO_EPOCHS} of recipes/demo.toml's {_demo_recipe_epochs()} epochs, about {DEMO_CPU_S} s of "
              "CPU (--full: all of them)", flush=True)
    code = cli._train(from_recipe(recipe), expdir, args)
    if code == 0:
        _demo_next(expdir)
    return code


def _demo_recipe_epochs() -> int:
    import tomllib

    return int(tomllib.loads(_demo_recipe().read_text())["trainer"]["num_epochs"])


def _demo_next(expdir: Path) -> None:
    """The demo's last lines: what it wrote, and where to go next."""
    figures = [n for n in ("losses.png", "grad_norms.png", "history.png") if (expdir / n).is_file()]
    tables = [n for n in ("history.csv", "validation.csv", "journal.jsonl", "summary.txt") if (expdir / n).is_file()]
    checkpoints = [n for n in ("final.pt", "best.pt") if (expdir / n).is_file()]
    print(f"wrote in {expdir}: figures {', '.join(figures)}; tables {', '.join(tables)}; "
          f"checkpoints {', '.join(checkpoints)}")
    print("next:")
    for command, what in (("jupyter lab notebooks/01_quickstart.ipynb", "the same cycle one call at a time, with live sliders"),
                          (f"mtlab replay {expdir}", "rerun this run from its journal, bit for bit"),
                          ("mtlab train recipes/demo.toml --expdir exp/demo-full",
                           f"the whole recipe ({_demo_recipe_epochs()} epochs, a few minutes)")):
        print(f"  {command:<54} {what}")
