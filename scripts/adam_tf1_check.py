"""How far mtlab's optimizers land from TensorFlow 1's ``tf.train.AdamOptimizer`` (the original's) over a few steps.

    python scripts/adam_tf1_check.py [--steps 3] [--lr 0.05]

Trains the tests' small model (float32) with ``Trainer(optimizer="adam_tf1")`` and with torch's Adam (the default)
on the same data, feeds each step's applied gradient to the NumPy transcription of ``tf.train.AdamOptimizer`` in
``tests/core/test_optimizers.py``, and prints the largest parameter difference after each step."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path[:0] = [str(TESTS / "core"), str(TESTS)]  # the test module, and the helpers it imports
import test_optimizers as T  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()
    torch.set_num_threads(1)
    T.LR = args.lr
    for name in ("adam_tf1", "adam"):
        tr = T.one_task(optimizer=name)
        tf = T.NumpyAdamTF1(T.params_np(tr), lr=args.lr)
        for step in range(1, args.steps + 1):
            tf.apply_gradients(T.run_steps(tr, 1)[0])
            gap = max(float(np.abs(tr.params[k].detach().numpy() - v).max()) for k, v in tf.var.items())
            print(f"optimizer={name:8s} step {step}: max |param - TensorFlow's| = {gap:.3g}")


if __name__ == "__main__":
    main()
