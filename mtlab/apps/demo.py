"""``mtlab demo``: the main job a newcomer runs first. recipes/demo.toml (two tasks on one shared BLSTM, each on a
clean and a noisy linked set) trained for its first ``DEMO_EPOCHS`` epochs into exp/demo, under a minute of CPU,
ending with what it wrote and the next commands; ``--full`` trains the whole recipe."""

from __future__ import annotations

from pathlib import Path
from typing import Any

DEMO_EPOCHS = 8  # `mtlab demo` trains this many of demo.toml's epochs: 120 steps, under a minute of CPU (bench/demo_time.py)
DEMO_CPU_S = 50  # what bench/demo_time.py measured for them on 2 cores (said at the demo's start)


def demo_recipe() -> Path:
    """The path of recipes/demo.toml (beside the package in a checkout, inside it in a wheel)."""
    here = Path(__file__).resolve().parent  # a checkout has recipes/ beside mtlab/, a wheel inside it
    path = next((p for p in (here.parent / "recipes" / "demo.toml", here / "recipes" / "demo.toml") if p.is_file()),
                here.parent / "recipes" / "demo.toml")
    if not path.is_file():
        from ..base.errors import ConfigError

        raise ConfigError(f"{path}: the demo recipe is not here; run from a checkout of the mtlab repository "
                          "(pip install -e .) or give a recipe to `mtlab train`")
    return path


def quick(recipe: Any) -> dict[str, Any]:
    """The demo recipe (a path or a dict) cut to its first ``DEMO_EPOCHS`` epochs, said with what it costs."""
    from .recipe import load_recipe

    out = dict(load_recipe(recipe) if isinstance(recipe, (str, Path)) else recipe)
    out["trainer"] = {**out["trainer"], "num_epochs": DEMO_EPOCHS}
    print(f"demo: two tasks (speaker id, frame dominance) on one shared BLSTM, each on a clean and a noisy linked "
          f"set; {DEMO_EPOCHS} of recipes/demo.toml's {recipe_epochs()} epochs, about {DEMO_CPU_S} s of "
          "CPU (--full: all of them)", flush=True)
    return out


def recipe_epochs() -> int:
    """How many epochs the whole demo recipe trains (``mtlab demo --full``)."""
    import tomllib

    return int(tomllib.loads(demo_recipe().read_text())["trainer"]["num_epochs"])


def say_next(expdir: Path) -> None:
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
                           f"the whole recipe ({recipe_epochs()} epochs, a few minutes)")):
        print(f"  {command:<54} {what}")
