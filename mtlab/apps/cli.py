"""The ``mtlab`` command line.

    mtlab train RECIPE --expdir DIR [--steps N] [--no-progress]   train a recipe into an experiment folder
    mtlab demo [--expdir DIR] [--steps N] [--full]               recipes/demo.toml on data_samples/ (8 of its
                                                                 25 epochs: under a minute; --full: all)
    mtlab resume DIR [--steps N] [--moved OLD=NEW]               continue DIR's last checkpoint exactly
    mtlab evaluate DIR [--checkpoint best|final|PATH] [--split dev] [--moved OLD=NEW]
    mtlab prepare LAYOUT ROOT [--out DIR]                        list files of wsj0-2mix, wham or librimix
    mtlab score --mixture MIX --references S1 S2 --estimates E1 E2 [--metrics si_sdr,sdr,stoi] [--out DIR]
                                                                 separation metrics of WAV lists, with the
                                                                 mixture baseline and the improvements
    mtlab import-nabu RECIPE_DIR -o recipe.toml [--data-root DIR] an original Nabu-MSSS recipe as a TOML recipe
    mtlab import-nabu-checkpoint CKPT --recipe DIR -o model.pt    an original trained model (TensorFlow checkpoint)
                                                                 as mtlab weights, for init_file
    mtlab test DIR [--limit N] [--pesq] [--out DIR]              an imported recipe's test: loss, separation, SDR

``mtlab train`` also takes an original Nabu-MSSS recipe folder, with ``--data-root DIR`` (where its
database.conf paths are re-rooted).

train, demo and resume take ``--log csv,tensorboard,mlflow,trackio`` (files in the experiment folder).

A bad recipe or checkpoint prints one message and exits with code 2; Ctrl-C, SIGTERM and SIGUSR1 save ``final.pt``
and exit with 128 + the signal's number (130, 143, 138; ``mtlab resume DIR`` continues from there). Data that moved:
edit their locations in DIR/recipe.toml, or ``--moved OLD=NEW``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..core.events import Event, Payload
from ..remote.server import add_attach_flags, attachable
from .replaycmd import add_replay_parser, moved_flag, replay_command
from .demo import DEMO_EPOCHS, demo_recipe, quick, say_next

EXIT_USAGE, EXIT_INTERRUPTED = 2, 130


def exit_code(stopped_by: str | None) -> int:
    """The shell's status of a command a signal stopped: 128 + the signal's number (Ctrl-C 130, SIGTERM 143)."""
    if stopped_by in (None, "Ctrl-C"):
        return EXIT_INTERRUPTED
    return 128 + int(getattr(signal, str(stopped_by), signal.SIGINT))


class _Stop:
    """Outside a run (loading data, building models, writing results), SIGTERM and SIGUSR1 stop the command as
    Ctrl-C does (KeyboardInterrupt); the loop handles them itself while it trains. ``signum``: the first one."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def install(self) -> dict[int, Any]:
        """Handle SIGTERM and SIGUSR1; returns the handlers they had (for ``signal.signal`` to restore)."""
        if threading.current_thread() is not threading.main_thread() or int(os.environ.get("WORLD_SIZE", "1")) > 1:
            return {}  # a worker of a torchrun group: torchrun's SIGTERM ends it (see mtlab.training.loop)
        return {getattr(signal, n): signal.signal(getattr(signal, n), self) for n in ("SIGTERM", "SIGUSR1")
                if hasattr(signal, n)}

    def __call__(self, signum: int, frame: Any) -> None:
        self.signum = self.signum or signum
        raise KeyboardInterrupt(signal.Signals(signum).name)


def _usable_cpus() -> int:
    from ..base.threads import usable_cpus
    return usable_cpus()


def default_threads() -> tuple[int, str]:
    """torch CPU threads that do not oversubscribe the machine, and why (``mtlab.base.threads.default_threads``:
    the Python API chooses the same way)."""
    from ..base.threads import default_threads as choose

    return choose(_usable_cpus(), "--threads N to choose")


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number of units, got {text!r}")
    return int(text)


def _steps(text: str, least: int = 1) -> int:
    if not text.isdigit() or int(text) < least:
        zero = " (0 builds and checks the experiment, trains nothing)" if least == 0 else ""
        raise argparse.ArgumentTypeError(f"--steps {text}: give a number of steps >= 1 to run now{zero}, or leave "
                                         "--steps out to train to the end")
    return int(text)


def _train_steps(text: str) -> int:
    return _steps(text, least=0)


LARGE_ON_CPU = 2_000_000  # parameters above which a CPU run is told its cost before it starts


def _cost_note(exp: Any) -> Callable[[Event, Payload], None] | None:
    """A large model about to train on the CPU: say its size and what it costs before the first step, and
    return a listener that reports the first step's time and the schedule's at that pace."""
    import torch

    trainer = exp.trainer
    params = sum(p.numel() for p in trainer.params.values())
    if trainer.device.type != "cpu" or params < LARGE_ON_CPU:
        return None
    size = sum(p.numel() * p.element_size() for p in trainer.params.values())
    # weights, a gradient buffer per task, Adam's two moments and the update's direction; activations come on top
    gb = size * (3 + len(trainer.tasks) + 1) / 1e9
    threads = torch.get_num_threads()
    print(f"large model: {params / 1e6:.1f} M parameters on the CPU ({threads} torch thread{'s' if threads > 1 else ''}):"
          f" at least {gb:.1f} GB for weights, gradients and Adam, more for activations; a full-size "
          "recipe can take minutes per step on a few cores. For a quick look train with --shrink 32 (hidden sizes capped at 32), "
          'or on a GPU (device = "cuda" in [trainer]); the first step\'s time follows', flush=True)
    start = time.monotonic()

    def first_step(event: Event, info: Payload) -> None:
        nonlocal start
        if event == Event.RUN_START:
            start = time.monotonic()
        elif event == Event.APPLY:
            trainer.remove_callback(first_step)
            took = time.monotonic() - start
            left = max(0, exp.schedule.num_steps - trainer.step_count)
            print(f"step {trainer.step_count} took {took:.0f} s: the {left} steps left would take about "
                  f"{took * left / 3600:.1f} h at this pace", flush=True)

    trainer.add_callback(first_step)
    return first_step


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mtlab", description="Multi-task training with explicit gradient accumulation.")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser, steps: Callable[[str], int] = _steps) -> None:
        p.add_argument("--steps", type=steps, default=None, help="run at most this many steps now (default: to the end)")
        p.add_argument("--no-progress", action="store_true", help="no progress bar; log lines instead")
        p.add_argument("--threads", type=int, default=None,
                       help="torch CPU threads (default: 1 for demo, else the CPUs not busy with other work)")
        p.add_argument("--log", default=None, metavar="NAMES",
                       help="loggers, comma-separated: csv, tensorboard, mlflow, trackio (files in the experiment folder; "
                            "default: the recipe's [trainer] log)")
        add_attach_flags(p)  # --no-attach, --attach-ip

    def device_flags(p: argparse.ArgumentParser) -> None:
        p.add_argument("--precision", default=None, choices=["32", "bf16-mixed", "16-mixed"],
                       help="override the recipe's [trainer] precision (default: the recipe's, else 32)")
        p.add_argument("--compile", action="store_true", default=None,
                       help="torch.compile each model (dynamic shapes); overrides the recipe's [trainer] compile")

    p = sub.add_parser("train", help="train a recipe into an experiment folder")
    p.add_argument("recipe", type=Path)
    device_flags(p)
    p.add_argument("--data-root", type=Path, default=None,
                   help="an original Nabu-MSSS recipe folder: its database.conf paths go below this (default: data)")
    p.add_argument("--expdir", type=Path, required=True, help="experiment folder (must not hold an experiment yet)")
    p.add_argument("--overwrite", action="store_true",
                   help="the folder holds an experiment (e.g. one a recipe error stopped): remove it and start again")
    p.add_argument("--shrink", type=_positive, default=0, metavar="N",
                   help="cap the hidden sizes of an original Nabu-MSSS recipe at N units: a quick look on a CPU")
    common(p, _train_steps)
    p = sub.add_parser("demo", help="train recipes/demo.toml on the shipped sample corpus: its first "
                       f"{DEMO_EPOCHS} epochs (under a minute), or all of it with --full")
    device_flags(p)
    p.add_argument("--expdir", type=Path, default=None, help="experiment folder (default: exp/demo, exp/demo-2, ...)")
    p.add_argument("--full", action="store_true", help="the whole recipe (25 epochs, a few minutes; the same as "
                   "`mtlab train recipes/demo.toml --expdir DIR`)")
    common(p)
    p = sub.add_parser("resume", help="continue an experiment from its last checkpoint (latest.pt or final.pt)")
    p.add_argument("expdir", type=Path)
    moved_flag(p)
    common(p)
    add_replay_parser(sub)
    p = sub.add_parser("evaluate", help="evaluate a checkpoint on held-out data")
    p.add_argument("expdir", type=Path)
    moved_flag(p)
    p.add_argument("--checkpoint", default="best", help="best, final or a path (default: best, else final)")
    p.add_argument("--split", default=None, help="evaluate this split (default: each linked set's valid data)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p = sub.add_parser("prepare", help="write the list files of a corpus (wsj0-2mix, wham, librimix) for recipes "
                                       "(optional: data = { root = ..., layout = ... } reads the tree in place)")
    p.add_argument("layout", help="wsj0-2mix, wham or librimix")
    p.add_argument("root", type=Path, help="the corpus folder (e.g. .../Libri2Mix or .../wav8k/min)")
    p.add_argument("--out", type=Path, default=None, help="where the lists go (default: lists/LAYOUT)")
    p.add_argument("--linkedsets", nargs="+", default=None, help="mixture modes to list (default: all found)")
    p.add_argument("--train", default=None, help="librimix: train-100 (default) or train-360")
    p.set_defaults(threads=None)
    p = sub.add_parser("shard", help="write linked sets of a corpus (list layout) as tar shards for many-node runs")
    p.add_argument("root", type=Path, help="the corpus in list layout (mix_<set>.scp, s1.scp, ...; e.g. from prepare; "
                                           "unused with --verify)")
    p.add_argument("out", type=Path, help="the shard folder (<out>/<split>/<linkedset>/shard-*.tar, index.npz)")
    p.add_argument("--splits", nargs="+", default=None, help="splits to write (default: every folder with lists)")
    p.add_argument("--linkedsets", nargs="+", default=None, help="linked sets to write (default: all found)")
    p.add_argument("--shard-size", type=_positive, default=None, metavar="N",
                   help="utterances per shard (default: 1000); a run needs at least as many shards as ranks")
    p.add_argument("--num-sources", type=_positive, default=2, help="sources per mixture (default: 2)")
    p.add_argument("--spectral", choices=["mtlab", "original"], default="mtlab",
                   help="STFT settings of the feature statistics written with them (default: mtlab)")
    p.add_argument("--verify", action="store_true", help="check an existing shard folder (OUT) against its index "
                                                         "instead of writing")
    p.set_defaults(threads=None)
    p = sub.add_parser("score", help="separation metrics (SI-SDR, SDR, SNR, STOI, PESQ) of estimated sources: "
                                     "a per-utterance CSV and a summary with the mixture baseline")
    p.add_argument("--mixture", type=Path, required=True, help="list file of the mixtures (name path lines)")
    p.add_argument("--references", type=Path, nargs="+", required=True, help="one list file per reference source")
    p.add_argument("--estimates", type=Path, nargs="+", required=True,
                   help="one list file per estimated source (any order: the best permutation is scored)")
    p.add_argument("--metrics", default="si_sdr,sdr,snr",
                   help="comma-separated: si_sdr, sdr, snr, stoi, estoi, pesq (default: si_sdr,sdr,snr)")
    p.add_argument("--sample-rate", type=int, default=8000, help="of the WAV files (default: 8000)")
    p.add_argument("--out", type=Path, default=Path("."),
                   help="folder of evaluation_utterances.csv and evaluation_summary.csv (default: .)")
    p.add_argument("--prefix", default="evaluation", help="file name prefix (default: evaluation)")
    p.set_defaults(threads=None)
    p = sub.add_parser("import-nabu", help="write an original Nabu-MSSS recipe folder as an mtlab TOML recipe")
    p.add_argument("recipe_dir", type=Path)
    p.add_argument("-o", "--output", type=Path, required=True, help="the TOML file to write")
    p.add_argument("--data-root", default="data", help="where database.conf's paths go (default: data, relative to "
                                                        "the TOML file)")
    p.add_argument("--lenient", action="store_true", help="list the settings mtlab cannot honour under [nabu] "
                                                          "unsupported instead of stopping at the first")
    p.set_defaults(threads=None)
    p = sub.add_parser("import-nabu-checkpoint", help="convert an original Nabu-MSSS TensorFlow checkpoint to mtlab "
                                                      "weights ({model: state_dict}, loadable as init_file)")
    p.add_argument("checkpoint", type=Path, help="the checkpoint prefix (e.g. model/network.ckpt), a file of it or "
                                                 "its folder")
    p.add_argument("--recipe", type=Path, required=True, help="the original recipe folder the model was trained with")
    p.add_argument("-o", "--output", type=Path, required=True, help="the torch file to write")
    p.set_defaults(threads=None)
    p = sub.add_parser("test", help="an experiment of an original recipe: test loss (test_evaluator.cfg), separated "
                                    "WAVs (reconstructor.cfg) and their scores (scorer.cfg)")
    p.add_argument("expdir", type=Path)
    p.add_argument("--out", type=Path, default=None, help="output folder (default: EXPDIR/test)")
    p.add_argument("--checkpoint", default="final", help="final, best or a path (default: final)")
    p.add_argument("--limit", type=int, default=None, help="at most this many utterances per task")
    p.add_argument("--pesq", action="store_true", help="add PESQ (pip install \"mtlab[metrics]\")")
    p.add_argument("--recipe", type=Path, default=None, help="the original recipe folder (default: the one the "
                                                              "experiment was imported from)")
    p.add_argument("--data-root", type=Path, default=None, help="default: the experiment's")
    p.add_argument("--seed", type=int, default=0, help="k-means initialization seed")
    p.add_argument("--order", choices=("sir", "si_sdr"), default="sir", help="match estimates to references by "
                   "mean SIR (the original's, default) or by SI-SDR")
    p.add_argument("--wav-format", choices=("int16", "float32"), default="int16", help="separated WAVs: 16-bit PCM "
                   "(default) or 32-bit float as the original writes them")
    p.set_defaults(threads=None)
    return parser


def _with_flags(recipe: Any, args: argparse.Namespace) -> Any:
    """The recipe (a path or a dict) with ``--precision`` / ``--compile`` written into its [trainer] table, so
    the checkpoints carry them and ``mtlab resume`` continues the same way."""
    over = {k: v for k, v in (("precision", getattr(args, "precision", None)),
                              ("compile", getattr(args, "compile", None))) if v is not None}
    if not over:
        return recipe
    from .recipe import load_recipe

    loaded = dict(load_recipe(recipe) if isinstance(recipe, (str, Path)) else recipe)
    loaded["trainer"] = {**loaded.get("trainer", {}), **over}
    return loaded


def _fresh_expdir(path: Path, overwrite: bool = False, recipe: Any = "RECIPE") -> None:
    """Refuse a folder that holds a run (``mtlab.training.expdir.held_run``: any checkpoint, ``latest.pt`` of a
    killed run too), naming both ways on; with ``overwrite`` remove that run's files."""
    from ..base.errors import ConfigError
    from ..training.expdir import held_run, remove_run

    held = held_run(path)
    if held and overwrite:
        remove_run(path)
        print(f"--overwrite: the run in {path} was removed; training starts again")
        return
    shown = recipe if isinstance(recipe, (str, Path)) else "RECIPE"
    if held and _trained_nothing(path):
        raise ConfigError(f"{path} holds a run that stopped before its first step (see {path / 'summary.txt'}): "
                          f"after fixing what stopped it, `mtlab train {shown} --expdir {path} --overwrite` starts "
                          "again; or choose another --expdir")
    if held:
        raise ConfigError(f"{path} already holds an experiment ({', '.join(held)}): `mtlab resume {path}` continues "
                          f"it with the recipe it started with; `mtlab train {shown} --expdir {path} --overwrite` "
                          "starts it again from the recipe (after fixing it: the old checkpoints and tables are "
                          "removed); or choose another --expdir")


def _trained_nothing(path: Path) -> bool:
    """Whether the run in ``path`` ended before its first step (an error then): nothing there to resume."""
    summary = path / "summary.json"
    try:
        return not (path / "latest.pt").is_file() and json.loads(summary.read_text()).get("step") == 0
    except (OSError, ValueError):
        return False


def _demo(args: argparse.Namespace) -> int:
    """``mtlab demo``: recipes/demo.toml into exp/demo (exp/demo-2, ... when it holds a run)."""
    from ..base.errors import ConfigError
    from ..training.expdir import held_run
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
    _fresh_expdir(expdir)
    recipe = _with_flags(demo_recipe(), args)
    code = _train(from_recipe(recipe if args.full else quick(recipe)), expdir, args)
    if code == 0:
        say_next(expdir)
    return code


def _train(exp: Any, expdir: Path, args: argparse.Namespace) -> int:
    from ..base.errors import MtlabError, explain
    from ..training.loop import run

    from .recipe import trainer_settings

    rank = exp.trainer.parallel.rank
    logger = None
    loggers = args.log or trainer_settings(exp.recipe)["log"]  # --log overrides the recipe's [trainer] log
    if loggers and rank == 0:
        from ..training.loggers import make

        logger = make(loggers, expdir).attach(exp.trainer)
    periodic = _periodic(exp, expdir)
    cost = _cost_note(exp) if rank == 0 else None
    first = exp.trainer.step_count
    steering = attachable(exp, expdir, args, progress=not args.no_progress and rank == 0)
    try:
        schedule = run(exp, steps=args.steps, progress=not args.no_progress and rank == 0, expdir=expdir,
                       between_steps=steering.between if steering is not None else None)
    except MtlabError as exc:
        if exp.trainer.step_count == first == 0 and args.command == "train":
            from ..base.errors import DataError

            shown = args.recipe if isinstance(args.recipe, (str, Path)) else "RECIPE"
            what = ("the data (or the recipe's data, to point at other data)" if isinstance(exc, DataError)
                    else "the recipe")
            explain(exc, f"nothing was trained: after fixing {what}, `mtlab train {shown} --expdir {expdir} "
                         "--overwrite` starts again (`mtlab resume` would read the same recipe and data and fail "
                         "the same way)")
        raise
    finally:
        if steering is not None:
            steering.close(exp.schedule.last_stop)
        if logger is not None:
            logger.close()
        if periodic is not None:
            periodic.detach()
        if cost is not None and cost in exp.trainer.callbacks:
            exp.trainer.remove_callback(cost)
    if rank != 0:
        return 0
    print((expdir / "summary.txt").read_text(), end="")
    if schedule.last_stop == "interrupted":
        by = schedule.stop_signal or "Ctrl-C"
        print(f"interrupted by {by} at step {exp.trainer.step_count}: final.pt saved; continue with "
              f"`mtlab resume {expdir}`", file=sys.stderr, flush=True)
        return exit_code(by)
    print(f"experiment folder: {expdir}")
    return 0


def _resume(args: argparse.Namespace) -> int:
    from ..base.errors import ConfigError
    from ..training.checkpoint import choose_resume, restore_rank_state
    from .recipe import load

    choice = choose_resume(args.expdir)
    if choice.path is None:
        raise ConfigError(f"nothing to resume: {choice.why}; `mtlab train RECIPE --expdir {args.expdir}` starts a run")
    print(f"resuming from {choice.why}", file=sys.stderr)
    exp = load(choice.path, recipe=_moved(args.expdir, choice.path, args.moved))
    restore_rank_state(exp.trainer, choice.path)  # latest.pt: the RNG and data positions of the moment it was taken
    trainer, schedule = exp.trainer, exp.schedule
    if (schedule.finished or trainer.step_count >= schedule.num_steps) and choice.path.name == "final.pt":
        why = (f"validation stopped it ({schedule.stopped})" if schedule.finished and schedule.stopped
               else f"all {schedule.num_steps} steps are done")
        print(f"{args.expdir}: nothing to resume, {why}")
        return 0
    return _train(exp, args.expdir, args)  # done in latest.pt (killed while finishing): writes final.pt and the tables


def _moved(expdir: Path, checkpoint: Path, moves: list[str] | None = None) -> Any:
    """The recipe ``checkpoint`` carries, with the data locations edited in the experiment's own recipe.toml and
    those of ``--moved OLD=NEW`` (``mtlab.apps.relocate``); None when the checkpoint cannot be read (``load`` then
    says why)."""
    from ..core.state import CheckpointError, load_safe
    from .relocate import relocated

    try:
        recipe = load_safe(checkpoint).get("recipe")
    except CheckpointError:
        return None
    return relocated(expdir, recipe, moves) if isinstance(recipe, dict) else None


def _evaluate(args: argparse.Namespace) -> int:
    from ..base.errors import ConfigError, DataError
    from .recipe import load, load_split_for

    choice = {"best": args.expdir / "best.pt", "final": args.expdir / "final.pt"}.get(args.checkpoint, Path(args.checkpoint))
    if args.checkpoint == "best" and not choice.exists():
        choice = args.expdir / "final.pt"
    exp = load(choice, recipe=_moved(args.expdir, choice, args.moved))
    trainer = exp.trainer
    results: dict[str, float] = {}
    for tname, task in trainer.tasks.items():
        for sname, ls in task.linkedsets.items():
            try:
                examples = load_split_for(exp, tname, sname, args.split) if args.split else ls.valid
            except DataError as exc:
                raise DataError(f"--split {args.split}: task {tname!r}, linked set {sname!r} has no such split ({exc}); "
                                "give a split of its corpus, e.g. --split dev or --split test") from None
            if examples is None:
                continue
            results[f"{tname}/{sname}"] = trainer.evaluate(tname, sname, examples=examples)
    if not results:
        raise ConfigError(f"{choice}: no linked set has held-out data; give --split (e.g. --split dev)")
    print(f"{choice} (step {trainer.step_count}), split: {args.split or 'valid'}")
    for key, value in results.items():
        print(f"  {key:<24} {value:.4f}")
    out = args.expdir / f"evaluation_{args.split or 'valid'}.json"
    out.write_text(json.dumps({"checkpoint": str(choice), "step": trainer.step_count, "split": args.split or "valid",
                               "loss": results}, indent=1) + "\n")
    return 0


def _score(args: argparse.Namespace) -> int:
    from ..separation.metrics import evaluate_lists

    metrics = tuple(m.strip() for m in args.metrics.split(",") if m.strip())
    ev = evaluate_lists(args.mixture, args.references, args.estimates, metrics, args.sample_rate, args.out, args.prefix)
    print(f"{len(ev.utterances)} utterances; dB except stoi/estoi (0-1) and pesq (MOS)")
    print(ev.summary.to_string(float_format=lambda v: f"{v:.3f}"))
    for path in ev.paths.values():
        print(f"wrote {path}")
    return 0


def _periodic(exp: Any, expdir: Path) -> Any:
    """``latest.pt`` every ``checkpoint_frequency`` steps and ``checkpoint_minutes`` of the recipe (None when both
    are 0)."""
    from ..training.checkpoint import Periodic
    from .recipe import trainer_settings

    settings = trainer_settings(exp.recipe)
    every, minutes = settings["checkpoint_frequency"], settings["checkpoint_minutes"]
    return Periodic(exp, expdir, every, minutes).attach() if every or minutes else None


def _restarts() -> int:
    """How often torchrun has restarted this worker group (a worker died under ``--max-restarts``)."""

    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def _elastic_train(args: argparse.Namespace) -> int:
    """``mtlab train``; restarted by torchrun, it continues from the experiment folder's last checkpoint
    (``latest.pt`` of ``checkpoint_frequency``) with each rank's own RNG and data positions."""
    from ..training.checkpoint import choose_resume, restore_rank_state
    from ..training.distributed import check_same_start
    from .recipe import from_recipe, load

    restarts = _restarts()
    choice = choose_resume(args.expdir, fallback=False) if restarts else None
    point = choice.path if choice is not None else None
    if point is None:
        if not restarts:
            _fresh_expdir(args.expdir, args.overwrite, args.recipe)
        exp = from_recipe(_with_flags(args.recipe, args))
    else:
        exp = load(point)
        restore_rank_state(exp.trainer, point)
    if restarts:
        check_same_start(exp.trainer, str(point or args.recipe))
        if exp.trainer.parallel.rank == 0:
            where = choice.why if point and choice is not None else "the start (no checkpoint yet)"
            print(f"restart {restarts} of the worker group: resuming from {where}", file=sys.stderr, flush=True)
        if exp.schedule.finished or exp.trainer.step_count >= exp.schedule.num_steps:
            return 0
    return _train(exp, args.expdir, args)


def _import_nabu(args: argparse.Namespace) -> int:
    """``mtlab import-nabu``: an original recipe folder written as a TOML recipe."""
    from ..nabu import import_nabu, write_toml

    recipe = import_nabu(args.recipe_dir, data_root=args.data_root, strict=not args.lenient)
    path = write_toml(recipe, args.output)
    refused = recipe["nabu"].get("unsupported", [])
    print(f"{path}: {len(recipe['tasks'])} task(s), {len(recipe['models'])} model(s); trains with the original's "
          f"update: optimizer = {recipe['trainer']['optimizer']!r} (TensorFlow 1's Adam), linkedset_weights = "
          f"{recipe['trainer']['linkedset_weights']!r}"
          + (f"; {len(refused)} setting(s) mtlab cannot honour, listed under [nabu] unsupported" if refused else ""))
    return 0


def _init_distributed() -> None:
    """Under torchrun (WORLD_SIZE > 1) join the process group: NCCL on GPUs, gloo on CPUs."""

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    restarts = _restarts()
    if not restarts or "MASTER_ADDR" not in os.environ:
        dist.init_process_group(backend)
        return
    # A restarted group: torchrun's rendezvous store outlives the failed attempt and still holds its workers'
    # addresses under the same keys, so a new worker could read a dead peer's address and fail to connect.
    # Each attempt gets its own key prefix.
    import datetime

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # the agent hosts it
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=not agent_store and rank == 0, timeout=datetime.timedelta(minutes=10))
    dist.init_process_group(backend, store=dist.PrefixStore(f"mtlab/attempt{restarts}", store), rank=rank,
                            world_size=world)


def _shard(args: argparse.Namespace) -> int:
    """``mtlab shard``: write (or ``--verify``) the shards of every split and linked set asked for."""
    from ..data.corpus import SPLITS, linked_sets
    from ..data.features import MTLAB, ORIGINAL
    from ..data.shards import INDEX, SHARD_SIZE, verify_shards
    from ..data.shardwriter import write_shards

    from ..data.errors import DataError

    base = args.out if args.verify else args.root
    if not base.is_dir():
        raise DataError(f"{base}: no such folder; " + (
            "give the shard folder that `mtlab shard CORPUS OUT` wrote as OUT" if args.verify else
            "give the corpus in list layout (mix_<set>.scp, s1.scp, ... per split, e.g. from `mtlab prepare`)"))
    splits = args.splits or [s for s in SPLITS if (base / s).is_dir()]
    if not splits:
        raise DataError(f"{base}: no split folder ({', '.join(SPLITS)}) here; " + (
            "give the shard folder that `mtlab shard CORPUS OUT` wrote as OUT" if args.verify else
            "give the corpus in list layout (mix_<set>.scp, s1.scp, ... per split, e.g. from `mtlab prepare`)"))
    done = 0
    for split in splits:
        found = sorted(p.parent.name for p in (base / split).glob(f"*/{INDEX}")) if args.verify else \
            linked_sets(base, split)
        for linkedset in args.linkedsets or found:
            done += 1
            if args.verify:
                print(f"{split}/{linkedset}: {len(verify_shards(base, split, linkedset))} shards match the index")
                continue
            folder = write_shards(base, split, linkedset, args.out, args.shard_size or SHARD_SIZE, args.num_sources,
                                  ORIGINAL if args.spectral == "original" else MTLAB, progress=True)
            count = len(list(folder.glob("shard-*.tar")))
            print(f"{folder}: {count} shard(s)")
    if not done:
        raise DataError(f"{base}: no linked set found under {', '.join(splits)}" + (
            f" (no {INDEX}); write the shards with `mtlab shard CORPUS {base}`" if args.verify else
            " (no mix_<set>.scp list); give the corpus in list layout, e.g. from `mtlab prepare`"))
    if not args.verify:
        print(f'recipe data: {{ root = "{args.out.resolve()}", split = "train", linkedset = "..." }} (or the URL of a copy)')
    return 0


def _interrupted(args: argparse.Namespace, started: float) -> str:
    """What a Ctrl-C that reached the command line left behind, by what the experiment folder holds."""
    expdir = getattr(args, "expdir", None)
    if args.command not in ("train", "demo", "resume") or expdir is None:
        return "interrupted"
    final = Path(expdir) / "final.pt"
    if final.exists() and final.stat().st_mtime >= started:
        return f"interrupted: {final} saved; continue with `mtlab resume {expdir}`"
    if final.exists():
        return f"interrupted before this run's first step: {final} is as it was; `mtlab resume {expdir}` continues"
    return "interrupted before training started; nothing saved"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``mtlab`` and ``python -m mtlab``; returns the exit code."""
    args = _parser().parse_args(argv)
    started = time.time()
    stop = _Stop()
    previous = stop.install()
    try:
        return _command(args, stop, started)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _command(args: argparse.Namespace, stop: _Stop, started: float) -> int:
    """``main`` after parsing: the command, with its errors and signals turned into a message and an exit code."""
    from ..base.errors import MtlabError

    if getattr(args, "no_progress", True):
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logging.getLogger("mtlab").addHandler(handler)
        logging.getLogger("mtlab").setLevel(logging.INFO)
    try:
        # The demo's model is small: one thread is fastest, and several threads on busy cores were
        # 15x slower per step in our measurements (oversubscription). Training commands use the free CPUs.
        if args.command in ("train", "demo", "resume", "evaluate", "replay"):
            from ..base.threads import apply_threads

            if args.threads:
                threads, why = args.threads, f"{args.threads} torch thread{'s' if args.threads > 1 else ''} (--threads {args.threads})"
            elif args.command == "demo":
                threads, why = 1, "1 torch thread (the demo's small model runs fastest on one; --threads N to choose)"
            else:
                threads, why = default_threads()
            apply_threads(threads, announce=False)  # fixed: the Trainer and run() keep it
            print(f"threads: {why}")
        _init_distributed()
        if args.command == "train" and (args.recipe.is_dir() or args.shrink):  # an original Nabu-MSSS recipe folder
            from .recipe import load_recipe

            args.recipe = load_recipe(args.recipe, args.data_root)
            if args.shrink:
                from ..nabu.shrink import shrink

                shrink(args.recipe, args.shrink)
                print(f"--shrink {args.shrink}: hidden sizes capped at {args.shrink} units (a quick look, not the "
                      "recipe's model)")
        if args.command == "import-nabu":
            return _import_nabu(args)
        if args.command == "import-nabu-checkpoint":
            from ..nabu.tf_convert import write_converted

            counts = write_converted(args.checkpoint, args.recipe, args.output)
            print(f"{args.output}: {len(counts)} model(s), {sum(counts.values())} tensors; set init_file to it")
            return 0
        if args.command == "test":
            from .nabu_test import cli

            return cli(args.expdir, args.out, args.checkpoint, args.limit, args.pesq, args.recipe, args.data_root,
                       args.seed, args.order, args.wav_format)
        if args.command == "train":
            return _elastic_train(args)
        if args.command == "demo":
            return _demo(args)
        if args.command == "resume":
            return _resume(args)
        if args.command == "replay":
            return replay_command(args.expdir, args.out, progress=not args.no_progress, moves=args.moved)
        if args.command == "prepare":
            from ..data.layouts import prepare

            out = args.out or Path("lists") / args.layout
            print(prepare(args.layout, args.root, out, args.linkedsets, args.train))
            # a recipe reads a relative root from its own folder, not from this shell's: print the absolute path
            print(f'recipe data: {{ root = "{out.resolve()}", split = "train", linkedset = "..." }}')
            return 0
        if args.command == "score":
            return _score(args)
        if args.command == "shard":
            return _shard(args)
        return _evaluate(args)
    except MtlabError as exc:
        print(f"mtlab {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ImportError as exc:
        if 'pip install "mtlab[' not in str(exc):  # an optional package, named with the extra that installs it
            raise
        print(f"mtlab {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        by = signal.Signals(stop.signum).name if stop.signum else "Ctrl-C"
        print(f"mtlab {args.command}: {_interrupted(args, started)} ({by})", file=sys.stderr)
        return exit_code(by)
