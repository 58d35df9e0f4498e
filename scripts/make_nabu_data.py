"""Make a data root for an original Nabu-MSSS recipe from mtlab's sample corpus (data_samples/), laid
out as the recipe's database.conf says, so the recipe runs unchanged (a recipe with i-vector inputs also
gets its i-vector lists and files, one fixed vector per sample speaker; a recipe of three or more speakers per
mixture, nrs = N, gets N-speaker mixtures made from the two-speaker samples by adding the main speaker of other
mixtures of the same split; see mtlab.nabu.samples); the test sets that test_evaluator.cfg names get the
samples' test split:

    python scripts/make_nabu_data.py ../shared/nabu/config/recipes/papers/ICASSP2018/MERL_DC_2spk /tmp/wsj
    python scripts/make_nabu_data.py ../shared/nabu/config/recipes/papers/ICASSP2018/MERL_DC_3spk /tmp/wsj
    mtlab train ../shared/nabu/config/recipes/papers/ICASSP2018/MERL_DC_2spk --data-root /tmp/wsj --expdir exp/dc
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mtlab.nabu import import_nabu, make_sample_root  # noqa: E402
from mtlab.nabu.evaluation import make_test_root, read_test  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("recipe_dir", type=Path)
    ap.add_argument("data_root", type=Path)
    ap.add_argument("--samples", type=Path, default=None, help="the sample corpus (default: mtlab's data_samples/)")
    ap.add_argument("--limit", type=int, default=None, help="at most this many utterances per folder")
    args = ap.parse_args()
    recipe = import_nabu(args.recipe_dir, data_root=args.data_root.resolve(), strict=False)
    for folder in make_sample_root(recipe, args.samples, args.limit):
        print(folder)
    if (args.recipe_dir / "test_evaluator.cfg").is_file():  # the test sets, from the samples' test split
        for folder in make_test_root(read_test(args.recipe_dir, args.data_root.resolve()), args.samples, args.limit):
            print(folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
