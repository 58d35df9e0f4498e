"""The one checked forward + loss of a task, used by training, evaluation, the debug oracle and separation.

A :class:`TaskPlan` is prepared once per task (graph checked against the models, key lists, device);
each call then only moves the batch, runs the graph and the loss computer, and checks what came back.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..base.batching import Batch, to_device
from ..base.errors import BatchError, ConfigError, GraphError, MtlabError
from .graph import GraphResult
from .loaders import as_batch, is_loader, loader_fields
from .sampling import BatchStream
from .task import Task


@dataclass
class LossResult:
    """What one minibatch gave: the summed loss, its normalizer, and the graph's outputs."""

    loss_sum: Tensor  # 0-d, the SUM over the minibatch (still attached to the graph when training)
    normalizer: Tensor  # 0-d, what the sum is divided by (frames, examples, ...)
    outputs: dict[str, Tensor]  # empty on the training path (see TaskPlan.loss's keep_outputs)
    seq_lengths: dict[str, Tensor]
    num_examples: int


class TaskPlan:
    """A task's forward and loss, prepared once: ``plan.loss(batch)`` per minibatch.

    Examples:
        >>> plan = TaskPlan(task, models, torch.device("cpu"))  # doctest: +SKIP
        >>> result = plan.loss(collate(examples))  # doctest: +SKIP
        >>> result.loss_sum / result.normalizer  # doctest: +SKIP
    """

    def __init__(self, task: Task, models: Mapping[str, nn.Module], device: torch.device) -> None:
        task.graph.check_models(models)
        self.task = task
        self.graph = task.graph
        self.models = models
        self.device = device
        # Key lists made once per task: each minibatch only picks these entries and moves them.
        self.inputs = tuple(task.inputs)
        self.targets = tuple(task.targets)
        self.outputs = tuple(task.outputs)
        self.keys = (*self.inputs, *self.targets)
        self.model_names = self.graph.model_names
        self.device_type = device.type
        self.on_cpu = device.type == "cpu"

    def prepare(self, batch: Batch, targets: bool = True) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """Check the batch's form and keys and move what the task needs (inputs, and targets unless
        ``targets=False``) to the device; the batch's own dicts are left as they are."""
        if type(batch) is tuple and len(batch) == 2 and type(batch[0]) is dict and type(batch[1]) is dict:
            data, seq_lengths = batch  # collate's form: no ABC checks (this runs per minibatch)
        elif (isinstance(batch, (tuple, list)) and len(batch) == 2 and isinstance(batch[0], Mapping)
              and isinstance(batch[1], Mapping)):
            data, seq_lengths = batch[0], dict(batch[1])
        else:
            raise BatchError("batch must be (data: dict[str, Tensor], seq_lengths: dict[str, LongTensor]) "
                             "as mtlab.collate returns")
        picked: dict[str, Tensor] = {}
        here = self.on_cpu  # on the CPU: nothing to move when every tensor is there already (no device objects)
        for k in self.keys if targets else self.inputs:  # a plain loop: this runs per minibatch
            v = data.get(k)
            if type(v) is not Tensor and not isinstance(v, Tensor):
                raise self._bad_entry(data, k, targets)
            if here and not v.is_cpu:
                here = False
            picked[k] = v
        if here:
            for v in seq_lengths.values():
                if not v.is_cpu:
                    break
            else:
                return picked, seq_lengths
        return to_device((picked, seq_lengths), self.device)

    def _bad_entry(self, data: Mapping[str, Any], key: str, targets: bool) -> BatchError:
        """The error for a batch that lacks ``key`` or holds something other than a tensor there."""
        t = self.task
        if key not in data:
            keys = self.keys if targets else self.inputs
            return BatchError(
                f"task {t.name!r}: the batch lacks {[k for k in keys if k not in data]}; it has {sorted(data)} "
                f"(task inputs {list(t.inputs)}, targets {list(t.targets)})"
            )
        return BatchError(f"task {t.name!r} reads {key!r}, which the batch holds as a "
                          f"{type(data[key]).__name__}, not a tensor; give it as a tensor or numpy array of numbers "
                          "in each example (other entries, such as ids, are carried along unread)")

    def forward(self, batch: Batch) -> GraphResult:
        """Run the graph on the batch's inputs (no targets needed, no loss)."""
        data, seq_lengths = self.prepare(batch, targets=False)
        return self.graph.run(self.models, data, seq_lengths, host_lengths(batch))

    def loss(self, batch: Batch, require_grad: bool = False, keep_outputs: bool | None = None) -> LossResult:
        """Forward and loss; every failure names the task, the loss computer and the shapes.

        ``keep_outputs`` (default: not ``require_grad``) keeps the graph's outputs in the result. The training
        path (``require_grad=True``) drops them: a backward follows, and holding them would keep activations
        the backward has no use for (the encoder's output, the logits) alive through it."""
        t = self.task
        data, seq_lengths = self.prepare(batch)
        hosts = seq_lengths if self.on_cpu else host_lengths(batch)  # on the CPU: the same tensors
        result = self.graph.run(self.models, data, seq_lengths, hosts)  # inputs by name
        lengths = {**seq_lengths, **result.seq_lengths}
        made = result.outputs
        outputs: dict[str, Tensor] = {}
        targets: dict[str, Tensor] = {}
        for k in self.outputs:  # plain loops, no comprehension's call: this runs per minibatch
            outputs[k] = made[k]
        for k in self.targets:
            targets[k] = data[k]
        try:
            if torch.is_autocast_enabled(self.device_type):
                out = loss_in_fp32(t.loss, targets, outputs, lengths, self.device.type)
            else:
                out = t.loss(targets, outputs, lengths)
        except MtlabError:
            raise
        except Exception as exc:
            shapes = {k: list(v.shape) for k, v in {**targets, **outputs}.items()}
            raise BatchError(f"task {t.name!r}: the loss computer {t.loss!r} failed on {shapes}: "
                             f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from exc
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise BatchError(f"task {t.name!r}: the loss computer must return (loss_sum, normalizer), "
                             f"got {type(out).__name__}")
        loss_sum, normalizer = out
        if not isinstance(loss_sum, Tensor) or loss_sum.dim():
            raise BatchError(f"task {t.name!r}: loss_sum must be a scalar tensor (the SUM over the minibatch), "
                             f"got {getattr(loss_sum, 'shape', type(loss_sum).__name__)}")
        if not isinstance(normalizer, Tensor):
            normalizer = torch.as_tensor(float(normalizer), device=loss_sum.device)
        if normalizer.dim():
            raise BatchError(f"task {t.name!r}: the normalizer must be a scalar tensor, got shape {tuple(normalizer.shape)}")
        if require_grad and not loss_sum.requires_grad:
            raise GraphError(f"task {t.name!r}: the loss does not depend on any trainable parameter; "
                             "check the graph's outputs and the loss's output name")
        keep = (not require_grad) if keep_outputs is None else keep_outputs
        return LossResult(loss_sum, normalizer, made if keep else {}, lengths, data[self.keys[0]].shape[0])


def host_lengths(batch: Batch) -> dict[str, Tensor]:
    """The batch's lengths that are on the CPU (collate makes them there): models that pack sequences read
    these instead of copying the device's lengths back (a host sync per forward)."""
    lengths = batch[1]
    return {k: v for k, v in lengths.items() if isinstance(v, Tensor) and v.device.type == "cpu"}


def _fp32(x: Tensor) -> Tensor:
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def loss_in_fp32(loss: Any, targets: dict[str, Tensor], outputs: dict[str, Tensor], lengths: dict[str, Tensor],
                 device_type: str) -> Any:
    """The loss computer outside autocast, on float32 outputs: mtlab's losses are SUMS over a minibatch
    (and take logs, softmaxes over speakers, affinities), which half precision would round away."""
    with torch.autocast(device_type, enabled=False):
        return loss({k: _fp32(v) for k, v in targets.items()}, {k: _fp32(v) for k, v in outputs.items()}, lengths)


def evaluate_totals(plan: TaskPlan, source: Any, batch_size: int, num_batches: int | None = None) -> tuple[float, float]:
    """(Σloss, Σnormalizer) of ``plan`` over ``source`` in order, without gradients (the caller sets eval mode).
    A DataLoader is read once through, its own batches (``num_batches``: its first ones)."""
    if is_loader(source):
        return loader_totals(plan, source, num_batches)
    stream = BatchStream(source, batch_size, 1, seed=0, shuffle=False, device=plan.device)  # streamed: features there
    nb = len(stream) if num_batches is None else min(int(num_batches), len(stream))
    sums = torch.zeros(2, dtype=torch.float64, device=plan.device)
    with torch.no_grad():
        for _ in range(nb):
            r = plan.loss(next(stream))
            sums += torch.stack([r.loss_sum.double(), r.normalizer.double()])
    loss_sum, normalizer = sums.tolist()  # one host read for the whole evaluation
    return loss_sum, normalizer


def loader_totals(plan: TaskPlan, loader: Any, num_batches: int | None = None) -> tuple[float, float]:
    """(Σloss, Σnormalizer) over one pass of a DataLoader (or its first ``num_batches`` batches)."""
    fields = loader_fields(loader)
    sums = torch.zeros(2, dtype=torch.float64, device=plan.device)
    with torch.no_grad():
        for i, raw in enumerate(loader):
            if num_batches is not None and i >= int(num_batches):
                break
            r = plan.loss(as_batch(raw, fields))
            sums += torch.stack([r.loss_sum.double(), r.normalizer.double()])
    loss_sum, normalizer = sums.tolist()
    return loss_sum, normalizer


def parameter_users(models: Mapping[str, nn.Module], plans: Mapping[str, TaskPlan]
                    ) -> tuple[dict[str, nn.Parameter], dict[str, list[str]], dict[str, list[str]]]:
    """Every parameter by ``"<model>.<param>"`` (tied weights keep their first name), each task's parameters
    (those of the models its graph runs), and each used parameter's tasks. Frozen parameters
    (``requires_grad=False``) are included, as ``Adam(model.parameters())`` includes them: ``requires_grad``
    decides at each step what trains, so a parameter unfrozen later trains from the next step."""
    params: dict[str, nn.Parameter] = {}
    seen: dict[int, str] = {}
    for mname, model in models.items():
        for pname, p in model.named_parameters():
            if id(p) not in seen:
                seen[id(p)] = f"{mname}.{pname}"
                params[seen[id(p)]] = p
    task_params: dict[str, list[str]] = {}
    users: dict[str, list[str]] = {}
    for task, plan in plans.items():
        used = list(dict.fromkeys(seen[id(p)] for m in plan.model_names for p in models[m].parameters()
                                  if p.is_floating_point()))
        task_params[task] = used
        for n in used:
            users.setdefault(n, []).append(task)
    if not any(params[n].requires_grad for n in users):
        raise ConfigError("no task uses a model with trainable parameters; check the tasks' nodes")
    return params, task_params, users


@contextmanager
def eval_mode(models: Mapping[str, nn.Module]) -> Iterator[None]:
    """Models in eval mode (dropout off) inside the block; each back to its own mode afterwards."""
    previous = {k: m.training for k, m in models.items()}
    for m in models.values():
        m.eval()
    try:
        yield
    finally:
        for k, m in models.items():
            m.train(previous[k])
