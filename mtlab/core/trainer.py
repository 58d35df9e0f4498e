"""The stepwise multi-task trainer: a thin conductor over the step core's pieces.

One training step, as in the original task trainer, for every task::

    numbatches_to_aggregate x process_minibatch (forward.TaskPlan + accumulator.Accumulator)
      -> the chain's calls: normalize, clip, a user's own (transforms.Chain)  -> apply (update.Update)

Each call is public, checks its phase and leaves every piece of state readable. Summing over minibatches
and dividing once makes the accumulated gradient exactly the gradient of the mean over everything
accumulated, whatever the minibatch lengths. The trainer handles no signals and imports no loop, recipe or
UI: those are built on top of it.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from pathlib import Path
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, overload

import torch
from torch import nn

from . import state as checkpoint
from .accumulator import Accumulator, Phase
from .parallel import Parallel
from ..base.batching import Batch, resolve_device
from ..base.errors import ConfigError, NonFiniteError, PhaseError, ZeroNormalizerError, explain
from ..base.report import trainer_html
from ..base.threads import apply_threads
from .events import (ApplyInfo, EvaluateInfo, Event, Events, Listener, MinibatchInfo, ReinitializeInfo, ResetInfo,
                     RestoreInfo, call_done)
from ..tasks.forward import TaskPlan, eval_mode, parameter_users
from ..tasks.forward import evaluate_totals as plan_totals
from .history import History, knob_values, step_row
from .branch import fork_trainer, restore_journaled
from .journal import Journal, graph_of
from .knobs import Knobs, Rounds
from .noise import NoiseScale
from .precision import Precision, PrecisionSpec, compile_models
from .scope import RunLock, RunRandom, Scope
from ..tasks.sampling import BatchStream, Streams
from ..tasks.sources import ExampleSource
from ..tasks.task import (LinkedSet, Task, applied_weight, check_count, check_linkedset_weights, check_models,
                          check_relative_weights, check_tasks)
from .lrschedule import LrScaler, SchedulerFactory, Schedulers
from .optimizers import OptimizerFactory, trainer_optimizer
from .transforms import IDLE, KEPT, Call, Chain, kept_note, refuse_hand_work  # noqa: F401 (KEPT: mtlab.run's)
from .update import MethodSpec, PerTaskUpdate, Update

if TYPE_CHECKING:
    import pandas as pd

NONFINITE_POLICIES = ("raise", "skip")
NO_CONTEXT = contextlib.nullcontext()  # entered where a context is needed only sometimes (reusable)


class Trainer(Knobs):
    """Multi-task trainer whose step can be run one call at a time.

    Examples:
        >>> trainer = Trainer(models, [task_a, task_b], lr=1e-3, numbatches_to_aggregate=2)  # doctest: +SKIP
        >>> trainer.process_minibatch("a", "noisy"); trainer.normalize()  # doctest: +SKIP
        >>> trainer.clip(); trainer.apply()  # doctest: +SKIP
        >>> trainer.step()  # the whole cycle for every task  # doctest: +SKIP

    The gradient processing between the minibatches and ``apply`` is ``chain`` (``mtlab.Chain``), the user's to
    give: ``Trainer(..., chain=Chain([Normalize(), ClipByValue(1.0), MyTransform()]))``; ``normalize_gradients``
    and the ``clip_grad_*`` keywords are shortcuts that build it (give one or the other).

    ``precision`` ("32", "bf16-mixed", "16-mixed" or ``{"type": ..., **GradScaler options}``) and ``compile``
    are described in ``mtlab.core.precision``. ``optimizer``: ``"adam"`` (torch's Adam, the default),
    ``"adam_tf1"`` (the original's ``tf.train.AdamOptimizer``, ``mtlab.core.optimizers``) or a function
    ``params -> torch.optim.Optimizer``. ``linkedset_weights``: ``"absolute"`` (the default: each linked set's
    weight as given) or ``"relative"`` (divided by the task's first set's weight, as the original).
    ``noise_scale=True`` measures each task's gradient noise scale
    (``mtlab.core.noise``); ``trainer.journal`` records every knob change and call (``mtlab.core.journal``),
    ``mtlab.replay`` reruns it bit for bit and ``fork()`` branches the run.
    """

    def __init__(self, models: Mapping[str, nn.Module], tasks: Sequence[Task] | Task, lr: float | None = None,
                 clip_grad_value: float | None = None, normalize_gradients: bool | None = None,
                 numbatches_to_aggregate: int = 1, device: str | torch.device = "auto", seed: int = 0,
                 nonfinite: str = "raise", adam: Mapping[str, Any] | None = None, acc_steps: bool = False,
                 normalize_weights_acc_steps: bool = False, distributed: bool | None = None,
                 clip_grad_norm: float | None = None, optimizer: str | OptimizerFactory | None = None,
                 combine: MethodSpec = None, clip_grad_percentile: float | None = None,
                 precision: PrecisionSpec | Precision = "32",
                 compile: bool = False, linkedset_weights: str = "absolute", chain: Chain | None = None,
                 noise_scale: bool | NoiseScale = False, scheduler: SchedulerFactory | None = None) -> None:
        # the constructor arguments (less models and tasks): fork() builds a branch with them
        self.build_args = {k: v for k, v in locals().items() if k not in ("self", "models", "tasks", "__class__")}
        self.name = "main"  # a branch made by fork() carries its own
        apply_threads()  # torch's CPU threads from the free CPUs, unless the program set them (mtlab.base.threads)
        check_models(models)
        tasks = check_tasks(tasks)
        check_count(numbatches_to_aggregate, "numbatches_to_aggregate", "minibatch rounds per step")
        if nonfinite not in NONFINITE_POLICIES:
            raise ConfigError(f"nonfinite must be one of {NONFINITE_POLICIES}, got {nonfinite!r}")
        if distributed is True:
            raise ConfigError("for data parallel training build the trainer, then call mtlab.distributed.attach(trainer) "
                              "(recipes and `mtlab train` under torchrun do it for you)")
        self.journal = Journal()  # every knob change and training call, in order (see mtlab.core.journal)
        self._journaling = False  # until the trainer is built: its first settings are not changes
        self.lock = RunLock(self.journal)  # one call at a time (a UI thread may read while a run trains)
        self.depth = 0  # public calls in progress (a step's minibatches are part of the step)
        self.device = resolve_device(device)
        self.rng = RunRandom(self.device)  # the run's own random numbers (mtlab.core.scope)
        self.precision = Precision.build(precision, self.device)  # autocast and, for "16-mixed", the GradScaler
        self.models: dict[str, nn.Module] = {k: m.to(self.device) for k, m in models.items()}
        self.compiled = bool(compile)
        if self.compiled:
            compile_models(self.models)
        self.tasks: dict[str, Task] = {t.name: t for t in tasks}
        self.linkedset_weights = check_linkedset_weights(linkedset_weights)
        if self.linkedset_weights == "relative":
            for t in tasks:
                check_relative_weights(t)
        self.plans: dict[str, TaskPlan] = {t.name: TaskPlan(t, self.models, self.device) for t in tasks}
        self.rounds = Rounds(numbatches_to_aggregate)  # minibatch rounds per step (K): a default, a task's own
        self._cycle_k: dict[str, int] | None = None  # the rounds of the step() in progress (for its history row)
        if chain is None:
            chain = Chain.from_settings(normalize_gradients is not False, clip_grad_value, clip_grad_norm,
                                        clip_grad_percentile)  # checks each
        elif not isinstance(chain, Chain):
            raise ConfigError(f"chain must be a mtlab.Chain, got {type(chain).__name__}; e.g. "
                              "chain=mtlab.Chain([mtlab.Normalize(), mtlab.ClipByValue(1.0)])")
        elif normalize_gradients is not None or (clip_grad_value, clip_grad_norm, clip_grad_percentile) != (None,) * 3:
            raise ConfigError("give either chain= or normalize_gradients / clip_grad_value / clip_grad_norm / "
                              "clip_grad_percentile (shortcuts that build the chain), not both; e.g. "
                              "chain=mtlab.Chain([mtlab.Normalize(), mtlab.ClipByValue(1.0), ...])")
        self.chain: Chain = chain
        self._own_knobs: dict[tuple[str, str | None, str | None], Any] = {}  # knobs of the table kept here
        self.nonfinite = nonfinite
        self.seed = int(seed)
        self.acc_steps, self.normalize_weights_acc_steps = bool(acc_steps), bool(normalize_weights_acc_steps)
        self.step_count = 0
        self.log = History()
        self.events = Events()
        self.atomic = False  # True while apply() changes parameters: a loop defers a hard stop until it is False

        self.params, self.task_params, users = parameter_users(self.models, self.plans)
        self.param_users = users
        self.shared = [n for n, u in users.items() if len(u) > 1]
        self._accs = {t: Accumulator(t, {n: self.params[n] for n in ps}, [n for n in ps if len(users[n]) > 1],
                                     self.device) for t, ps in self.task_params.items()}
        self.adam_options = dict(adam or {})
        self.optimizer_name, factory, named_lr = trainer_optimizer(optimizer, lr, self.adam_options, self.acc_steps)
        self.update: Update | PerTaskUpdate = (
            PerTaskUpdate({t: {n: self.params[n] for n in ps} for t, ps in self.task_params.items()}, users,
                          factory, self.normalize_weights_acc_steps) if self.acc_steps
            else Update({n: self.params[n] for n in users}, users, factory, combine, seed=self.seed))
        if self.acc_steps:
            self.update.set_method(combine)  # refuses any method but the sum: one optimizer per task
            self.lr_scaler = LrScaler([], own=named_lr)  # lr × task weight per task's optimizer, as the original
        else:
            self.lr_scaler = LrScaler([self.update.optimizer])
        self.schedule = Schedulers(self, scheduler)  # a torch LR scheduler of the user's, stepped once per apply()
        self.streams = Streams(self.seed, pin_memory=self.device.type == "cuda", device=self.device)
        self.parallel = Parallel(self.streams, local_only=distributed is False)  # rank, shard, agreement, reduction
        self._training_mode: bool | None = None
        # the run's root: what reinitialize() goes back to (CPU copies); a fork carries its parent's
        self.root = checkpoint.initial_state(self)
        self.noise_scale = noise_scale  # None unless asked for (the setter checks it)
        self.journal.header["graph"] = graph_of(self)
        self._journaling = True

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        """The optimizer over every parameter (None with ``acc_steps``: one per task)."""
        return self.update.optimizer

    @property
    def task_optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """Task -> its own optimizer with ``acc_steps``; empty otherwise."""
        return self.update.optimizers if isinstance(self.update, PerTaskUpdate) else {}

    def weights(self) -> dict[str, float]:
        """Every task weight (``"a"``) and linked-set weight (``"a/clean"``)."""
        return {k: v for n, t in self.tasks.items()
                for k, v in [(n, t.weight), *((f"{n}/{s}", ls.weight) for s, ls in t.linkedsets.items())]}

    # ------------------------------------------------------------------ lookups
    def task(self, task: str) -> Task:
        """The task named ``task``, or a ConfigError listing the tasks."""
        if task not in self.tasks:
            raise ConfigError(f"unknown task {task!r}; tasks: {list(self.tasks)}")
        return self.tasks[task]

    def linkedset(self, task: str, linkedset: str) -> LinkedSet:
        """A task's linked set, or a ConfigError listing its linked sets."""
        t = self.task(task)
        if linkedset not in t.linkedsets:
            raise ConfigError(f"task {task!r} has no linked set {linkedset!r}; linked sets: {list(t.linkedsets)}")
        return t.linkedsets[linkedset]

    def reinitialize(self) -> None:
        """Back to the run's root, the state it was built in: the same initial parameters, a fresh optimizer state,
        empty accumulators, data streams, noise scale and random numbers as right after ``Trainer(...)``, step 0
        (on a fork too: a branch's root is its parent's). The knobs stay as set
        (weights, lr, clipping, combine method, minibatches per step, batch sizes); the history rows so far are
        kept as an abandoned branch in ``trainer.log.branches``. Unlike ``reset()``, which only discards the
        accumulation in progress."""
        with self.lock:
            before = self.step_count
            self.journal.begin(self)
            with self.journal.lock, self.journal.quiet():
                # they stay as set (the optimizer's initial state holds the initial lrs); a scheduler starts again
                knobs = [k for k in self.knobs() if k["name"] != "lr" or self.schedule.scheduler is None]
                checkpoint.load_initial_state(self, self.root)
                self.load_knobs(knobs, announce=False)
            self.log.abandon(0)
            self.step_count = 0
            self.record_change("reinitialize", from_step=before)
            self.events.emit(Event.REINITIALIZE, ReinitializeInfo(step=0, from_step=before))

    def state(self, task: str) -> Accumulator:
        """The live accumulation state of ``task`` (phase, loss, normalizer, grads, records, norms)."""
        self.task(task)
        return self._accs[task]

    def stream(self, task: str, linkedset: str) -> BatchStream:
        """The endless minibatch stream of a linked set (created on first use)."""
        self.linkedset(task, linkedset)
        return self.streams.get_stream(self.tasks[task], linkedset)

    def add_callback(self, fn: Listener) -> None:
        """Call ``fn(event, info)`` after each minibatch, normalize, clip, apply, reset and weight change."""
        self.events.subscribe(fn)

    def remove_callback(self, fn: Listener) -> None:
        """Stop calling ``fn`` on the trainer's events."""
        self.events.unsubscribe(fn)

    @property
    def callbacks(self) -> list[Listener]:
        """The listeners, in call order (``events.listeners``)."""
        return self.events.listeners

    # ------------------------------------------------------------------ the stepwise API
    def reset(self, task: str | None = None) -> None:
        """Discard what ``task`` (default: every task) accumulated; its phase becomes ``empty``."""
        with Scope(self, "reset", {"task": task}):
            if task is None:
                for acc in self._accs.values():
                    acc.reset()
                self.journal.applied()
            else:
                self.task(task)
                self._accs[task].reset()
            if self._noise_scale is not None:
                self._noise_scale.discard(task)
            if self.events.listeners:  # no payload to build for nobody
                self.events.emit(Event.RESET, ResetInfo(task=task))

    def _set_mode(self, training: bool) -> None:
        if self._training_mode is training:  # per minibatch: a plain loop, no generator
            for m in self.models.values():
                if m.training != training:
                    break
            else:
                return
        for m in self.models.values():
            m.train(training)
        self._training_mode = training

    def process_minibatch(self, task: str, linkedset: str, batch: Batch | None = None) -> Accumulator:
        """Forward, weighted loss, backward, and add into ``task``'s accumulator.

        Draws the next minibatch of the linked set's stream unless ``batch=(data, seq_lengths)`` is given.
        Both the summed loss and the normalizer are multiplied by the linked set's weight. A failure before the
        backward changes nothing; one during the backward discards the task's accumulation (it cannot be
        half-kept) and says so.
        """
        with Scope(self, "minibatch", {"task": task, "linkedset": linkedset} if batch is None else
                   {"task": task, "linkedset": linkedset, "batch": "explicit"}):
            t = self.tasks.get(task)
            if t is None or linkedset not in t.linkedsets:
                t = self.task(task)
                self.linkedset(task, linkedset)  # raises, naming the tasks or linked sets there are
            acc = self._accs[task]
            if acc.position > 0 and acc.phase is not Phase.APPLIED:
                raise PhaseError(f"task {task!r} is {acc.phase}; call apply() to finish this step "
                                 f"(or reset({task!r}) to discard it) before processing more minibatches")
            with self.journal.lock:
                self.journal.read("minibatch")
                # read once: a slider may move it (the relative mode's division: applied_weight)
                weight = t.linkedsets[linkedset].weight if self.linkedset_weights == "absolute" else \
                    applied_weight(t, linkedset, self.linkedset_weights)
            stream_state = None
            if batch is None:
                stream = self.streams.get_stream(t, linkedset)
                stream_state = (stream.epoch, stream.position)
                batch = next(stream)
            try:
                self._set_mode(True)
                # under "32" with gradients on (the usual case) no context to enter: this runs per minibatch
                grad_off = not torch.is_grad_enabled()
                with torch.enable_grad() if grad_off else NO_CONTEXT:
                    if self.precision.dtype is None:
                        result = self.plans[task].loss(batch, require_grad=True)
                    else:
                        with self.precision.autocast():
                            result = self.plans[task].loss(batch, require_grad=True)
                    acc.begin()
                    noise = self._noise_scale
                    if noise is not None:
                        noise.before_backward(acc)
                    try:
                        loss = result.loss_sum if weight == 1.0 else result.loss_sum * weight
                        (loss if self.precision.scaler is None else self.precision.scale(loss)).backward()
                    except BaseException as exc:
                        acc.reset()
                        if noise is not None:
                            noise.discard(task)
                        exc.add_note(f"mtlab: the backward of task {task!r} did not finish; its accumulation "
                                     "was discarded (phase empty) and the data position restored")
                        raise
                    finally:
                        acc.end()
                acc.record(linkedset, result.num_examples, weight, result.loss_sum, result.normalizer)
                if noise is not None:
                    noise.after_record(acc)
            except BaseException:
                if stream_state is not None:
                    self.streams[(task, linkedset)].seek(*stream_state)
                raise
            if self.events.listeners:
                self.events.emit(Event.MINIBATCH, MinibatchInfo(task=task, linkedset=linkedset, state=acc))
            return acc

    def call(self, name: str, task: str | None = None) -> None:
        """Run the chain's call ``name`` (``"normalize"``, ``"clip"``, a user transform's) on ``task``'s
        accumulator (default: every task due for it); ``"apply"`` is ``apply()``. Refused, naming the call that
        should come first, when a task is not due for it."""
        if name == Call.APPLY and task is None:
            return self.apply()
        name = str(name)
        with Scope(self, name, {"task": task}):
            with self.journal.lock:
                self.journal.read(name)
            chain = self.chain
            reduces = name == chain.reduces_at
            accs = self.parallel.enter(name, task, self._accs, chain, reduces)  # agree, choose, sum over ranks
            if reduces:
                self._after_reduce(accs)
            events = self.events
            for n, acc in accs.items():
                chain.run(name, acc)
                if events.listeners:
                    events.emit(*call_done(name, n, acc))

    def _after_reduce(self, accs: Mapping[str, Accumulator]) -> None:
        """Once per task and step, where the ranks summed: unscale 16-mixed gradients, refuse a zero normalizer."""
        if self.precision.scaling:
            for acc in accs.values():
                self.precision.unscale_(acc.buffers)
        if self.nonfinite == "raise" and self.chain.normalizes:
            # Host read (a sync point), only under "raise"; "skip" stays sync-free and apply() drops the step.
            normalizers = [a.totals[1] for a in accs.values()]
            values = [normalizers[0].item()] if len(normalizers) == 1 else torch.stack(normalizers).tolist()
            zero = [n for n, v in zip(accs, values) if v == 0.0]
            if zero:
                raise ZeroNormalizerError(f"normalize(): task {zero[0]!r} accumulated a normalizer of 0 (all its minibatches had "
                                    "weight 0 or no valid frames); process minibatches with a positive weight or reset()")

    def normalize(self, task: str | None = None) -> None:
        """Divide ``task``'s (default: every task that needs it) gradients by its accumulated normalizer, once."""
        self.call(Call.NORMALIZE, task)

    def clip(self, task: str | None = None) -> None:
        """Clip each task's gradients (by value and/or global norm); records norms before and after."""
        self.call(Call.CLIP, task)

    def apply(self) -> None:
        """One optimizer step with each parameter's direction Σ_t task_weight_t × processed_grad_t.

        Covers every task that accumulated something; refuses (changing nothing) while one of them still needs
        normalize() or clip(), when every such task has weight 0, and, under ``nonfinite="raise"``, when a
        loss or gradient is not finite. The tasks' gradients are read, never changed.
        """
        with Scope(self, "apply", {}):
            with self.journal.lock:
                self.journal.read("apply")
                lr = self.lr_scaler.read()  # what the optimizer's param groups hold now
                group_lrs = self.lr_scaler.group_lrs()
                shown = knob_values(self.tasks)  # read once: a slider may move them; the row shows these
            chain = self.chain
            reduces = chain.reduces_at == Call.APPLY  # no transform in the chain: the ranks sum here
            chosen = self.parallel.enter(Call.APPLY, None, self._accs, chain, reduces)
            names = list(chosen)
            weights = {n: shown[n][0] for n in names}
            for w in weights.values():
                if w > 0:
                    break
            else:
                raise ConfigError(f"apply(): every task that accumulated ({names}) has weight 0, so there is nothing "
                                  "to apply; raise a task weight or reset()")
            if reduces:
                self._after_reduce(chosen)
            accs = list(chosen.values())
            for acc in accs:
                acc.finish_stats()
            finite = [acc.finite() for acc in accs]
            if len(finite) == 1:  # one task: its own verdict, no stack
                bad_each = found_inf = ~finite[0]
            else:
                bad_each = ~torch.stack(finite)
                found_inf = bad_each.any()
            if self.precision.scaling:  # an fp16 gradient overflow is the scaler's to handle: skip, back off
                bad_each = ~torch.stack([torch.isfinite(acc.loss) for acc in accs])
            # sync point: "raise" must know before stepping
            if self.nonfinite == "raise" and bool(found_inf if bad_each is found_inf else bad_each.any()):
                reasons = [self._accs[n].nonfinite_reason() for n, bad in zip(names, bad_each.reshape(-1).tolist())
                           if bad]
                raise NonFiniteError("apply(): refused, parameters and optimizer untouched: " + "; ".join(reasons) +
                                     ". reset() and go on, or use Trainer(nonfinite='skip') to drop such steps")
            self.atomic = True
            try:
                skip = self.nonfinite == "skip" or self.precision.scaling
                self.update.step(self._accs, weights, lr, found_inf if skip else None)
                self.schedule.step(lambda: float(sum(acc.normalized_loss for acc in accs)))
                for acc in accs:
                    acc.mark_applied()
                self.step_count += 1
                noise_cols: dict[str, Any] = {}
                noise = self._noise_scale
                if noise is not None and self.parallel.world_size == 1:  # per-minibatch sizes are local
                    for acc in accs:
                        noise_cols.update(noise.after_apply(acc, chain.normalizes, found_inf))
                self.journal.minibatch = 0  # the next minibatch is the first of a new step
                row = step_row(self.step_count, lr, found_inf, shown, chosen,
                               {**self.update.stats, **(self.precision.update(found_inf) if self.precision.scaling
                                                        else {}), **noise_cols,
                                **({f"lr/{i}": v for i, v in enumerate(group_lrs)}
                                   if len(set(group_lrs)) > 1 else {})},
                               self._cycle_k or self.minibatches_per_step)
                self.log.append(row)
            finally:
                self.atomic = False
            if self.events.listeners:
                self.events.emit(Event.APPLY, ApplyInfo(tasks=names, step=self.step_count, row=row))

    def active_tasks(self) -> dict[str, list[str]]:
        """Task -> linked sets that step() would draw from (weights > 0)."""
        out = {n: [s for s, ls in t.linkedsets.items() if ls.weight > 0] for n, t in self.tasks.items() if t.weight > 0}
        return {n: sets for n, sets in out.items() if sets}

    def step(self) -> dict[str, Accumulator]:
        """The whole cycle: reset, ``numbatches_to_aggregate`` rounds of every (task, linked set), then the
        chain's calls (normalize, clip) and apply. Linked sets and tasks of weight 0 are left out.

        Refused (nothing changed) while a task holds minibatches processed by hand. A refusal inside the cycle
        leaves the trainer where the same calls by hand would: the minibatches drawn so far stay accumulated
        for inspection (the error says so), parameters and optimizer untouched; ``reset()`` discards them."""
        with Scope(self, "step", {}):
            with self.journal.lock:
                self.journal.read("step")
                active = self.active_tasks()
                rounds = self.minibatches_per_step  # read once: a knob may move them during the step
            if not active:
                raise ConfigError("step(): every task (or every linked set) has weight 0; raise a weight first")
            refuse_hand_work(self._accs, self.chain)
            self.reset()
            before = self.step_count
            self._cycle_k = rounds
            try:
                for name, sets in active.items():
                    for _ in range(rounds[name]):
                        for s in sets:
                            self.process_minibatch(name, s)
                with self.parallel.one_agreement(self._accs, self.chain):
                    self.finish()
            except BaseException as exc:
                if self.step_count == before:
                    explain(exc, kept_note(self._accs))  # in str(exc) of mtlab's errors: the status lines show it
                raise
            finally:
                self._cycle_k = None
            return {n: self._accs[n] for n in active}

    def finish(self) -> list[str]:
        """Complete the accumulation in progress: each call of the chain still due (normalize, clip), then apply.

        For minibatches processed by hand as for ``step()``'s own; returns the calls it made. Refuses, changing
        nothing, when nothing is accumulated.
        """
        with Scope(self, "finish", {}):
            accs, chain, made = self._accs.values(), self.chain, []
            if not [a for a in accs if a.phase not in IDLE]:
                raise PhaseError("finish(): nothing accumulated; call process_minibatch(task, linkedset) first (or step())")
            for call in chain.calls():
                if call in [chain.next_call(a) for a in accs]:
                    self.call(call)
                    made.append(call)
            self.apply()
            return [*made, str(Call.APPLY)]

    @property
    def history(self) -> pd.DataFrame:
        """One row per applied step (reads the device once for rows not yet read)."""
        return self.log.frame()

    def phase(self) -> dict[str, Phase]:
        """Task -> where it stands in the cycle (``empty``, ``accumulating``, ...)."""
        return {n: a.phase for n, a in self._accs.items()}

    def next_calls(self) -> dict[str, str]:
        """Task -> the call it needs next (from the chain)."""
        return {n: self.chain.next_call(a) for n, a in self._accs.items()}

    # ------------------------------------------------------------------ evaluation
    @overload
    def evaluate(self, task: str, linkedset: str, num_batches: int | None = None,
                 examples: ExampleSource | None = None, totals: Literal[False] = False) -> float: ...

    @overload
    def evaluate(self, task: str, linkedset: str, num_batches: int | None = None,
                 examples: ExampleSource | None = None, *, totals: Literal[True]) -> tuple[float, float]: ...

    def evaluate(self, task: str, linkedset: str, num_batches: int | None = None,
                 examples: ExampleSource | None = None, totals: bool = False) -> float | tuple[float, float]:
        """Σloss/Σnormalizer over the linked set's held-out examples (``valid``, else its training examples, or
        ``examples=``), in eval mode, without gradients; accumulators untouched; NaN when Σnormalizer is 0.
        ``totals=True`` is deprecated: use ``evaluate_totals``."""
        if totals:
            warnings.warn("evaluate(..., totals=True) is deprecated and will be removed in the next release; "
                          "use trainer.evaluate_totals(task, linkedset, ...) for (Σloss, Σnormalizer)",
                          DeprecationWarning, stacklevel=2)
            return self.evaluate_totals(task, linkedset, num_batches, examples)
        loss_sum, normalizer = self.evaluate_totals(task, linkedset, num_batches, examples)
        return loss_sum / normalizer if normalizer != 0 else float("nan")

    def evaluate_totals(self, task: str, linkedset: str, num_batches: int | None = None,
                        examples: ExampleSource | None = None) -> tuple[float, float]:
        """``(Σloss, Σnormalizer)`` over the examples ``evaluate`` reads, for pooling several linked sets
        exactly (``Σ_i loss_i / Σ_i normalizer_i``, not a mean of means)."""
        with self.lock:
            t, ls = self.task(task), self.linkedset(task, linkedset)
            source = examples if examples is not None else (ls.valid if ls.valid is not None else ls.examples)
            if source is None:
                raise ConfigError(f"evaluate(): linked set {linkedset!r} of task {task!r} has no examples; pass examples=")
            with eval_mode(self.models), self.precision.autocast():
                loss_sum, normalizer = plan_totals(self.plans[task], source, t.batch_size, num_batches)
            self._training_mode = None
            value = loss_sum / normalizer if normalizer != 0 else float("nan")
            self.events.emit(Event.EVALUATE, EvaluateInfo(task=task, linkedset=linkedset, loss=value, step=self.step_count))
            return loss_sum, normalizer

    # ------------------------------------------------------------------ state you can keep
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly: weights, optimizer, accumulators, data positions, RNG,
        step, settings, weights, journal and history, as a copy in plain containers (loadable with
        ``weights_only=True``): keep it to undo with ``load_state_dict`` later."""
        with self.lock:
            return checkpoint.trainer_state(self)

    def load_state_dict(self, state: Mapping[str, Any], history: bool = True) -> None:
        """Restore a ``state_dict()``: the trainer continues exactly where that state was taken."""
        with self.lock:
            self._restore(state, history=history)
            self.events.emit(Event.RESTORE, RestoreInfo(step=self.step_count))

    def save(self, path: str | os.PathLike[str], extra: Mapping[str, Any] | None = None) -> Path | None:
        """Write a checkpoint atomically; returns its path, or None on a data-parallel rank other than 0
        (which says so in the log: rank 0 writes for everyone)."""
        return checkpoint.save_trainer(self.state_dict(), path, rank=self.parallel.rank, extra=extra)

    def load_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Load a checkpoint written by ``save`` into this trainer (never unpickles objects)."""
        state = checkpoint.load_safe(path)
        with self.lock:
            self._restore(state, source=f"checkpoint {path}")  # names the file if refused
            self.events.emit(Event.RESTORE, RestoreInfo(step=self.step_count))

    def _restore(self, state: Mapping[str, Any], history: bool = True, source: str = "the state") -> None:
        restore_journaled(self, state, history, source)

    def fork(self, name: str, state: Mapping[str, Any] | None = None) -> Trainer:
        """A named branch: a new trainer with copies of the models and everything ``state_dict()`` holds (or
        ``state``, a snapshot taken earlier), sharing the data, that trains on independently. Both journals
        record the fork; the branch's journal continues this one's, so ``mtlab.replay`` rebuilds it.

        >>> lower = trainer.fork("lower-lr"); lower.lr = 1e-4  # doctest: +SKIP
        >>> mtlab.run(lower, steps=100)  # doctest: +SKIP
        """
        return fork_trainer(self, name, state)

    # ------------------------------------------------------------------ introspection
    def __repr__(self) -> str:
        return (f"Trainer(tasks={list(self.tasks)}, models={list(self.models)}, step={self.step_count}, "
                f"phase={ {k: str(v) for k, v in self.phase().items()} }, chain={self.chain}, device={self.device})")

    def _repr_html_(self) -> str:
        """The trainer as an HTML table: step, lr, chain, K, and per task its weights, models, phase and minibatches."""
        return trainer_html(self)
