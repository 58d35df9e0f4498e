"""Writes original.ckpt.* here with TensorFlow (run once: needs `pip install -e .[tensorflow]`):
the variables of tests/helpers/tf_fixtures.py's FIXTURE under the original's names, with its values."""

from __future__ import annotations

import sys
from pathlib import Path

import tensorflow as tf

here = Path(__file__).resolve().parent
sys.path.insert(0, str(here.parent))
from helpers.tf_fixtures import FIXTURE, fixture_values

if __name__ == "__main__":
    values = fixture_values()
    names = list(values)
    tf.raw_ops.SaveV2(prefix=str(here / "original.ckpt"), tensor_names=names, shape_and_slices=[""] * len(names),
                      tensors=[values[n] for n in names])
    print(f"{here / 'original.ckpt'}: {len(FIXTURE)} variables")
