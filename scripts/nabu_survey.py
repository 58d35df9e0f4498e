"""Import every original Nabu-MSSS recipe under a folder and report what mtlab makes of it.

    python scripts/nabu_survey.py ../shared/nabu/config/recipes [--train] [--test] [--shrink 32] [--jobs 2]
                                  [--only PATTERN]

For each folder with a trainer.cfg: "imported" when every setting is one mtlab honours (strict
import), else "refused" with the first reason; every recipe is also read leniently, which lists
all the settings mtlab cannot honour (their counts close the report). With ``--train`` each imported
recipe is built and trains one step on data made from mtlab's sample corpus in the layout its
database.conf describes ("ran"); ``--shrink`` caps model sizes (hidden units) at 32 to keep that quick.
A recipe whose ``init_file`` (a checkpoint of an earlier experiment) is absent trains from fresh weights,
and its line says so. With ``--test`` the trained step is then tested as ``mtlab test`` does (test loss of
``test_evaluator.cfg``, reconstruction and scores of the first ``--test-utts`` utterances per test task, on
test folders made from the samples' test split; a recipe with speaker-verification test tasks tests ``--sv-utts``
utterances, since its trials need speakers that recur across mixtures): "tested"; "partly" when a test task is refused by name (its
configs ask what the trained model cannot give, e.g. 3 masks of a 2-mask model) and every other one is tested. A row is printed as soon as its recipe ends, with
its time, so a partial run still reports; ``--jobs N`` runs N recipes at once in separate processes.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from mtlab.base.errors import ConfigError  # noqa: E402
from mtlab.nabu import import_nabu, make_sample_root, plain_recipe  # noqa: E402
from mtlab.nabu.shrink import shrink  # noqa: E402


def survey(folder: Path, top: Path, root: Path, train: bool, test: bool, shrink_to: int,
           test_utts: int, utts: int | None, sv_utts: int = 24) -> tuple[str, str, str, float, list[str]]:
    """(name, status, detail, seconds, unsupported settings) of one recipe folder."""
    torch.set_num_threads(1)
    start = time.perf_counter()
    name = str(folder.relative_to(top))
    reasons: list[str] = []
    try:
        lenient = import_nabu(folder, strict=False)
        reasons = [f"{u['key'].split('] ')[-1]}: {u['why'][:70]}" for u in lenient["nabu"].get("unsupported", [])]
    except ConfigError as exc:
        return name, "unreadable", str(exc), time.perf_counter() - start, reasons
    try:
        recipe = import_nabu(folder, data_root=root)
    except ConfigError as exc:
        return name, "refused", str(exc).replace(str(folder) + "/", ""), time.perf_counter() - start, reasons
    status, detail = "imported", ""
    if train or test:
        import mtlab
        from mtlab.training.checkpoint import save_checkpoint
        from mtlab.apps.nabu_test import run_test
        from mtlab.nabu.evaluation import make_test_root, read_test

        stage = "train"
        try:
            make_sample_root(recipe, limit=utts)
            if shrink_to:
                shrink(recipe, shrink_to)
            # init_file names a checkpoint of an earlier original experiment, absent here: start afresh
            init = recipe["trainer"].get("init_file")
            fresh = bool(init) and not Path(init).exists()
            exp = mtlab.from_recipe(plain_recipe(recipe), init_weights=not fresh)
            exp.trainer.step()
            status, detail = "ran", "one step" + (" (init_file not found: initialized afresh)" if fresh else "")
            if test:
                stage = "test"
                save_checkpoint(exp.trainer, exp.schedule, root / "exp" / "final.pt", recipe=exp.recipe)
                tests = read_test(folder, root)
                # speaker verification scores trials between mixtures that share a speaker: it needs more of them
                n = max(test_utts, sv_utts) if any(t.handler is not None for t in tests.values()) else test_utts
                make_test_root(tests, limit=n)
                result = run_test(root / "exp", limit=n, recipe_dir=folder, data_root=root)
                cells = [f"{r['task']}: " + (f"error: {r['error']}" if "error" in r else
                                              f"refused: {r['refused']}" if "refused" in r else f"loss {r['loss']:.3g}"
                                              + (f", SDRi {r['sdri']:.2f}" if "sdri" in r else "")
                                              + (f", EER {r['eer']:.1%}" if "eer" in r else ""))
                         for r in result.summary]
                failed = any("error" in r for r in result.summary)
                # a test task refused by name (the model cannot run what its configs ask, nor could the original)
                partly = any("refused" in r for r in result.summary)
                status = "failed:test" if failed else "partly" if partly else "tested"
                detail = "; ".join(sorted(cells, key=lambda c: "error:" not in c and "refused:" not in c)) + \
                    detail.replace("one step", "")
        except Exception as exc:  # noqa: BLE001 - the survey reports every failure
            status, detail = f"failed:{stage}", f"{type(exc).__name__}: {exc}"
    return name, status, detail, time.perf_counter() - start, reasons


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path)
    ap.add_argument("--train", action="store_true", help="train one step of each imported recipe")
    ap.add_argument("--test", action="store_true", help="then test it (loss, reconstruction, scores); implies --train")
    ap.add_argument("--shrink", type=int, default=0, help="cap hidden sizes at this many units (0: as written)")
    ap.add_argument("--jobs", type=int, default=1, help="recipes surveyed at once, in separate processes")
    ap.add_argument("--test-utts", type=int, default=2, help="utterances per test task with --test (default 2)")
    ap.add_argument("--sv-utts", type=int, default=24, help="utterances per test task of a recipe with speaker-"
                    "verification test tasks (default 24: the samples' whole test split; trials need recurring "
                    "speakers)")
    ap.add_argument("--only", action="append", metavar="PATTERN", help="survey only the recipes whose path below "
                    "the folder contains PATTERN (repeat for several)")
    ap.add_argument("--utts", type=int, default=16, help="utterances per training and validation folder made from "
                                                         "the samples (default 16; 0: all)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    folders = sorted(p.parent for p in args.folder.rglob("trainer.cfg"))
    if args.only:
        folders = [f for f in folders if any(p in str(f.relative_to(args.folder)) for p in args.only)]
        if not folders:
            ap.error(f"--only {' '.join(args.only)}: no recipe folder below {args.folder} matches")
    width = max(len(str(f.relative_to(args.folder))) for f in folders)
    rows = []
    reasons: collections.Counter[str] = collections.Counter()
    began = time.perf_counter()

    def report(row: tuple[str, str, str, float, list[str]]) -> None:
        name, status, detail, seconds, unsupported = row
        rows.append(row)
        reasons.update(unsupported)
        print(f"{name:<{width}}  {status:<12}  {seconds:6.1f} s  {detail[:200]}", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        work: list[tuple[Any, ...]] = [(f, args.folder, Path(tmp) / f"r{i}", args.train, args.test, args.shrink,
                                        args.test_utts, args.utts or None, args.sv_utts) for i, f in enumerate(folders)]
        if args.jobs > 1:
            with concurrent.futures.ProcessPoolExecutor(args.jobs) as pool:
                for future in concurrent.futures.as_completed([pool.submit(survey, *w) for w in work]):
                    report(future.result())
        else:
            for w in work:
                report(survey(*w))
    counts = collections.Counter(r[1].split(":")[0] for r in rows)
    imported = counts["imported"] + counts["ran"] + counts["tested"] + counts["partly"] + counts["failed"]
    print(f"\n{len(folders)} recipes in {time.perf_counter() - began:.0f} s: "
          f"read {len(folders) - counts['unreadable']}, imported {imported}, refused {counts['refused']}"
          + (f", ran {sum(1 for r in rows if r[1] in ('ran', 'tested', 'partly', 'failed:test'))}"
             if args.train or args.test else "")
          + (f", tested {counts['tested']}, partly tested {counts['partly']} (a test task refused)" if args.test
             else "")
          + (f", failed {counts['failed']}" if args.train or args.test else ""))
    print("\nsettings mtlab cannot honour (lenient read, occurrences over all recipes):")
    for reason, n in reasons.most_common():
        print(f"  {n:3d}  {reason}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
