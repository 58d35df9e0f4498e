"""The graph of named models a task runs (the original's ``run_multi_model``, done right).

Nodes run in the order given. A node's inputs are task inputs or outputs of earlier nodes; a
model with several outputs (a tuple, or a dict by key) names them. A node's output inherits the sequence lengths of its
first input.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from ..base.errors import BatchError, GraphError, MtlabError


@dataclass(frozen=True)
class Node:
    """One model call in a task's graph.

    ``Node("h", model="enc", inputs=["x"])`` runs ``models["enc"](x)`` and names the result
    ``h``. A model returning a tuple names its parts with ``outputs=["h", "c"]``. A model returning a dict (or
    Hugging Face's ``ModelOutput``) gives the node its entry named like the node (``Node("logits", ...)`` takes
    ``out["logits"]``), or the entries ``outputs=[...]`` name, by key.
    """

    name: str
    model: str
    inputs: Sequence[str]
    outputs: Sequence[str] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise GraphError(f"a Node needs a non-empty string name, got {self.name!r}")
        if isinstance(self.inputs, str):
            object.__setattr__(self, "inputs", (self.inputs,))
        object.__setattr__(self, "inputs", tuple(self.inputs))
        if not self.inputs:
            raise GraphError(f"node {self.name!r}: give at least one input (a task input or an earlier node)")
        if self.outputs is not None:
            if isinstance(self.outputs, str):
                object.__setattr__(self, "outputs", (self.outputs,))
            object.__setattr__(self, "outputs", tuple(self.outputs))
            if not self.outputs:
                raise GraphError(f"node {self.name!r}: outputs=[] names nothing; leave it out for one output")

    @property
    def produces(self) -> tuple[str, ...]:
        """The names this node gives the graph: its ``outputs``, else its own name."""
        return tuple(self.outputs) if self.outputs else (self.name,)


def _takes_lengths(model: nn.Module) -> tuple[bool, bool]:
    """Whether ``model.forward`` takes ``seq_lengths`` (on the device) and ``host_lengths`` (the same on the CPU)."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False, False
    return "seq_lengths" in params, "host_lengths" in params


@dataclass
class GraphResult:
    """What running a graph gives: its named outputs, their sequence lengths and the models it ran."""

    outputs: dict[str, Tensor]
    seq_lengths: dict[str, Tensor]


class ModelGraph:
    """Validated, runnable graph of ``nodes`` over ``inputs``, exposing ``outputs``.

    All checks happen here, at construction, and name the node at fault.
    """

    def __init__(
        self,
        nodes: Sequence[Node],
        inputs: Sequence[str],
        outputs: Sequence[str],
        models: Mapping[str, nn.Module] | None = None,
        where: str = "graph",
    ) -> None:
        self.nodes = tuple(nodes)
        self.inputs = tuple([inputs] if isinstance(inputs, str) else inputs)
        self.outputs = tuple([outputs] if isinstance(outputs, str) else outputs)
        self.where = where
        if not self.nodes:
            raise GraphError(f"{where}: a graph needs at least one Node")
        available: dict[str, str] = {name: "task input" for name in self.inputs}
        seen_nodes: set[str] = set()
        for node in self.nodes:
            if not isinstance(node, Node):
                raise GraphError(f"{where}: nodes must be mtlab.Node objects, got {type(node).__name__}")
            if node.name in seen_nodes:
                raise GraphError(f"{where}: duplicate node name {node.name!r}; node names must be unique")
            seen_nodes.add(node.name)
            for name in node.inputs:
                if name not in available:
                    raise GraphError(
                        f"{where}: node {node.name!r} takes input {name!r}, which is neither a task input "
                        f"nor an earlier node's output; available here: {sorted(available)}"
                    )
            for produced in node.produces:
                if produced in available:
                    raise GraphError(
                        f"{where}: node {node.name!r} produces {produced!r}, a name already used by "
                        f"{available[produced]}; rename one of them"
                    )
                available[produced] = f"node {node.name!r}"
        for name in self.outputs:
            if name not in available or available[name] == "task input":
                made = sorted(k for k, v in available.items() if v != "task input")
                raise GraphError(
                    f"{where}: output {name!r} is produced by no node; node outputs: {made}"
                )
        # By id and class: a model freed and a new one at the same address (copies made and dropped, as
        # check_equivalence does) must not inherit another class's answer.
        self._takes_lengths: dict[tuple[int, type], tuple[bool, bool]] = {}
        # what run() needs of each node, read once: (node, model name, inputs, first input, names given, unnamed)
        self._steps = tuple((node, node.model, node.inputs, node.inputs[0], node.produces, node.outputs is None)
                            for node in self.nodes)
        if models is not None:
            self.check_models(models)

    def check_models(self, models: Mapping[str, nn.Module]) -> None:
        """Raise a GraphError naming the node whose model is not in ``models``."""
        for node in self.nodes:
            if node.model not in models:
                raise GraphError(
                    f"{self.where}: node {node.name!r} uses unknown model {node.model!r}; "
                    f"known models: {sorted(models)}"
                )

    @property
    def model_names(self) -> list[str]:
        """Names of the models the graph uses, in first-use order, without repeats."""
        return list(dict.fromkeys(node.model for node in self.nodes))

    def run(
        self,
        models: Mapping[str, nn.Module],
        data: Mapping[str, Tensor],
        seq_lengths: Mapping[str, Tensor],
        host_lengths: Mapping[str, Tensor] | None = None,
    ) -> GraphResult:
        """Run every node; return all node outputs and their sequence lengths.

        ``host_lengths`` are the same lengths on the CPU (the batch's, before it moved to the device): a model
        whose forward takes ``host_lengths`` (BLSTM's packing) gets them, so it never copies lengths back."""
        values: dict[str, Tensor] = {}
        lengths: dict[str, Tensor] = {}
        hosts: dict[str, Tensor] = dict(host_lengths) if host_lengths else {}
        for name in self.inputs:  # plain loops over what __init__ prepared: this runs per minibatch
            value = data.get(name)
            if value is None:
                raise GraphError(
                    f"{self.where}: the batch has no input {name!r}; batch keys: {sorted(data)}"
                )
            values[name] = value
            n = seq_lengths.get(name)
            if n is not None:
                lengths[name] = n
        known = self._takes_lengths
        for node, model_name, inputs, first, produces, unnamed in self._steps:
            model = models[model_name]
            args = [values[first]] if len(inputs) == 1 else [values[name] for name in inputs]
            first_len = lengths.get(first)
            first_host = hosts.get(first)
            takes = known.get((id(model), type(model)))
            if takes is None:
                takes = known[(id(model), type(model))] = _takes_lengths(model)
            try:
                if takes[1] and first_host is not None:
                    result = model(*args, seq_lengths=first_len, host_lengths=first_host)
                elif takes[0]:
                    result = model(*args, seq_lengths=first_len)
                else:
                    result = model(*args)
            except MtlabError:
                raise
            except Exception as exc:
                shapes = ", ".join(f"{n}{list(a.shape) if isinstance(a, Tensor) else type(a).__name__}"
                                   for n, a in zip(node.inputs, args))
                raise BatchError(
                    f"{self.where}: node {node.name!r} (model {node.model!r}) failed on inputs {shapes}: "
                    f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}; check that the "
                    "batch's shapes and dtypes match what the model expects"
                ) from exc
            if unnamed and type(result) is Tensor:  # the usual case: no ABC check
                parts = [result]
            elif isinstance(result, Mapping):  # a dict or HF ModelOutput: entries by name
                parts = self._entries(node, result)
            elif node.outputs:
                if not isinstance(result, (tuple, list)) or len(result) != len(node.outputs):
                    got = f"a {type(result).__name__}" + (
                        f" of {len(result)}" if isinstance(result, (tuple, list)) else ""
                    )
                    raise GraphError(
                        f"{self.where}: node {node.name!r} names {len(node.outputs)} outputs "
                        f"{list(node.outputs)} but model {node.model!r} returned {got}"
                    )
                parts = list(result)
            else:
                if isinstance(result, (tuple, list)):
                    raise GraphError(
                        f"{self.where}: model {node.model!r} of node {node.name!r} returned "
                        f"{len(result)} values; name them with Node(..., outputs=[...])"
                    )
                parts = [result]
            for out_name, value in zip(produces, parts):
                values[out_name] = value
                if first_len is not None:
                    lengths[out_name] = first_len
                if first_host is not None:
                    hosts[out_name] = first_host
        return GraphResult(outputs=values, seq_lengths=lengths)

    def _entries(self, node: Node, result: Mapping[str, Any]) -> list[Any]:
        """The entries of a model's dict output (a dict, HF's ``ModelOutput``) that ``node`` takes: those its
        ``outputs`` name, else the one named like the node; a GraphError lists the keys there are and the fix."""
        wanted = tuple(node.outputs) if node.outputs else (node.name,)
        missing = [k for k in wanted if k not in result]
        if missing:
            keys = list(result.keys())
            fix = (f"name the node like the entry it takes (Node({keys[0]!r}, {node.model!r}, ...)) or name entries "
                   f"with outputs=[...], e.g. outputs={keys[:2]!r}" if keys else "return the output from the model")
            raise GraphError(f"{self.where}: model {node.model!r} of node {node.name!r} returned a "
                             f"{type(result).__name__} without {missing}; its keys: {keys}; {fix}")
        return [result[k] for k in wanted]

