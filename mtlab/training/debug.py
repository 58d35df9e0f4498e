"""Stepwise debugging: explain the cycle, check accumulation against one big pass, measure how
tasks' gradients conflict, trace each minibatch's contribution and find the first NaN.

Core side: no ipywidgets, matplotlib or IPython here.

Examples:
    >>> print(explain(trainer))  # doctest: +SKIP
    >>> check_equivalence(trainer, "a", [("clean", batch1), ("noisy", batch2)])["max_abs_diff"]  # doctest: +SKIP
    >>> trace = MinibatchTrace().attach(trainer); trainer.step(); trace.frame()  # doctest: +SKIP
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..base.batching import Batch
from ..base.errors import ConfigError
from ..tasks.forward import TaskPlan
from ..core.trainer import Trainer
from ..core.events import ApplyInfo, Event, MinibatchInfo, Payload, ResetInfo, RestoreInfo
from ..core.transforms import Call

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["MinibatchTrace", "check_equivalence", "explain", "find_nonfinite", "gradient_conflict", "next_call"]


# ---------------------------------------------------------------------------------------- explain
def _active_sets(trainer: Trainer, task: str) -> list[str]:
    t = trainer.tasks[task]
    if t.weight <= 0:
        return []
    return [s for s, ls in t.linkedsets.items() if ls.weight > 0]


def next_call(trainer: Trainer) -> str:
    """The call the cycle expects next, with the reason, e.g. ``"normalize(): ..."`` (follows the chain)."""
    calls = trainer.next_calls()
    rounds = trainer.minibatches_per_step
    for name, call in calls.items():
        first = next(iter(trainer.chain.calls()), None)
        if call != Call.PROCESS_MINIBATCH and (call == first or trainer.state(name).position == 0):
            k = rounds[name]
            sets = _active_sets(trainer, name)
            done = trainer.state(name).minibatches
            if sets and done < k * len(sets):
                nxt = sets[done % len(sets)]
                return (f"process_minibatch({name!r}, {nxt!r}): task {name!r} has {done} of the {k * len(sets)} "
                        f"minibatches step() would process (then {call}())")
    pending = {c: [n for n, x in calls.items() if x == c] for c in (*trainer.chain.calls(), Call.APPLY)}
    for call, names in pending.items():
        if not names:
            continue
        if call == Call.APPLY:
            return f"apply(): one optimizer step on Σ_t task_weight_t × grad_t for {names}"
        return f"{call}(): {call_text(trainer, call)} on the gradients of {names}"
    return "step() runs a whole cycle; or process_minibatch(task, linkedset) starts one by hand"


def call_text(trainer: Trainer, call: str) -> str:
    """What one call of the trainer's chain does: each of its transforms and its description."""
    return "; ".join(f"{t!r}: {t.describe()}" for t in trainer.chain.of_call(call))


def explain(trainer: Trainer) -> str:
    """The cycle ``trainer.step()`` runs, each task's current phase, and what the next call will do."""
    k = trainer.numbatches_to_aggregate
    rounds = trainer.minibatches_per_step
    lines = ["mtlab cycle, one trainer.step():", "  1. reset()              discard the last step's accumulators (refused while minibatches "
                                                 "processed by hand wait for apply)"]
    lines.append(f"  2. {k} round(s) of process_minibatch(task, linked set) for every linked set of weight > 0:")
    for name, t in trainer.tasks.items():
        sets = _active_sets(trainer, name)
        desc = ", ".join(f"{s} (w={ls.weight:g})" for s, ls in t.linkedsets.items())
        own = f" ({rounds[name]} rounds: its own)" if rounds[name] != k else ""
        total = f"{rounds[name] * len(sets)} minibatches{own}" if sets else "left out (weight 0)"
        lines.append(f"       {name} (task weight {t.weight:g}): {desc} -> {total}")
    lines.append("     each adds w·loss_sum and w·normalizer to the task's accumulators and backprops w·loss_sum")
    calls = trainer.chain.calls()
    off = [f"{c}() off ({why})" for c, why in ((Call.NORMALIZE, "normalize_gradients=False: gradients stay summed"),
                                              (Call.CLIP, "clip_grad_value=None, clip_grad_norm=None"))
           if c not in calls]
    for i, call in enumerate(calls, 3):
        lines.append(f"  {i}. {call + '()':<21}{call_text(trainer, call)}")
    lines.append(f"  {len(calls) + 3}. apply()              one optimizer step (lr={trainer.lr:g}) on Σ_t task_weight_t × grad_t")
    if off:
        lines.append(f"     (chain {trainer.chain}: {'; '.join(off)})")
    lines.append(f"now: {trainer.step_count} step(s) applied")
    for name in trainer.tasks:
        st = trainer.state(name)
        counts: dict[str, int] = {}
        for r in st.records:
            counts[r.linkedset] = counts.get(r.linkedset, 0) + 1
        detail = ", ".join(f"{s} {n}" for s, n in counts.items())
        extra = f", {st.minibatches} minibatch(es) ({detail})" if st.minibatches else ""
        lines.append(f"  {name}: {st.phase}{extra}")
    lines.append(f"next: {next_call(trainer)}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------- equivalence
def _draw(trainer: Trainer, task: str, linkedset: str) -> Batch:
    """The next minibatch of a linked set's stream, leaving the stream where it was."""
    stream = trainer.stream(task, linkedset)
    saved = stream.state_dict()
    try:
        return next(stream)
    finally:
        stream.load_state_dict(saved)


def check_equivalence(trainer: Trainer, task: str, batches: Sequence[tuple[str, Batch | None]],
                      compare_mean_of_means: bool = True) -> dict[str, Any]:
    """Accumulate ``batches`` (``[(linkedset, batch), ...]``) for ``task`` on a copy of the models,
    and compare with the gradient of ONE plain-autograd pass of Σ w·loss_sum / Σ w·normalizer.

    The trainer is left unchanged (a copy of its models, no events). ``batch=None`` peeks at the
    linked set's next minibatch. Returns ``max_abs_diff`` (overall), ``per_param`` (name ->
    largest absolute difference), both losses, ``ok`` and, with ``compare_mean_of_means``, how far
    the "mean of per-minibatch means" gradient is from the exact one (``mean_of_means_max_abs_diff``).
    """
    t = trainer.task(task)
    if not batches:
        raise ConfigError("check_equivalence(): give at least one (linkedset, batch) pair")
    plan: list[tuple[str, float, Batch]] = []
    for item in batches:
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise ConfigError("check_equivalence(): batches must be [(linkedset, batch), ...]; "
                              f"got an item of type {type(item).__name__}")
        name, batch = item
        ls = trainer.linkedset(task, name)
        plan.append((name, ls.weight, batch if batch is not None else _draw(trainer, task, name)))

    models = copy.deepcopy(dict(trainer.models))  # one deepcopy keeps tied weights tied
    rng_state = torch.get_rng_state()
    seed = int(torch.randint(0, 2**31 - 1, (1,)))
    with torch.random.fork_rng(devices=[trainer.device] if trainer.device.type == "cuda" else []):
        # The copy trainer: same task objects and settings, fresh accumulators, no callbacks.
        twin = Trainer(models, [t], lr=trainer.lr, normalize_gradients=trainer.normalize_gradients,
                       device=trainer.device, seed=trainer.seed, nonfinite="skip")
        torch.manual_seed(seed)
        twin.rng.take_global()  # the copy draws what the oracle below draws
        for name, _, batch in plan:
            twin.process_minibatch(task, name, batch=batch)
        if trainer.normalize_gradients:
            twin.normalize(task)
        st = twin.state(task)
        accumulated = {k: v.detach().clone() for k, v in st.grads.items()}
        trainer_loss = float(st.normalized_loss) if trainer.normalize_gradients else float(st.loss)

        torch.manual_seed(seed)  # same dropout/noise draws, in the same order
        oracle, oracle_loss = _one_pass(models, t, plan, trainer, mean_of_means=False)
        mom = None
        if compare_mean_of_means and trainer.normalize_gradients:
            torch.manual_seed(seed)
            mom, _ = _one_pass(models, t, plan, trainer, mean_of_means=True)
    torch.set_rng_state(rng_state)

    per_param: dict[str, float] = {}
    for name in sorted(set(accumulated) | set(oracle)):
        a, o = accumulated.get(name), oracle.get(name)
        if a is None or o is None:
            present = a if a is not None else o
            per_param[name] = float(present.abs().max()) if present is not None and present.numel() else 0.0
        else:
            per_param[name] = float((a.double() - o.double()).abs().max()) if a.numel() else 0.0
    worst = max(per_param.values(), default=0.0)
    scale = max((float(g.abs().max()) for g in oracle.values() if g.numel()), default=1.0)
    dtype = next(iter(oracle.values())).dtype if oracle else torch.float32
    tol = (1e-9 if dtype == torch.float64 else 1e-5) * max(1.0, scale)
    out: dict[str, Any] = {
        "task": task, "minibatches": len(plan), "max_abs_diff": worst, "per_param": per_param,
        "loss_accumulated": trainer_loss, "loss_one_pass": oracle_loss, "tolerance": tol, "ok": worst <= tol,
    }
    if mom is not None:
        out["mean_of_means_max_abs_diff"] = max(
            (float((mom[k].double() - oracle[k].double()).abs().max()) for k in oracle if k in mom), default=0.0)
    return out


def _one_pass(models: dict[str, torch.nn.Module], t: Any, plan: list[tuple[str, float, Batch]], trainer: Trainer,
              mean_of_means: bool) -> tuple[dict[str, Tensor], float]:
    """Gradient of Σ w·loss / Σ w·normalizer (or of the weighted mean of per-minibatch means) in one pass."""
    plan_ = TaskPlan(t, models, trainer.device)
    for m in models.values():
        m.train(True)
        m.zero_grad(set_to_none=True)
    used = [p for n in plan_.model_names for p in models[n].parameters() if p.requires_grad]
    total: Tensor | float = 0.0
    norm: Tensor | float = 0.0
    with torch.enable_grad():
        for _, w, batch in plan:
            r = plan_.loss(batch)
            loss_sum, n = r.loss_sum, r.normalizer.to(r.loss_sum.dtype)
            if mean_of_means:
                total = total + w * (loss_sum / n)
                norm = norm + w
            else:
                total = total + w * loss_sum
                norm = norm + w * n
        objective = total / norm if (trainer.normalize_gradients or mean_of_means) else total
        assert isinstance(objective, Tensor), "the plan holds at least one minibatch"
        objective.backward()
    names = {id(p): f"{mn}.{pn}" for mn, m in models.items() for pn, p in m.named_parameters()}
    grads = {names[id(p)]: p.grad.detach().clone() for p in dict.fromkeys(used) if p.grad is not None}
    return grads, float(objective.detach())


# ---------------------------------------------------------------------------------------- conflict
def _model_of(param: str) -> str:
    return param.split(".", 1)[0]


def gradient_conflict(trainer: Trainer) -> dict[str, dict[tuple[str, str], float]]:
    """Cosine similarity between tasks' processed gradients on each shared model.

    ``{"enc": {("a", "b"): -0.12}}``: negative means the tasks pull that model in opposite
    directions. Uses ``state(task).grads`` as they are now (after normalize/clip if done);
    pairs where a task has no gradient on the model are left out.
    """
    grads = {name: trainer.state(name).grads for name in trainer.tasks}
    shared_models: dict[str, list[str]] = {}
    for pname in trainer.shared:
        shared_models.setdefault(_model_of(pname), []).append(pname)
    out: dict[str, dict[tuple[str, str], float]] = {}
    for model, pnames in shared_models.items():
        users = [t for t in trainer.tasks if any(p in trainer.task_params[t] for p in pnames)]
        pairs: dict[tuple[str, str], float] = {}
        for i, ti in enumerate(users):
            for tj in users[i + 1:]:
                common = [p for p in pnames if p in grads[ti] and p in grads[tj]]
                if not common:
                    continue
                gi = torch.cat([grads[ti][p].detach().reshape(-1).double() for p in common])
                gj = torch.cat([grads[tj][p].detach().reshape(-1).double() for p in common])
                denom = float(gi.norm() * gj.norm())
                pairs[(ti, tj)] = float(gi @ gj) / denom if denom > 0 else float("nan")
        if pairs:
            out[model] = pairs
    return out


# ---------------------------------------------------------------------------------------- trace
class MinibatchTrace:
    """Per minibatch, each model's gradient contribution (accumulated grads after minus before)
    and its share of the model's accumulated gradient norm.

    Opt in: ``trace = MinibatchTrace().attach(trainer)`` (or ``trainer.add_callback(trace)``).
    It keeps one copy of each task's accumulated gradients while attached, and writes the
    per-model contribution norms into ``MinibatchRecord.trace``. ``frame()`` gives a DataFrame.
    """

    def __init__(self, max_rows: int | None = 100_000) -> None:
        self._prev: dict[str, dict[str, Tensor]] = {}
        self._rows: deque[dict[str, Any]] = deque(maxlen=max_rows)
        self._step = 0
        self.trainer: Trainer | None = None

    def attach(self, trainer: Trainer) -> MinibatchTrace:
        """Register on ``trainer`` (returns self)."""
        self.trainer = trainer
        self._step = trainer.step_count
        trainer.add_callback(self)
        return self

    def detach(self) -> None:
        """Stop tracing and drop the gradient copies."""
        if self.trainer is not None:
            self.trainer.remove_callback(self)
        self._prev = {}

    def clear(self) -> None:
        """Forget the recorded minibatches."""
        self._rows.clear()

    def __call__(self, event: Event, info: Payload) -> None:
        if isinstance(info, ApplyInfo | RestoreInfo):
            self._step = info.step
            if isinstance(info, RestoreInfo):
                self._prev = {}
        elif isinstance(info, ResetInfo):
            if info.task is None:
                self._prev = {}
            else:
                self._prev.pop(info.task, None)
        elif isinstance(info, MinibatchInfo):
            self._on_minibatch(info.task, info.linkedset, info.state)

    def _on_minibatch(self, task: str, linkedset: str, st: Any) -> None:
        grads = st.grads
        # A fresh accumulation (first minibatch after apply/reset) starts from zero.
        prev = self._prev.get(task, {}) if st.minibatches > 1 else {}
        contrib_sq: dict[str, Tensor] = {}
        total_sq: dict[str, Tensor] = {}
        copies: dict[str, Tensor] = {}
        for name, g in grads.items():
            g = g.detach()
            model = _model_of(name)
            before = prev.get(name)
            delta = g if before is None else g - before
            d2 = delta.double().pow(2).sum()
            t2 = g.double().pow(2).sum()
            contrib_sq[model] = contrib_sq[model] + d2 if model in contrib_sq else d2
            total_sq[model] = total_sq[model] + t2 if model in total_sq else t2
            copies[name] = g.clone()
        self._prev[task] = copies
        contrib = {m: v.sqrt() for m, v in contrib_sq.items()}
        if st.records:
            st.records[-1].trace = contrib
        rec = st.records[-1] if st.records else None
        self._rows.append({"step": self._step, "task": task, "linkedset": linkedset, "minibatch": st.minibatches - 1,
                           "weight": None if rec is None else rec.weight,
                           "loss": None if rec is None else rec.loss, "norm": None if rec is None else rec.normalizer,
                           "contrib": contrib, "total": {m: v.sqrt() for m, v in total_sq.items()}})

    def frame(self) -> pd.DataFrame:
        """One row per traced minibatch: ``grad_norm/<model>`` (its contribution) and
        ``share/<model>`` (contribution / norm of the model's accumulated gradient after it)."""
        import pandas as pd

        rows = []
        for r in list(self._rows):
            row = {k: r[k] for k in ("step", "task", "linkedset", "minibatch", "weight")}
            row["loss"] = None if r["loss"] is None else float(r["loss"])
            row["norm"] = None if r["norm"] is None else float(r["norm"])
            for m, c in r["contrib"].items():
                c_f, t_f = float(c), float(r["total"][m])
                row[f"grad_norm/{m}"] = c_f
                row[f"share/{m}"] = c_f / t_f if t_f > 0 else float("nan")
            rows.append(row)
        return pd.DataFrame(rows)

    def __len__(self) -> int:
        return len(self._rows)


# ---------------------------------------------------------------------------------------- non-finite
def _finite(x: Tensor | float | None) -> bool:
    if x is None:
        return True
    return bool(torch.isfinite(torch.as_tensor(x)).all())


def find_nonfinite(trainer: Trainer, task: str | None = None) -> dict[str, Any] | None:
    """Where the first NaN/inf came from: task, linked set, minibatch and model; None if all is finite.

    Looks at each minibatch's recorded loss and norm, then (with a ``MinibatchTrace`` attached
    before the minibatches ran) each minibatch's per-model gradient contribution, then the
    accumulated per-model gradients (pre-clip norms once clipped), then the parameters.
    The result has ``where`` ("loss", "norm", "gradient" or "parameter") and a ``message``.
    """
    names = [task] if task is not None else list(trainer.tasks)
    for name in names:
        st = trainer.state(name)
        model_norms = _model_norms(trainer, name)
        bad_models = [m for m, n in model_norms.items() if not _finite(n)]
        for i, r in enumerate(st.records):
            where = "loss" if not _finite(r.loss) else ("norm" if not _finite(r.normalizer) else None)
            traced = [m for m, v in (r.trace or {}).items() if not _finite(v)]
            if where is None and traced:
                where = "gradient"
            if where is None:
                continue
            model = traced[0] if traced else (bad_models[0] if bad_models else None)
            return {"task": name, "linkedset": r.linkedset, "minibatch": i, "model": model, "where": where,
                    "message": f"task {name!r}: minibatch {i} (linked set {r.linkedset!r}) produced a non-finite "
                               f"{where}" + (f"; model {model!r} has a non-finite gradient" if model else "")}
        if bad_models:
            hint = ("" if any(r.trace for r in st.records) else
                    "; attach mtlab.debug.MinibatchTrace before processing to find the minibatch")
            return {"task": name, "linkedset": None, "minibatch": None, "model": bad_models[0], "where": "gradient",
                    "message": f"task {name!r}: model {bad_models[0]!r} has a non-finite accumulated gradient "
                               f"over {st.minibatches} minibatch(es){hint}"}
    for pname, p in trainer.params.items():
        if task is not None and pname not in trainer.task_params[task]:
            continue
        if not _finite(p.detach()):
            model = _model_of(pname)
            return {"task": task, "linkedset": None, "minibatch": None, "model": model, "where": "parameter",
                    "message": f"parameter {pname!r} of model {model!r} is non-finite (an earlier step applied "
                               "a bad update); restore a snapshot or checkpoint"}
    return None


def _model_norms(trainer: Trainer, task: str) -> dict[str, Tensor]:
    """Per-model gradient norms before clipping (clip() clamps inf to ±clip, so read the record)."""
    st = trainer.state(task)
    if st.grad_norm is not None and st.model_norms:
        return st.model_grad_norms()
    return st.norms()[0] if st.minibatches else {}
