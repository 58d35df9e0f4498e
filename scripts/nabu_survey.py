"""Import every original Nabu-MSSS recipe under a folder and report what mtlab makes of it.

    python scripts/nabu_survey.py ../shared/nabu/config/recipes [--train] [--shrink]

For each folder with a trainer.cfg: "imported" when every setting is one mtlab honours (strict
import), else "refused" with the first reason; every recipe is also read leniently, which lists
all the settings mtlab cannot honour (their counts close the report). With ``--train`` each imported
recipe is built and trains one step on data made from mtlab's sample corpus in the layout its
database.conf describes ("ran"); ``--shrink`` caps model sizes (hidden units) at 32 to keep that quick.
A recipe whose ``init_file`` (a checkpoint of an earlier experiment) is absent trains from fresh weights,
and its line says so.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from mtlab.base.errors import ConfigError  # noqa: E402
from mtlab.nabu import import_nabu, make_sample_root, plain_recipe  # noqa: E402
from mtlab.nabu.shrink import shrink  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path)
    ap.add_argument("--train", action="store_true", help="train one step of each imported recipe")
    ap.add_argument("--shrink", type=int, default=0, help="cap hidden sizes at this many units (0: as written)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    folders = sorted(p.parent for p in args.folder.rglob("trainer.cfg"))
    rows = []
    reasons: collections.Counter[str] = collections.Counter()
    read = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i, folder in enumerate(folders):
            name = str(folder.relative_to(args.folder))
            try:
                lenient = import_nabu(folder, strict=False)
                read += 1
                for u in lenient["nabu"].get("unsupported", []):
                    reasons[f"{u['key'].split('] ')[-1]}: {u['why'][:70]}"] += 1
            except ConfigError as exc:
                rows.append((name, "unreadable", str(exc)))
                continue
            try:
                recipe = import_nabu(folder, data_root=Path(tmp) / f"r{i}")
            except ConfigError as exc:
                rows.append((name, "refused", str(exc).replace(str(folder) + "/", "")))
                continue
            status, detail = "imported", ""
            if args.train:
                import mtlab

                try:
                    make_sample_root(recipe)
                    if args.shrink:
                        shrink(recipe, args.shrink)
                    start = time.perf_counter()
                    # init_file names a checkpoint of an earlier original experiment, absent here: start afresh
                    init = recipe["trainer"].get("init_file")
                    fresh = bool(init) and not Path(init).exists()
                    exp = mtlab.from_recipe(plain_recipe(recipe), init_weights=not fresh)
                    exp.trainer.step()
                    status, detail = "ran", f"one step in {time.perf_counter() - start:.1f} s" + \
                        (" (init_file not found: initialized afresh)" if fresh else "")
                except Exception as exc:  # noqa: BLE001 - the survey reports every failure
                    status, detail = "failed", f"{type(exc).__name__}: {exc}"
            rows.append((name, status, detail))
    width = max(len(r[0]) for r in rows)
    for name, status, detail in rows:
        print(f"{name:<{width}}  {status:<10}  {detail[:160]}")
    counts = collections.Counter(r[1] for r in rows)
    print(f"\n{len(folders)} recipes: read {read}, imported {counts['imported'] + counts['ran'] + counts['failed']}, "
          f"refused {counts['refused']}" + (f", ran {counts['ran']}, failed {counts['failed']}" if args.train else ""))
    print("\nsettings mtlab cannot honour (lenient read, occurrences over all recipes):")
    for reason, n in reasons.most_common():
        print(f"  {n:3d}  {reason}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
