"""Writes models.ckpt.* here (run once; no TensorFlow needed): the variables of tests/helpers/tf_fixtures.py's
MODELS_FIXTURE under the original's names, with its values, in TensorFlow's checkpoint format (tests/helpers/tf_bundle.py)."""

from __future__ import annotations

import sys
from pathlib import Path

here = Path(__file__).resolve().parent
sys.path.insert(0, str(here.parent))
from helpers.tf_fixtures import MODELS_FIXTURE, models_fixture_values
from helpers.tf_bundle import write_bundle

if __name__ == "__main__":
    print(f"{write_bundle(here / 'models.ckpt', models_fixture_values())}: {len(MODELS_FIXTURE)} variables")
