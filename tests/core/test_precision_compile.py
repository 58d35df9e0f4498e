"""``compile=True``: every model compiled in place with dynamic shapes; variable lengths compile once, and
the step's gradients equal eager ones to float32 rounding."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn
from helpers.recipes import write_tiny_recipe

import mtlab
from mtlab.base.batching import collate
from mtlab.models import BLSTM, MeanPool

pytestmark = pytest.mark.slow  # compiling takes tens of seconds on a small CPU

# Inductor may fuse and reorder float32 arithmetic: the compiled gradients match eager to this tolerance.
RTOL, ATOL = 1e-4, 1e-6


def models() -> dict[str, nn.Module]:
    torch.manual_seed(0)
    return {"enc": BLSTM(6, 8), "frames": nn.Linear(16, 4), "pool": MeanPool(), "spk": nn.Linear(16, 3)}


def tasks() -> list[mtlab.Task]:
    n = mtlab.Node
    ce = mtlab.losses.CrossEntropy
    return [mtlab.Task("frames", [n("h", "enc", ["x"]), n("o", "frames", ["h"])], ["x"], ["y"], ["o"],
                       ce(output="o", target="y"), {"train": mtlab.LinkedSet()}),
            mtlab.Task("spk", [n("h", "enc", ["x"]), n("p", "pool", ["h"]), n("o", "spk", ["p"])], ["x"], ["spk"],
                       ["o"], ce(output="o", target="spk"), {"train": mtlab.LinkedSet()})]


def batch(longest: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    lengths = [longest, max(1, longest - 3), max(1, longest // 2)]
    return collate([{"x": torch.randn(t, 6, generator=g), "y": torch.randint(0, 4, (t,), generator=g),
                     "spk": torch.randint(0, 3, (), generator=g)} for t in lengths])


def test_twenty_lengths_compile_once_and_match_eager():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    base = models()
    eager = mtlab.Trainer(copy.deepcopy(base), tasks(), lr=1e-2, clip_grad_value=1.0, device="cpu")
    compiled = mtlab.Trainer(copy.deepcopy(base), tasks(), lr=1e-2, clip_grad_value=1.0, device="cpu", compile=True)
    assert compiled.compiled and all(m._compiled_call_impl is not None for m in compiled.models.values())
    graphs_after_first = None
    for i, longest in enumerate(range(5, 25)):  # 20 different lengths, one step each
        b = batch(longest, i)
        for tr in (eager, compiled):
            for task in ("frames", "spk"):
                tr.process_minibatch(task, "train", batch=b)
            tr.normalize(); tr.clip()
        for task in ("frames", "spk"):
            for name, g in eager.state(task).grads.items():
                torch.testing.assert_close(compiled.state(task).grads[name], g, rtol=RTOL, atol=ATOL)
        eager.apply(); compiled.apply()
        if i == 1:  # the first length compiles (dynamic shapes from the start); later ones reuse it
            graphs_after_first = counters["stats"]["unique_graphs"]
    assert graphs_after_first and graphs_after_first > 0
    assert counters["stats"]["unique_graphs"] == graphs_after_first  # no recompile for 18 further lengths
    for name, p in eager.params.items():
        torch.testing.assert_close(compiled.params[name], p, rtol=RTOL, atol=1e-5)


def test_the_recipe_key_compiles_the_models(tiny_corpus: Path, tmp_path: Path) -> None:
    recipe = mtlab.apps.recipe.load_recipe(write_tiny_recipe(tmp_path / "tiny.toml", tiny_corpus, num_steps=0))
    recipe["trainer"]["compile"] = True
    tr = mtlab.apps.recipe.from_recipe(recipe).trainer
    assert tr.compiled and all(m._compiled_call_impl is not None for m in tr.models.values())
    assert not mtlab.apps.recipe.from_recipe(mtlab.apps.recipe.load_recipe(tmp_path / "tiny.toml")).trainer.compiled
