"""``mtlab test EXPDIR``: an experiment trained from an original Nabu-MSSS recipe, tested as the original's
``run test`` does (the test loss, the separated signals and their scores; see :mod:`mtlab.nabu.evaluation`).

Examples:
    >>> result = run_test("exp/dc", limit=10)  # doctest: +SKIP
    >>> print(format_table(result.summary))  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..nabu.evaluation import EvalResult, EvalTask, evaluate_tests, format_table, open_test, stats_for_test
from .recipe import from_recipe, load_initial_weights, stats_key


def recipe_for_test(recipe: Mapping[str, Any], tests: Mapping[str, EvalTask]) -> dict[str, Any]:
    """An mtlab recipe of the test tasks over the experiment's models and feature statistics."""
    trainer = {k: recipe["trainer"][k] for k in ("seed", "device") if k in recipe.get("trainer", {})}
    runs = {n: t for n, t in tests.items() if not t.refused}  # a refused task is reported, not built
    return {"name": f"{recipe.get('name', 'experiment')} (test)", "trainer": {**trainer, "tasks": list(runs)},
            "models": recipe["models"], "tasks": {n: t.task for n, t in runs.items()},
            "stats": stats_for_test(recipe, tests, stats_key)}


def run_test(expdir: str | Path, out: str | Path | None = None, checkpoint: str = "final", limit: int | None = None,
             pesq: bool = False, recipe_dir: str | Path | None = None, data_root: str | Path | None = None,
             seed: int = 0, echo: Callable[[str], None] | None = None, order: str = "sir",
             wav_format: str = "int16") -> EvalResult:
    """Test the experiment in ``expdir`` (its ``final.pt``, ``best.pt`` or a checkpoint path); the recipe folder
    and data root are the ones it was imported with unless given. Writes under ``out`` (``EXPDIR/test``).
    ``order``: speakers matched by the original's mean SIR (``"sir"``) or by SI-SDR; ``wav_format``: ``"int16"``
    or the original's ``"float32"``."""
    ckpt, recipe, tests = open_test(expdir, checkpoint, recipe_dir, data_root)
    trainer = None
    if any(not t.refused for t in tests.values()):  # else every task is reported as refused
        exp = from_recipe(recipe_for_test(recipe, tests), init_weights=False)
        load_initial_weights(exp.trainer, ckpt, origin=str(ckpt))
        trainer = exp.trainer
    return evaluate_tests(trainer, tests, Path(out) if out is not None else Path(expdir) / "test", limit, pesq,
                          seed, echo, order, wav_format)


def cli(expdir: Path, out: Path | None, checkpoint: str, limit: int | None, pesq: bool, recipe_dir: Path | None,
        data_root: Path | None, seed: int, order: str = "sir", wav_format: str = "int16") -> int:
    """Run the test, print the table and where the files went; exit code 1 when a test task failed."""
    result = run_test(expdir, out, checkpoint, limit, pesq, recipe_dir, data_root, seed, echo=print, order=order,
                      wav_format=wav_format)
    print()
    print(format_table(result.summary))
    for note in result.notes:
        print(f"note: {note}")
    print(f"\nper-utterance scores: {result.out}/<task>/scores.csv; summary: {result.out / 'summary.csv'}; the "
          f"original's summary (SDR, SIR, SAR: mean, std, median per mixture type): {result.out}/<task>/"
          "summary_original.csv")
    return 1 if any("error" in row for row in result.summary) else 0
