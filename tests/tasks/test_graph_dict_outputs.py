"""Models that return dicts (mtlab/tasks/graph.py): a node takes the entry named like it, outputs=[...] take entries
by key, and a missing key is refused naming the keys there are and the fix; against plain PyTorch."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
from torch import nn

import mtlab
from mtlab.base.errors import GraphError

X = torch.randn(2, 5, 3, dtype=torch.float64)


class DictNet(nn.Module):
    """Returns a dict as Hugging Face models do (a ``ModelOutput`` is an ordered dict)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 4).double()

    def forward(self, x: torch.Tensor) -> OrderedDict:
        h = self.lin(x)
        return OrderedDict(logits=h, hidden=torch.tanh(h))


def run(nodes: list[mtlab.Node], outputs: list[str], net: nn.Module) -> dict[str, torch.Tensor]:
    graph = mtlab.tasks.graph.ModelGraph(nodes, ["x"], outputs, {"net": net})
    return graph.run({"net": net}, {"x": X}, {"x": torch.tensor([5, 3])}).outputs


def test_a_node_takes_the_entry_named_like_it_and_outputs_take_entries_by_key() -> None:
    net = DictNet()
    expected = net(X)
    out = run([mtlab.Node("logits", "net", ["x"])], ["logits"], net)
    assert torch.equal(out["logits"], expected["logits"])
    out = run([mtlab.Node("enc", "net", ["x"], outputs=["hidden", "logits"])], ["hidden", "logits"], net)
    assert torch.equal(out["hidden"], expected["hidden"]) and torch.equal(out["logits"], expected["logits"])


def test_a_missing_key_names_the_keys_and_the_fix() -> None:
    with pytest.raises(GraphError, match=r"without \['pred'\]; its keys: \['logits', 'hidden'\]; name the node .*"
                                         r"Node\('logits', 'net'.*outputs=\['logits', 'hidden'\]"):
        run([mtlab.Node("pred", "net", ["x"])], ["pred"], DictNet())


@pytest.mark.slow  # importing transformers takes seconds
def test_hugging_face_model_output() -> None:
    modeling = pytest.importorskip("transformers.modeling_outputs")

    class HFNet(DictNet):
        def forward(self, x: torch.Tensor):  # noqa: ANN201
            return modeling.SequenceClassifierOutput(logits=self.lin(x))

    net = HFNet()
    out = run([mtlab.Node("logits", "net", ["x"])], ["logits"], net)
    assert torch.equal(out["logits"], net.lin(X))


def test_a_task_trains_through_a_dict_output_as_plain_pytorch() -> None:
    torch.manual_seed(0)
    net = DictNet()
    oracle = DictNet()
    oracle.load_state_dict(net.state_dict())
    y = torch.randn(2, 5, 4, dtype=torch.float64)

    def loss(targets, outputs, seq_lengths):  # noqa: ANN001, ANN202
        d = outputs["logits"] - targets["y"]
        return (d ** 2).sum(), torch.tensor(float(d.numel()))

    task = mtlab.Task("t", nodes=[mtlab.Node("logits", "net", ["x"])], inputs=["x"], targets=["y"],
                      outputs=["logits"], loss=loss, linkedsets={"s": mtlab.LinkedSet()})
    tr = mtlab.Trainer({"net": net}, task, lr=1e-2, device="cpu")
    tr.process_minibatch("t", "s", batch=({"x": X, "y": y}, {"x": torch.tensor([5, 5]), "y": torch.tensor([5, 5])}))
    tr.normalize(); tr.apply()
    opt = torch.optim.Adam(oracle.parameters(), lr=1e-2)
    d = oracle(X)["logits"] - y
    ((d ** 2).sum() / d.numel()).backward()
    opt.step()
    torch.testing.assert_close(net.lin.weight, oracle.lin.weight, atol=1e-12, rtol=0)
