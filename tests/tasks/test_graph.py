"""ModelGraph: checks at construction name the node at fault; runs nodes in order with lengths."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import mtlab
from mtlab.tasks.graph import ModelGraph, Node


def test_errors_name_the_node() -> None:
    with pytest.raises(mtlab.GraphError, match="node 'h' uses unknown model 'nope'"):
        ModelGraph([Node("h", "nope", ["x"])], ["x"], ["h"], models={"enc": nn.Linear(1, 1)})
    with pytest.raises(mtlab.GraphError, match="node 'o' takes input 'z'"):
        ModelGraph([Node("h", "enc", ["x"]), Node("o", "enc", ["z"])], ["x"], ["o"])
    with pytest.raises(mtlab.GraphError, match="duplicate node name 'h'"):
        ModelGraph([Node("h", "enc", ["x"]), Node("h", "enc", ["x"])], ["x"], ["h"])
    with pytest.raises(mtlab.GraphError, match="output 'q' is produced by no node"):
        ModelGraph([Node("h", "enc", ["x"])], ["x"], ["q"])
    g = ModelGraph([Node("h", "enc", ["x"])], ["x"], ["h"])
    with pytest.raises(mtlab.GraphError, match="unknown model 'enc'"):
        g.check_models({"other": nn.Linear(1, 1)})


def test_run_passes_lengths_and_names_multiple_outputs() -> None:
    class Split(nn.Module):
        def forward(self, x, seq_lengths):
            return x * 2, seq_lengths

    g = ModelGraph([Node("s", "split", ["x"], outputs=["y", "n"])], ["x"], ["y"])
    x = torch.ones(2, 3, 1)
    res = g.run({"split": Split()}, {"x": x}, {"x": torch.tensor([3, 1])})
    assert torch.equal(res.outputs["y"], 2 * x) and res.outputs["n"].tolist() == [3, 1]
    assert res.seq_lengths["y"].tolist() == [3, 1] and g.model_names == ["split"]


def test_a_node_naming_its_outputs_refuses_a_bare_tensor_and_an_unnamed_one_takes_it() -> None:
    """The usual case (one tensor, an unnamed node) is taken as it comes; a node that names its outputs still
    needs a tuple (or a dict) of them."""
    x = torch.ones(2, 3, 1)
    double = nn.Identity()
    named = ModelGraph([Node("s", "m", ["x"], outputs=["y"])], ["x"], ["y"])
    with pytest.raises(mtlab.GraphError, match=r"names 1 outputs \['y'\] but model 'm' returned a Tensor"):
        named.run({"m": double}, {"x": x}, {})
    unnamed = ModelGraph([Node("y", "m", ["x"]), Node("z", "m", ["y"])], ["x"], ["z"])
    res = unnamed.run({"m": double}, {"x": x}, {"x": torch.tensor([3, 1])})
    assert res.outputs["z"] is x and res.seq_lengths["z"].tolist() == [3, 1]
