"""The stepwise multi-task trainer.

One training step, as in the original task trainer, for every task::

    reset -> numbatches_to_aggregate x (process_minibatch for every linked set)
          -> normalize (grads /= Σ weighted norm) -> clip (element-wise) -> apply (one Adam step)

Each call is public, checks its phase and leaves every piece of state readable. Summing over
minibatches and dividing once makes the accumulated gradient exactly the gradient of the mean over
everything accumulated, whatever the minibatch lengths.

Where gradients live: a parameter used by one task accumulates directly in ``.grad`` (no extra
buffer). A parameter shared by several tasks gets one buffer per task (swapped into ``.grad``
around that task's backward, a pointer swap, no copy) and one persistent buffer for the combined
update direction Σ_t task_weight_t × grad_t.
"""

from __future__ import annotations

import _signal
import signal
import threading
import zlib
from collections.abc import Callable, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Iterator

import torch
from torch import Tensor, nn

from . import gradops
from .batching import Batch, to_device
from .data.stream import BatchStream
from .errors import BatchError, ConfigError, GraphError, MtlabError, NonFiniteError, PhaseError, ZeroNormError
from .graph import ModelGraph
from .history import History
from .task import LinkedSet, MinibatchRecord, Task, TaskState, check_weight

_SIGINT = int(signal.SIGINT)
NONFINITE_POLICIES = ("raise", "skip")


def _resolve_device(device: str | torch.device) -> torch.device:
    if isinstance(device, str) and device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={device!r} but CUDA is not available here; use device='auto' or 'cpu'")
    return dev


def derived_seed(seed: int, *names: str) -> int:
    """A stable per-stream seed from the trainer seed and names (independent of PYTHONHASHSEED)."""
    return (int(seed) * 7919 + zlib.crc32("/".join(names).encode())) % (2**31)


class Trainer:
    """Multi-task trainer whose step can be run one call at a time.

    >>> trainer = Trainer(models, [task_a, task_b], lr=1e-3, clip_grad_value=1.0,
    ...                   numbatches_to_aggregate=2)
    >>> trainer.process_minibatch("a", "noisy"); trainer.normalize(); trainer.clip(); trainer.apply()
    >>> trainer.step()  # the whole cycle for every task
    """

    def __init__(
        self,
        models: Mapping[str, nn.Module],
        tasks: Sequence[Task],
        lr: float = 1e-3,
        clip_grad_value: float | None = None,
        normalize_gradients: bool = True,
        numbatches_to_aggregate: int = 1,
        device: str | torch.device = "auto",
        seed: int = 0,
        nonfinite: str = "raise",
        adam: Mapping[str, Any] | None = None,
        acc_steps: bool = False,
        normalize_weights_acc_steps: bool = False,
        distributed: bool | None = None,
    ) -> None:
        if not isinstance(models, Mapping) or not models:
            raise ConfigError("models must be a non-empty dict name -> torch.nn.Module")
        for name, model in models.items():
            if not isinstance(model, nn.Module):
                raise ConfigError(f"model {name!r} is a {type(model).__name__}, expected a torch.nn.Module")
            if "." in name:
                raise ConfigError(f"model name {name!r} contains '.', which separates model and parameter names")
        if isinstance(tasks, Task):
            tasks = [tasks]
        if not tasks:
            raise ConfigError("give at least one mtlab.Task")
        names = [t.name for t in tasks]
        if len(set(names)) != len(names):
            raise ConfigError(f"task names must be unique, got {names}")
        if not isinstance(numbatches_to_aggregate, int) or isinstance(numbatches_to_aggregate, bool) \
                or numbatches_to_aggregate < 1:
            raise ConfigError(
                f"numbatches_to_aggregate must be an integer >= 1 (minibatch rounds per step), got {numbatches_to_aggregate!r}"
            )
        if nonfinite not in NONFINITE_POLICIES:
            raise ConfigError(f"nonfinite must be one of {NONFINITE_POLICIES}, got {nonfinite!r}")

        self.device = _resolve_device(device)
        self.models: dict[str, nn.Module] = {k: m.to(self.device) for k, m in models.items()}
        self.tasks: dict[str, Task] = {t.name: t for t in tasks}
        self.graphs: dict[str, ModelGraph] = {
            t.name: ModelGraph(t.nodes, t.inputs, t.outputs, models=self.models, where=f"task {t.name!r}")
            for t in tasks
        }
        self.numbatches_to_aggregate = numbatches_to_aggregate
        self.normalize_gradients = bool(normalize_gradients)
        self.clip_grad_value = clip_grad_value
        self.lr = lr
        self.nonfinite = nonfinite
        self.seed = int(seed)
        self.step_count = 0
        self.log = History()
        self.callbacks: list[Callable[[str, dict[str, Any]], None]] = []
        self._lock = threading.RLock()

        # Parameters by name, deduplicated by identity (tied weights keep their first name).
        self.param_names: dict[int, str] = {}
        self.params: dict[str, nn.Parameter] = {}
        for mname, model in self.models.items():
            for pname, p in model.named_parameters():
                if p.requires_grad and id(p) not in self.param_names:
                    full = f"{mname}.{pname}"
                    self.param_names[id(p)] = full
                    self.params[full] = p
        # Which tasks use which parameters (through the models their graph runs, by identity).
        self.task_params: dict[str, list[str]] = {}
        users: dict[str, list[str]] = {}
        for t in tasks:
            used = []
            for mname in self.graphs[t.name].model_names:
                for p in self.models[mname].parameters():
                    if p.requires_grad:
                        used.append(self.param_names[id(p)])
            used = list(dict.fromkeys(used))
            self.task_params[t.name] = used
            for name in used:
                users.setdefault(name, []).append(t.name)
        self.param_users = users
        self.shared = [n for n, u in users.items() if len(u) > 1]
        self.owned: dict[str, list[str]] = {t: [n for n in ps if len(users[n]) == 1] for t, ps in self.task_params.items()}
        self.task_shared: dict[str, list[str]] = {t: [n for n in ps if len(users[n]) > 1] for t, ps in self.task_params.items()}
        self._shared_bufs: dict[str, dict[str, Tensor | None]] = {t: {} for t in self.tasks}
        self._combined: dict[str, Tensor] = {}

        trainable = [self.params[n] for n in users]
        self.adam_options = dict(adam or {})
        self.acc_steps = bool(acc_steps)
        self.normalize_weights_acc_steps = bool(normalize_weights_acc_steps)
        if not trainable:
            raise ConfigError("no task uses a model with trainable parameters; check the tasks' nodes")
        self.optimizer = self._make_optimizer(trainable) if not self.acc_steps else None
        # acc_steps: one Adam per task (lr x task weight), applied one after another, as the original.
        self.task_optimizers: dict[str, torch.optim.Optimizer] = {}
        if self.acc_steps:
            for tname, pnames in self.task_params.items():
                groups: dict[tuple[str, ...], list[nn.Parameter]] = {}
                for pname in pnames:
                    groups.setdefault(tuple(users[pname]), []).append(self.params[pname])
                self.task_optimizers[tname] = self._make_optimizer(
                    [{"params": ps, "mtlab_users": list(u)} for u, ps in groups.items()])
        self._states: dict[str, TaskState] = {t: self._new_state(t) for t in self.tasks}
        self._streams: dict[tuple[str, str], BatchStream] = {}
        self._training_mode: bool | None = None
        self._stash: dict[str, Tensor] = {}
        self.recipe: dict[str, Any] | None = None
        self.schedule: Any = None  # a mtlab.schedule.Schedule when built from a recipe
        # Data parallel: on when a torch.distributed process group is up (or distributed=True).
        from . import distributed as _dist

        if distributed is None:
            distributed = _dist.active() and _dist.world()[1] > 1
        if distributed and not _dist.active():
            raise ConfigError("distributed=True needs torch.distributed.init_process_group() first "
                              "(torchrun does it for `python -m mtlab train`)")
        self.rank, self.world_size = _dist.world() if distributed else (0, 1)
        self.distributed = bool(distributed)
        self._flat: dict[str, Tensor] = {}
        if self.distributed:
            _dist.check_consistent(self)

    # ------------------------------------------------------------------ construction helpers
    def _make_optimizer(self, params: list[Any]) -> torch.optim.Optimizer:
        opts = dict(self.adam_options)
        flat = [p for g in params for p in (g["params"] if isinstance(g, dict) else [g])]
        if "fused" not in opts and "foreach" not in opts:
            # Fused Adam can skip a step on the device (found_inf) without a host sync.
            opts["fused"] = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in flat)
        return torch.optim.Adam(params, lr=self.lr, **opts)

    def _new_state(self, task: str) -> TaskState:
        st = TaskState(task=task, device=self.device)
        st._grad_view = lambda t=task: self._task_grads(t)
        return st

    def _task_grads(self, task: str) -> dict[str, Tensor]:
        out: dict[str, Tensor] = {}
        bufs = self._shared_bufs[task]
        stash = self._stash
        for name in self.task_params[task]:
            if name in bufs:
                g = bufs[name]
            elif name in stash:
                g = stash[name]
            elif len(self.param_users[name]) == 1:
                g = self.params[name].grad
            else:
                g = None
            if g is not None:
                out[name] = g
        return out

    # ------------------------------------------------------------------ settings
    @property
    def lr(self) -> float:
        return self._lr

    @lr.setter
    def lr(self, value: float) -> None:
        try:
            v = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"lr must be a positive number, got {value!r}") from None
        if not v > 0 or v == float("inf"):
            raise ConfigError(f"lr must be a positive finite number, got {value!r}")
        self._lr = v

    @property
    def clip_grad_value(self) -> float | None:
        return self._clip

    @clip_grad_value.setter
    def clip_grad_value(self, value: float | None) -> None:
        if value is None:
            self._clip = None
            return
        try:
            v = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"clip_grad_value must be a positive number or None, got {value!r}") from None
        if not v > 0:
            raise ConfigError(f"clip_grad_value must be > 0 (or None to turn clipping off), got {value!r}")
        self._clip = v

    def set_weight(self, task: str, linkedset: str, weight: float) -> None:
        """Weight of a linked set, used from the next minibatch on (0 leaves the set out of step())."""
        ls = self._linkedset(task, linkedset)
        ls.weight = check_weight(weight, f"weight of linked set {linkedset!r} of task {task!r}")
        self._emit("weight", {"task": task, "linkedset": linkedset, "weight": ls.weight})

    def set_task_weight(self, task: str, weight: float) -> None:
        """Weight of a task in the combined update (0 leaves the task out of step())."""
        t = self._task(task)
        t.weight = check_weight(weight, f"weight of task {task!r}")
        self._emit("task_weight", {"task": task, "weight": t.weight})

    def weights(self) -> dict[str, float]:
        """Every task weight (``"a"``) and linked-set weight (``"a/clean"``)."""
        out: dict[str, float] = {}
        for tname, t in self.tasks.items():
            out[tname] = t.weight
            for sname, ls in t.linkedsets.items():
                out[f"{tname}/{sname}"] = ls.weight
        return out

    # ------------------------------------------------------------------ lookups
    def _task(self, task: str) -> Task:
        if task not in self.tasks:
            raise ConfigError(f"unknown task {task!r}; tasks: {list(self.tasks)}")
        return self.tasks[task]

    def _linkedset(self, task: str, linkedset: str) -> LinkedSet:
        t = self._task(task)
        if linkedset not in t.linkedsets:
            raise ConfigError(f"task {task!r} has no linked set {linkedset!r}; linked sets: {list(t.linkedsets)}")
        return t.linkedsets[linkedset]

    def state(self, task: str) -> TaskState:
        """The live accumulation state of ``task`` (phase, loss, norm, grads, counts)."""
        self._task(task)
        return self._states[task]

    def stream(self, task: str, linkedset: str) -> BatchStream:
        """The endless minibatch stream of a linked set (created on first use)."""
        key = (task, linkedset)
        if key not in self._streams:
            t = self._task(task)
            ls = self._linkedset(task, linkedset)
            if ls.examples is None:
                raise ConfigError(
                    f"linked set {linkedset!r} of task {task!r} has no examples; pass batch=(data, seq_lengths) "
                    "to process_minibatch or give LinkedSet(examples)"
                )
            self._streams[key] = BatchStream(
                ls.examples, t.batch_size, t.numbuckets, seed=derived_seed(self.seed, task, linkedset),
                num_workers=ls.num_workers, pin_memory=self.device.type == "cuda",
                shard=(self.rank, self.world_size),
            )
        return self._streams[key]

    # ------------------------------------------------------------------ events
    def add_callback(self, fn: Callable[[str, dict[str, Any]], None]) -> None:
        """Call ``fn(event, info)`` after each minibatch, normalize, clip, apply, reset and weight change."""
        self.callbacks.append(fn)

    def remove_callback(self, fn: Callable[[str, dict[str, Any]], None]) -> None:
        """Stop calling ``fn`` (no error if it was not registered)."""
        if fn in self.callbacks:
            self.callbacks.remove(fn)

    def _emit(self, event: str, info: dict[str, Any]) -> None:
        for fn in list(self.callbacks):
            fn(event, info)

    # ------------------------------------------------------------------ the stepwise API
    def reset(self, task: str | None = None) -> None:
        """Discard what ``task`` (default: every task) accumulated; its phase becomes ``empty``."""
        with self._critical():
            for name in [task] if task is not None else list(self.tasks):
                self._task(name)
                self._reset(name)
            self._emit("reset", {"task": task})

    @contextmanager
    def _critical(self) -> Iterator[None]:
        """Hold the lock and hold back Ctrl-C until the call has finished: a stepwise call is
        either fully done or not done at all when KeyboardInterrupt arrives."""
        with self._lock:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            received: list[int] = []
            try:
                # _signal skips the enum wrapping of signal.signal: this runs once per call.
                previous = _signal.signal(_SIGINT, lambda signum, frame: received.append(signum))
            except (ValueError, OSError):
                yield
                return
            try:
                yield
            finally:
                _signal.signal(_SIGINT, previous)
            if received:
                raise KeyboardInterrupt(f"interrupted; the trainer stopped between calls (phases {self.phase()})")

    def _adopt_grad(self, task: str, pname: str, grad: Tensor) -> None:
        """Give ``task`` a gradient for a parameter it had none for (used by the all-reduce)."""
        if len(self.param_users[pname]) > 1:
            self._shared_bufs[task][pname] = grad
        else:
            self.params[pname].grad = grad

    def _reset(self, task: str) -> None:
        for name in self.owned[task]:
            self.params[name].grad = None
        self._shared_bufs[task] = {}
        self._states[task] = self._new_state(task)

    def _set_mode(self, training: bool) -> None:
        if self._training_mode is training and all(m.training == training for m in self.models.values()):
            return
        for m in self.models.values():
            m.train(training)
        self._training_mode = training

    def _split(self, task: Task, batch: Batch) -> tuple[dict[str, Tensor], dict[str, Tensor], dict[str, Tensor]]:
        if not (isinstance(batch, (tuple, list)) and len(batch) == 2 and isinstance(batch[0], Mapping)
                and isinstance(batch[1], Mapping)):
            raise BatchError("batch must be (data: dict[str, Tensor], seq_lengths: dict[str, LongTensor]) "
                             "as mtlab.collate returns")
        data, seq_lengths = batch
        missing = [k for k in (*task.inputs, *task.targets) if k not in data]
        if missing:
            raise BatchError(
                f"task {task.name!r}: the batch lacks {missing}; it has {sorted(data)} "
                f"(task inputs {list(task.inputs)}, targets {list(task.targets)})"
            )
        inputs = {k: data[k] for k in task.inputs}
        targets = {k: data[k] for k in task.targets}
        return inputs, targets, dict(seq_lengths)

    def process_minibatch(self, task: str, linkedset: str, batch: Batch | None = None) -> TaskState:
        """Forward, weighted loss, backward, and add into ``task``'s accumulators.

        Draws the next minibatch of the linked set's stream unless ``batch=(data, seq_lengths)``
        is given. Both the summed loss and the norm are multiplied by the linked set's weight.
        """
        with self._critical():
            t = self._task(task)
            ls = self._linkedset(task, linkedset)
            st = self._states[task]
            if st.phase in ("normalized", "clipped"):
                raise PhaseError(
                    f"task {task!r} is {st.phase}; call apply() to finish this step "
                    f"(or reset({task!r}) to discard it) before processing more minibatches"
                )
            weight = ls.weight  # read once: a slider may move it while we run
            stream_state = None
            if batch is None:
                stream = self.stream(task, linkedset)
                stream_state = (stream.epoch, stream.position)
                batch = next(stream)
            try:
                return self._process(t, linkedset, weight, batch)
            except BaseException:
                if stream_state is not None:
                    self._streams[(task, linkedset)].seek(*stream_state)
                raise

    def _process(self, t: Task, linkedset: str, weight: float, batch: Batch) -> TaskState:
        inputs, targets, seq_lengths = self._split(t, batch)
        data, seq_lengths = to_device(({**inputs, **targets}, seq_lengths), self.device)
        inputs = {k: data[k] for k in t.inputs}
        targets = {k: data[k] for k in t.targets}
        num_examples = int(next(iter(inputs.values())).shape[0])
        self._set_mode(True)
        with torch.enable_grad():
            result = self.graphs[t.name].run(self.models, inputs, seq_lengths)
            lengths = {**seq_lengths, **result.seq_lengths}
            try:
                out = t.loss(targets, {k: result.outputs[k] for k in t.outputs}, lengths)
            except MtlabError:
                raise
            except Exception as exc:
                shapes = {k: list(v.shape) for k, v in {**targets, **{o: result.outputs[o] for o in t.outputs}}.items()}
                raise BatchError(f"task {t.name!r}: the loss computer {t.loss!r} failed on {shapes}: "
                                 f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from exc
            if not (isinstance(out, (tuple, list)) and len(out) == 2):
                raise BatchError(f"task {t.name!r}: the loss computer must return (loss_sum, norm), got {type(out).__name__}")
            loss_sum, norm = out
            if not isinstance(loss_sum, Tensor) or loss_sum.dim() != 0:
                raise BatchError(f"task {t.name!r}: loss_sum must be a scalar tensor (the SUM over the minibatch), "
                                 f"got {getattr(loss_sum, 'shape', type(loss_sum).__name__)}")
            if not isinstance(norm, Tensor):
                norm = torch.as_tensor(float(norm), device=loss_sum.device)
            if norm.dim() != 0:
                raise BatchError(f"task {t.name!r}: norm must be a scalar tensor, got shape {tuple(norm.shape)}")
            if not loss_sum.requires_grad:
                raise GraphError(f"task {t.name!r}: the loss does not depend on any trainable parameter; "
                                 "check the graph's outputs and the loss's output name")
            st = self._states[t.name]
            if st.phase in ("empty", "applied"):
                self._reset(t.name)  # the next minibatch after apply starts a fresh accumulation
                st = self._states[t.name]
            shared = self.task_shared[t.name]
            bufs = self._shared_bufs[t.name]
            for name in shared:
                self.params[name].grad = bufs.get(name)
            try:
                (loss_sum if weight == 1.0 else loss_sum * weight).backward()
            finally:
                for name in shared:
                    p = self.params[name]
                    bufs[name] = p.grad
                    p.grad = None
        loss_w = loss_sum.detach()
        norm_w = norm.detach()
        if norm_w.dtype != loss_w.dtype:
            norm_w = norm_w.to(loss_w.dtype)
        if weight != 1.0:
            loss_w = loss_w * weight
            norm_w = norm_w * weight
        st.minibatches += 1
        st.records.append(MinibatchRecord(linkedset, num_examples, weight, loss_w, norm_w))
        st.phase = "accumulating"
        self._emit("minibatch", {"task": t.name, "linkedset": linkedset, "state": st})
        return st

    def _targets_for(self, task: str | None, call: str, allowed: tuple[str, ...]) -> list[str]:
        """Tasks a call covers; raises PhaseError naming the call that should come first."""
        if task is not None:
            self._task(task)
            st = self._states[task]
            if st.phase not in allowed:
                raise PhaseError(self._phase_message(task, call))
            return [task]
        chosen = [n for n, s in self._states.items() if s.phase in allowed]
        blocked = [n for n, s in self._states.items() if s.phase not in allowed and s.phase not in ("empty", "applied")]
        if blocked and not chosen:
            raise PhaseError(self._phase_message(blocked[0], call))
        if not chosen:
            raise PhaseError(f"{call}(): no task has accumulated minibatches; call process_minibatch(task, linkedset) first")
        return chosen

    def _phase_message(self, task: str, call: str) -> str:
        phase = self._states[task].phase
        if phase in ("empty", "applied"):
            return f"{call}(): task {task!r} has nothing accumulated; call process_minibatch({task!r}, ...) first"
        if call == "normalize":
            nxt = "clip()" if phase == "normalized" and self.clip_grad_value is not None else "apply()"
            return f"normalize(): task {task!r} is already {phase}; next call: {nxt}"
        if call == "clip":
            if phase == "accumulating":
                return f"clip(): task {task!r} has not been normalized; call normalize() first"
            return f"clip(): task {task!r} is already clipped; next call: apply()"
        return f"{call}(): task {task!r} is {phase}"

    def normalize(self, task: str | None = None) -> None:
        """Divide ``task``'s (default: every accumulating task's) accumulated gradients by its
        accumulated (weighted) norm, once."""
        with self._critical():
            names = self._targets_for(task, "normalize", ("accumulating",))
            if self.distributed:
                from .distributed import allreduce_task

                for name in names:
                    allreduce_task(self, name)
            if self.normalize_gradients and self.nonfinite == "raise":
                for name in names:
                    # A host read (sync point), only under the "raise" policy; "skip" stays sync-free
                    # and lets apply() drop a step whose norm was zero.
                    if float(self._states[name].batch_loss_norm) == 0.0:
                        raise ZeroNormError(
                            f"normalize(): task {name!r} accumulated a norm of 0 (all its minibatches had "
                            "weight 0 or no valid frames); process minibatches with a positive weight or reset()"
                        )
            for name in names:
                st = self._states[name]
                if self.normalize_gradients:
                    gradops.div_(list(st.grads.values()), st.batch_loss_norm)
                st.phase = "normalized"
                self._emit("normalize", {"task": name, "state": st})

    def clip(self, task: str | None = None) -> None:
        """Clip each task's gradients element-wise to ±clip_grad_value; record norms before and after."""
        with self._critical():
            allowed = ("normalized",) if self.normalize_gradients else ("accumulating", "normalized")
            names = self._targets_for(task, "clip", allowed)
            for name in names:
                st = self._states[name]
                grads = st.grads
                tensors = list(grads.values())
                self._record_norms(st, grads)
                if self.clip_grad_value is not None and tensors:
                    c = self.clip_grad_value
                    numel = sum(g.numel() for g in tensors)
                    st.clip_fraction = gradops.count_above(tensors, c).to(torch.float64) / max(numel, 1)
                    gradops.clamp_(tensors, c)
                    per = gradops.norms(tensors)
                    st.param_norms_clipped = dict(zip(grads.keys(), per))
                    st.grad_norm_clipped = gradops.total_norm(tensors, per)
                else:
                    st.clip_fraction = torch.zeros((), dtype=torch.float64, device=self.device)
                    st.param_norms_clipped = dict(st.param_norms)
                    st.grad_norm_clipped = st.grad_norm
                st.phase = "clipped"
                self._emit("clip", {"task": name, "state": st})

    def _record_norms(self, st: TaskState, grads: dict[str, Tensor]) -> None:
        tensors = list(grads.values())
        per = gradops.norms(tensors)
        st.param_norms = dict(zip(grads.keys(), per))
        st.grad_norm = gradops.total_norm(tensors, per) if tensors else torch.zeros((), device=self.device)

    def apply(self) -> None:
        """One optimizer step with Σ_t task_weight_t × processed_grad_t for every used parameter.

        Covers every task that accumulated something; refuses (changing nothing) while one of them
        still needs normalize() or clip(), and, under ``nonfinite="raise"``, when a loss or gradient
        is not finite.
        """
        with self._critical():
            names = [n for n, s in self._states.items() if s.phase in ("accumulating", "normalized", "clipped")]
            if not names:
                raise PhaseError("apply(): nothing accumulated; call process_minibatch(task, linkedset) first (or step())")
            for name in names:
                phase = self._states[name].phase
                if self.normalize_gradients and phase == "accumulating":
                    raise PhaseError(f"apply(): task {name!r} has not been normalized; call normalize() before apply()")
                if self.clip_grad_value is not None and phase != "clipped":
                    raise PhaseError(f"apply(): task {name!r} has not been clipped; call clip() before apply()")
            states = [self._states[n] for n in names]
            for st in states:
                if st.grad_norm is None:
                    self._record_norms(st, st.grads)
                    st.grad_norm_clipped = st.grad_norm
                    st.param_norms_clipped = dict(st.param_norms)
                    st.clip_fraction = torch.zeros((), dtype=torch.float64, device=self.device)
            # Non-finite if any loss or pre-clip gradient norm is (clamp would turn inf into ±clip).
            bad_each = torch.stack([~(torch.isfinite(st.batch_loss) & torch.isfinite(st.grad_norm)) for st in states])
            found_inf = bad_each.any()
            if self.nonfinite == "raise":
                if bool(found_inf):  # sync point: the "raise" policy must know before stepping
                    raise NonFiniteError(self._nonfinite_message(names, bad_each))
                self._step_optimizer(names, None)
            else:
                self._step_optimizer(names, found_inf)
            for st in states:
                st.phase = "applied"
            self.step_count += 1
            self.log.append(self._history_row(names, found_inf))
            self._emit("apply", {"tasks": names, "step": self.step_count})

    def _nonfinite_message(self, names: list[str], bad_each: Tensor) -> str:
        parts = []
        for name, bad in zip(names, bad_each.tolist()):
            if not bad:
                continue
            st = self._states[name]
            culprit = next((f"minibatch {i} of linked set {r.linkedset!r}" for i, r in enumerate(st.records)
                            if not torch.isfinite(r.loss)), None)
            if culprit:
                parts.append(f"task {name!r}: non-finite loss from {culprit}")
            else:
                models = [m for m, n in st.model_grad_norms().items() if not torch.isfinite(n)]
                parts.append(f"task {name!r}: non-finite gradient in model(s) {models}")
        return ("apply(): refused, parameters and optimizer untouched: " + "; ".join(parts) +
                ". reset() and go on, or use Trainer(nonfinite='skip') to drop such steps automatically")

    def _run_optimizer(self, opt: torch.optim.Optimizer, found_inf: Tensor | None) -> None:
        if found_inf is not None and opt.defaults.get("fused"):
            opt.found_inf = found_inf.to(torch.float32)  # the device skips the update: no host sync
            try:
                opt.step()
            finally:
                del opt.found_inf
        elif found_inf is not None:
            if not bool(found_inf):  # sync point: non-fused optimizers cannot skip on the device
                opt.step()
        else:
            opt.step()

    def _step_optimizer(self, names: list[str], found_inf: Tensor | None) -> None:
        if self.acc_steps:
            self._step_per_task(names, found_inf)
            return
        assert self.optimizer is not None
        weights = {n: self.tasks[n].weight for n in names}
        participating = set(names)
        # Owned parameters of tasks outside this apply: hide their (readable) grads from Adam.
        self._stash = {}
        for tname, owned in self.owned.items():
            if tname in participating:
                continue
            for pname in owned:
                p = self.params[pname]
                if p.grad is not None:
                    self._stash[pname] = p.grad
                    p.grad = None
        scaled: list[tuple[float, list[Tensor]]] = []
        try:
            for tname in names:
                w = weights[tname]
                if w != 1.0:
                    own = [self.params[p].grad for p in self.owned[tname] if self.params[p].grad is not None]
                    gradops.mul_(own, w)
                    scaled.append((w, own))
            for pname in self.shared:
                srcs = [(weights[t], self._shared_bufs[t].get(pname)) for t in self.param_users[pname] if t in participating]
                srcs = [(w, g) for w, g in srcs if g is not None]
                p = self.params[pname]
                if not srcs:
                    p.grad = None
                    continue
                buf = self._combined.get(pname)
                if buf is None or buf.shape != p.shape or buf.dtype != p.dtype:
                    buf = self._combined[pname] = torch.empty_like(p)
                p.grad = gradops.add_scaled_(buf, srcs)
            for group in self.optimizer.param_groups:
                group["lr"] = self.lr
            self._run_optimizer(self.optimizer, found_inf)
        finally:
            for w, own in scaled:
                gradops.mul_(own, 1.0 / w)
            for pname, g in self._stash.items():
                self.params[pname].grad = g
            self._stash = {}
            for pname in self.shared:
                self.params[pname].grad = None

    def _step_per_task(self, names: list[str], found_inf: Tensor | None) -> None:
        """``acc_steps``: each task's own Adam (lr x task weight) on its own processed gradient,
        one task after another; with ``normalize_weights_acc_steps`` a parameter's factor is the
        task weight divided by the summed weights of the tasks that use it."""
        for tname in names:
            opt = self.task_optimizers[tname]
            w = self.tasks[tname].weight
            for group in opt.param_groups:
                factor = w
                if self.normalize_weights_acc_steps:
                    total = sum(self.tasks[u].weight for u in group["mtlab_users"])
                    factor = w / total if total > 0 else 0.0
                group["lr"] = self.lr * factor
            shared = self.task_shared[tname]
            bufs = self._shared_bufs[tname]
            for pname in shared:
                self.params[pname].grad = bufs.get(pname)
            try:
                self._run_optimizer(opt, found_inf)
            finally:
                for pname in shared:
                    self.params[pname].grad = None

    def _history_row(self, names: list[str], found_inf: Tensor) -> dict[str, Any]:
        row: dict[str, Any] = {"step": self.step_count, "lr": self.lr, "skipped": found_inf}
        for tname, t in self.tasks.items():
            row[f"{tname}/weight"] = t.weight
            for sname, ls in t.linkedsets.items():
                row[f"{tname}/{sname}/weight"] = ls.weight
            if tname not in names:
                continue
            st = self._states[tname]
            row[f"{tname}/loss"] = st.normalized_loss
            for sname in st.set_loss:
                row[f"{tname}/{sname}/loss"] = st.linkedset_loss(sname)
            row[f"{tname}/grad_norm"] = st.grad_norm
            row[f"{tname}/grad_norm_clipped"] = st.grad_norm_clipped
            row[f"{tname}/clip_fraction"] = st.clip_fraction
            row[f"{tname}/minibatches"] = st.minibatches
        return row

    def step(self) -> dict[str, TaskState]:
        """The whole cycle: reset, ``numbatches_to_aggregate`` rounds of every (task, linked set),
        normalize, clip, apply. Linked sets and tasks of weight 0 are left out."""
        with self._lock:
            active = [n for n, t in self.tasks.items()
                      if t.weight > 0 and any(ls.weight > 0 for ls in t.linkedsets.values())]
            if not active:
                raise ConfigError("step(): every task (or every linked set) has weight 0; raise a weight first")
            for name in self.tasks:
                self._reset(name)
            self._emit("reset", {"task": None})
            for name in active:
                sets = [s for s, ls in self.tasks[name].linkedsets.items() if ls.weight > 0]
                for _ in range(self.numbatches_to_aggregate):
                    for s in sets:
                        self.process_minibatch(name, s)
            self.normalize()
            if self.clip_grad_value is not None:
                self.clip()
            self.apply()
            return {n: self._states[n] for n in active}

    @property
    def history(self) -> "pandas.DataFrame":  # noqa: F821
        """One row per applied step (reads the device once for rows not yet read)."""
        return self.log.frame()

    def phase(self) -> dict[str, str]:
        return {n: s.phase for n, s in self._states.items()}

    # ------------------------------------------------------------------ evaluation
    @contextmanager
    def _eval_mode(self) -> Iterator[None]:
        previous = {k: m.training for k, m in self.models.items()}
        for m in self.models.values():
            m.eval()
        try:
            with torch.no_grad():
                yield
        finally:
            for k, m in self.models.items():
                m.train(previous[k])
            self._training_mode = None

    def evaluate(self, task: str, linkedset: str, num_batches: int | None = None, examples: Any = None,
                 totals: bool = False) -> Any:
        """Σloss/Σnorm over the linked set's held-out examples (``valid``, else its training
        examples, or ``examples=``), in eval mode, without gradients. Leaves accumulators alone.
        ``totals=True`` returns ``(Σloss, Σnorm)`` instead, for pooling several linked sets exactly."""
        with self._lock:
            t = self._task(task)
            ls = self._linkedset(task, linkedset)
            source = examples if examples is not None else (ls.valid if ls.valid is not None else ls.examples)
            if source is None:
                raise ConfigError(f"evaluate(): linked set {linkedset!r} of task {task!r} has no examples; pass examples=")
            stream = BatchStream(source, t.batch_size, 1, seed=0, shuffle=False)
            nb = len(stream) if num_batches is None else min(int(num_batches), len(stream))
            total = torch.zeros((), dtype=torch.float64, device=self.device)
            norm = torch.zeros((), dtype=torch.float64, device=self.device)
            with self._eval_mode():
                for _ in range(nb):
                    inputs, targets, seq_lengths = self._split(t, next(stream))
                    data, seq_lengths = to_device(({**inputs, **targets}, seq_lengths), self.device)
                    result = self.graphs[task].run(self.models, {k: data[k] for k in t.inputs}, seq_lengths)
                    loss_sum, n = t.loss({k: data[k] for k in t.targets}, {k: result.outputs[k] for k in t.outputs},
                                         {**seq_lengths, **result.seq_lengths})
                    total += loss_sum.double()
                    norm += torch.as_tensor(n, device=self.device).double()
            value = float(total / norm) if float(norm) != 0 else float("nan")
            self._emit("evaluate", {"task": task, "linkedset": linkedset, "loss": value, "step": self.step_count})
            return (float(total), float(norm)) if totals else value

    # ------------------------------------------------------------------ state you can keep
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly: weights, optimizer, accumulators (phase, loss,
        norm, grads), data-stream positions, RNG states, step, settings, weights and history.
        Plain containers of tensors, strings and numbers (loadable with ``weights_only=True``)."""
        with self._lock:
            tasks: dict[str, Any] = {}
            for name, st in self._states.items():
                tasks[name] = {
                    "phase": st.phase, "minibatches": st.minibatches,
                    "records": [{"linkedset": r.linkedset, "num_examples": r.num_examples, "weight": r.weight,
                                 "loss": r.loss.clone(), "norm": r.norm.clone()} for r in st.records],
                    "grads": {k: v.detach().clone() for k, v in st.grads.items()},
                    "grad_norm": None if st.grad_norm is None else st.grad_norm.clone(),
                    "grad_norm_clipped": None if st.grad_norm_clipped is None else st.grad_norm_clipped.clone(),
                    "clip_fraction": None if st.clip_fraction is None else st.clip_fraction.clone(),
                    "param_norms": {k: v.clone() for k, v in st.param_norms.items()},
                    "param_norms_clipped": {k: v.clone() for k, v in st.param_norms_clipped.items()},
                    "weight": self.tasks[name].weight,
                    "linkedset_weights": {k: ls.weight for k, ls in self.tasks[name].linkedsets.items()},
                }
            rng: dict[str, Any] = {"torch": torch.get_rng_state()}
            if torch.cuda.is_available() and self.device.type == "cuda":
                rng["cuda"] = torch.cuda.get_rng_state(self.device)
            return {
                "format": "mtlab-trainer", "version": 1,
                "models": {k: {n: t.detach().clone() for n, t in m.state_dict().items()} for k, m in self.models.items()},
                "optimizer": _clone_tree(self.optimizer.state_dict()) if self.optimizer is not None else None,
                "task_optimizers": {k: _clone_tree(o.state_dict()) for k, o in self.task_optimizers.items()},
                "tasks": tasks,
                "streams": {f"{t}/{s}": dict(st.state_dict()) for (t, s), st in self._streams.items()},
                "rng": rng,
                "step": self.step_count, "lr": self.lr, "clip_grad_value": self.clip_grad_value,
                "history": self.log.state_dict(),
                "settings": {"normalize_gradients": self.normalize_gradients,
                             "numbatches_to_aggregate": self.numbatches_to_aggregate,
                             "nonfinite": self.nonfinite, "seed": self.seed,
                             "acc_steps": self.acc_steps,
                             "normalize_weights_acc_steps": self.normalize_weights_acc_steps},
            }

    def load_state_dict(self, state: Mapping[str, Any], history: bool = True) -> None:
        """Restore a ``state_dict()``: the trainer continues exactly where that state was taken."""
        with self._lock:
            if not isinstance(state, Mapping) or state.get("format") != "mtlab-trainer":
                raise ConfigError("not an mtlab trainer state (expected the dict Trainer.state_dict() returns)")
            if state.get("version") != 1:
                raise ConfigError(f"trainer state version {state.get('version')!r} is not supported by this mtlab (1)")
            missing_models = sorted(set(self.models) ^ set(state["models"]))
            missing_tasks = sorted(set(self.tasks) ^ set(state["tasks"]))
            if missing_models or missing_tasks:
                raise ConfigError(
                    f"the state does not match this trainer: models differ by {missing_models}, tasks by {missing_tasks}; "
                    "load it into a trainer built from the same recipe"
                )
            for name, st in state["tasks"].items():
                unknown = set(st["grads"]) - set(self.task_params[name])
                if unknown:
                    raise ConfigError(f"the state's task {name!r} has gradients for unknown parameters {sorted(unknown)}")
            for k, m in self.models.items():
                m.load_state_dict(state["models"][k])
            if (self.optimizer is None) != (state["optimizer"] is None):
                raise ConfigError("the state was saved with acc_steps=%s but this trainer has acc_steps=%s; "
                                  "build the trainer with the same setting" % (state["optimizer"] is None, self.acc_steps))
            if self.optimizer is not None:
                self.optimizer.load_state_dict(_clone_tree(state["optimizer"]))
            for k, o in self.task_optimizers.items():
                o.load_state_dict(_clone_tree(state["task_optimizers"][k]))
            for name, saved in state["tasks"].items():
                self._reset(name)
                st = self._states[name]
                dev = self.device
                st.phase = saved["phase"]
                st.minibatches = int(saved["minibatches"])
                st.records = [MinibatchRecord(r["linkedset"], int(r["num_examples"]), float(r["weight"]),
                                              r["loss"].to(dev).clone(), r["norm"].to(dev).clone()) for r in saved["records"]]
                for key in ("grad_norm", "grad_norm_clipped", "clip_fraction"):
                    v = saved[key]
                    setattr(st, key, None if v is None else v.to(dev).clone())
                st.param_norms = {k: v.to(dev).clone() for k, v in saved["param_norms"].items()}
                st.param_norms_clipped = {k: v.to(dev).clone() for k, v in saved["param_norms_clipped"].items()}
                for pname, g in saved["grads"].items():
                    g = g.to(device=dev, dtype=self.params[pname].dtype).clone()
                    if len(self.param_users[pname]) > 1:
                        self._shared_bufs[name][pname] = g
                    else:
                        self.params[pname].grad = g
                self.tasks[name].weight = float(saved["weight"])
                for sname, w in saved["linkedset_weights"].items():
                    if sname in self.tasks[name].linkedsets:
                        self.tasks[name].linkedsets[sname].weight = float(w)
            for key, sst in state["streams"].items():
                tname, sname = key.split("/", 1)
                if tname in self.tasks and sname in self.tasks[tname].linkedsets:
                    self.stream(tname, sname).load_state_dict(sst)
            torch.set_rng_state(state["rng"]["torch"])
            if "cuda" in state["rng"] and self.device.type == "cuda":
                torch.cuda.set_rng_state(state["rng"]["cuda"], self.device)
            self.step_count = int(state["step"])
            self.lr = state["lr"]
            self.clip_grad_value = state["clip_grad_value"]
            if history:
                self.log.load_state_dict(state["history"])
            self._emit("restore", {"step": self.step_count})

    def snapshot(self) -> dict[str, Any]:
        """An in-memory copy of the whole state (undo in a notebook; rollback in validation)."""
        return self.state_dict()

    def restore(self, snapshot: Mapping[str, Any], history: bool = True) -> None:
        """Go back to a ``snapshot()``; the snapshot stays valid for later restores."""
        self.load_state_dict(snapshot, history=history)

    def save(self, path: str | "os.PathLike[str]") -> None:  # noqa: F821
        """Write a checkpoint atomically (a crash mid-write leaves the previous file intact)."""
        from .schedule import save_checkpoint

        save_checkpoint(self, self.schedule, path)

    def load_checkpoint(self, path: str | "os.PathLike[str]") -> None:  # noqa: F821
        """Load a checkpoint written by ``save`` into this trainer (never unpickles objects)."""
        from .checkpoint import load_safe

        self.load_state_dict(load_safe(path))

    # ------------------------------------------------------------------ the layers around the core
    @classmethod
    def from_recipe(cls, recipe: Any) -> "Trainer":
        """A trainer (with its schedule) from a TOML recipe, an original ``trainer.cfg`` or a dict."""
        from .recipe import build_trainer

        return build_trainer(recipe)

    @classmethod
    def load(cls, path: Any) -> "Trainer":
        """Rebuild a trainer from a checkpoint written by ``save`` (its recipe is inside)."""
        from .recipe import load_trainer

        return load_trainer(path)

    def run(self, steps: int | None = None, progress: bool = True, expdir: Any = None, schedule: Any = None) -> Any:
        """Train with the schedule (LR decay, validation, rollback) until done, ``steps`` more steps,
        validation stops it, or Ctrl-C; a ``tqdm.auto`` bar unless ``progress=False``."""
        from .schedule import run

        return run(self, schedule=schedule, steps=steps, progress=progress, expdir=expdir)

    def explain(self) -> str:
        """The cycle this trainer runs, each task's phase, and what the next call will do."""
        from .debug import explain

        return explain(self)

    def dashboard(self, **kwargs: Any) -> Any:
        """The live notebook dashboard (needs ``pip install "mtlab[notebook]"``)."""
        from .ui import dashboard

        return dashboard(self, **kwargs)

    # ------------------------------------------------------------------ introspection
    def __repr__(self) -> str:
        return (f"Trainer(tasks={list(self.tasks)}, models={list(self.models)}, step={self.step_count}, "
                f"phase={self.phase()}, device={self.device})")

    def _repr_html_(self) -> str:
        rows = []
        for tname, t in self.tasks.items():
            st = self._states[tname]
            sets = ", ".join(f"{s} ({ls.weight:g})" for s, ls in t.linkedsets.items())
            rows.append(f"<tr><td>{tname}</td><td>{t.weight:g}</td><td>{sets}</td><td>{', '.join(self.graphs[tname].model_names)}</td>"
                        f"<td>{st.phase}</td><td>{st.minibatches}</td></tr>")
        return ("<div><b>mtlab.Trainer</b> "
                f"step {self.step_count} &middot; lr {self.lr:g} &middot; clip {self.clip_grad_value} &middot; "
                f"K={self.numbatches_to_aggregate} &middot; {self.device}"
                "<table><tr><th>task</th><th>weight</th><th>linked sets (weight)</th><th>models</th>"
                f"<th>phase</th><th>minibatches</th></tr>{''.join(rows)}</table></div>")


def _clone_tree(obj: Any) -> Any:
    if isinstance(obj, Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: _clone_tree(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clone_tree(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_clone_tree(v) for v in obj)
    return obj
