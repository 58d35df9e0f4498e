"""Writes models.ckpt.* here (run once; no TensorFlow needed): the variables of tests/test_nabu_tf_models.py's
MODELS_FIXTURE under the original's names, with its values, in TensorFlow's checkpoint format (tests/tf_bundle.py)."""

from __future__ import annotations

import sys
from pathlib import Path

here = Path(__file__).resolve().parent
sys.path.insert(0, str(here.parent))
from test_nabu_tf_models import MODELS_FIXTURE, models_fixture_values
from tf_bundle import write_bundle

if __name__ == "__main__":
    print(f"{write_bundle(here / 'models.ckpt', models_fixture_values())}: {len(MODELS_FIXTURE)} variables")
