"""Checked exercises: functions a teacher calls in a notebook cell to grade what a student did.

Each check returns a :class:`CheckResult`: truthy when passed, with ``.passed``, ``.message`` (what was
measured, and on failure what to change) and ``.details`` (the numbers), so a grader (nbgrader's
``assert check``, otter-grader's tests) and a reader both get a plain answer.

>>> from mtlab import exercises
>>> exercises.accumulation_matches_one_pass(lambda sums, norms: sum(sums) / sum(norms))
PASS accumulation matches one pass: ...
>>> puzzle = exercises.plant_nan(trainer, seed=3)  # doctest: +SKIP
>>> exercises.found_planted_nan(puzzle, {"task": "tag", "linkedset": "noisy", "minibatch": 1})  # doctest: +SKIP

The core module: torch and mtlab only, no widgets (``mtlab.exercises`` loads it).
"""

from __future__ import annotations

import copy
import html
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ..base.errors import ConfigError, NonFiniteError
from ..core.accumulator import Phase
from ..core.trainer import Trainer


@dataclass(frozen=True)
class CheckResult:
    """The verdict of one check: ``bool(result)`` is ``result.passed``."""

    name: str
    passed: bool
    message: str
    details: dict[str, Any] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.passed

    def __repr__(self) -> str:
        return f"{'PASS' if self.passed else 'FAIL'} {self.name}: {self.message}"

    def _repr_html_(self) -> str:
        colour = "#1a7f37" if self.passed else "#b42318"
        return (f"<div style='border-left:4px solid {colour};padding:2px 8px'><b style='color:{colour}'>"
                f"{'PASS' if self.passed else 'FAIL'}</b> {html.escape(self.name)}: {html.escape(self.message)}</div>")


# ------------------------------------------------------------------------------- the arguments' checks
def _trainer(trainer: Any, call: str) -> Trainer:
    if not isinstance(trainer, Trainer):
        raise ConfigError(f"{call}: trainer must be an mtlab.Trainer, got {type(trainer).__name__}")
    return trainer


def _count(value: Any, name: str, call: str, least: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(f"{call}: {name} must be a whole number >= {least}, got {value!r}")
    return value


def _positive(value: Any, name: str, call: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise ConfigError(f"{call}: {name} must be a positive number, got {value!r}")
    return float(value)


def _names(value: Any, name: str, call: str) -> list[str]:
    if isinstance(value, str) or not isinstance(value, Sequence) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{call}: {name} must be a list of task names, e.g. ['a', 'b'], got {value!r}")
    return list(value)


# ------------------------------------------------------------------------------- sum, then divide once
def _frames(lengths: Sequence[int], seed: int) -> tuple[torch.nn.Linear, list[tuple[Tensor, Tensor]]]:
    """A float64 linear classifier and one minibatch of ``n`` frames (inputs, labels) per length."""
    g = torch.Generator().manual_seed(seed)
    model = torch.nn.Linear(4, 3).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64))
    batches = [(torch.randn(n, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (n,), generator=g))
               for n in lengths]
    return model, batches


def _grad(model: torch.nn.Linear, loss: Tensor) -> Tensor:
    grads = torch.autograd.grad(loss, list(model.parameters()), retain_graph=True, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1)
                      for g, p in zip(grads, model.parameters())])


def accumulation_matches_one_pass(reduce: Callable[[list[Tensor], list[Tensor]], Tensor],
                                  lengths: Sequence[int] = (6, 100), seed: int = 0) -> CheckResult:
    """Does ``reduce(loss_sums, norms)`` give the step's loss whose gradient equals ONE pass over every frame?

    ``loss_sums[k]`` is minibatch k's summed cross-entropy and ``norms[k]`` its number of frames, for
    minibatches of ``lengths`` frames. The exact step loss is the mean over all frames of the step; the
    classic wrong answer, the mean of per-minibatch means, weighs the frames of short minibatches more."""
    if not callable(reduce):
        raise ConfigError("accumulation_matches_one_pass(reduce): give a function reduce(loss_sums, norms) -> loss, "
                          "e.g. lambda sums, norms: ...")
    call = "accumulation_matches_one_pass()"
    if (isinstance(lengths, str) or not isinstance(lengths, Sequence) or len(lengths) < 2
            or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in lengths)):
        raise ConfigError(f"{call}: lengths must list at least two positive frame counts, e.g. (6, 100), got "
                          f"{lengths!r}")
    _count(seed, "seed", call)
    model, batches = _frames(list(lengths), seed)
    ce = torch.nn.functional.cross_entropy
    exact = _grad(model, ce(model(torch.cat([x for x, _ in batches])), torch.cat([y for _, y in batches])))
    sums = [ce(model(x), y, reduction="sum") for x, y in batches]
    norms = [torch.tensor(float(len(y)), dtype=torch.float64) for _, y in batches]
    loss = reduce(sums, norms)
    if not isinstance(loss, Tensor) or loss.numel() != 1 or not loss.requires_grad:
        return CheckResult("accumulation matches one pass", False,
                           "reduce(loss_sums, norms) must return one scalar tensor computed from loss_sums "
                           f"(got {type(loss).__name__}{'' if not isinstance(loss, Tensor) else ' of shape ' + str(tuple(loss.shape))})",
                           {})
    got = _grad(model, loss.reshape(()))
    diff = float((got - exact).abs().max())
    tol = 1e-9 * max(1.0, float(exact.abs().max()))
    mean_of_means = _grad(model, torch.stack([s / n for s, n in zip(sums, norms)]).sum() / len(sums))
    details = {"max_abs_diff": diff, "tolerance": tol, "lengths": list(lengths),
               "mean_of_means_max_abs_diff": float((mean_of_means - exact).abs().max())}
    if diff <= tol:
        return CheckResult("accumulation matches one pass", True,
                           f"max |grad - exact| = {diff:.2g} (rounding): every frame counts once, whatever the "
                           "minibatch lengths", details)
    if float((got - mean_of_means).abs().max()) <= tol:
        hint = ("that is the mean of per-minibatch means: a frame of the short minibatch counts "
                f"{max(lengths) / min(lengths):.0f}x a frame of the long one; add the loss sums up and divide once by "
                "the summed norms")
    else:
        ratio = float(got.norm() / exact.norm()) if float(exact.norm()) > 0 else float("nan")
        hint = (f"the gradient is {ratio:.3g}x the exact one in size" if abs(float(
            torch.nn.functional.cosine_similarity(got, exact, dim=0)) - 1) < 1e-9 else "it points elsewhere") + \
            "; the exact loss is the sum of every loss sum divided by the sum of every norm"
        details["norm_ratio"] = ratio
    return CheckResult("accumulation matches one pass", False, f"max |grad - exact| = {diff:.3g}: {hint}", details)


# ------------------------------------------------------------------------------- task weights and norms
def _peek(trainer: Trainer, task: str, linkedset: str, count: int) -> list[Any]:
    """The next ``count`` minibatches of a linked set's stream, leaving the stream where it was."""
    stream = trainer.stream(task, linkedset)
    saved = stream.state_dict()
    try:
        return [next(stream) for _ in range(count)]
    finally:
        stream.load_state_dict(saved)


def weighted_gradient_norms(trainer: Trainer, tasks: Sequence[str] | None = None, rounds: int = 1
                            ) -> dict[str, float]:
    """``task weight × ‖normalized gradient‖`` on the shared parameters for each task, from ``rounds`` rounds
    of the next minibatches of each active linked set (what the next step would draw), computed on a copy:
    the trainer, its streams and its models are left unchanged."""
    call = "weighted_gradient_norms()"
    _trainer(trainer, call)
    _count(rounds, "rounds", call, least=1)
    names = _names(tasks, "tasks", call) if tasks is not None else list(trainer.tasks)
    unknown = [t for t in names if t not in trainer.tasks]
    if unknown:
        raise ConfigError(f"no task {unknown}; tasks: {sorted(trainer.tasks)}")
    shared = list(trainer.shared)
    if not shared:
        raise ConfigError("the tasks share no parameters: there is no shared gradient to compare")
    models = copy.deepcopy(dict(trainer.models))
    twin = Trainer(models, [trainer.task(t) for t in names], lr=trainer.lr, device=trainer.device,
                   seed=trainer.seed, nonfinite="skip")
    out: dict[str, float] = {}
    with torch.random.fork_rng(devices=[trainer.device] if trainer.device.type == "cuda" else []):
        for t in names:
            sets = [s for s, ls in trainer.task(t).linkedsets.items() if ls.weight > 0]
            if not sets:
                raise ConfigError(f"task {t!r}: every linked set has weight 0; raise one to compare its gradient")
            drawn = {s: _peek(trainer, t, s, rounds) for s in sets}
            for k in range(rounds):
                for s in sets:
                    twin.process_minibatch(t, s, batch=drawn[s][k])
            twin.normalize(t)
            grads = twin.state(t).grads
            flat = torch.cat([grads[p].detach().reshape(-1).double() for p in shared if p in grads])
            out[t] = float(trainer.task(t).weight) * float(flat.norm())
    return out


def gradient_norm_ratio(trainer: Trainer, task_a: str, task_b: str, ratio: float = 0.5,
                        rtol: float = 0.05) -> CheckResult:
    """Are the task weights set so that ``task_b``'s weighted gradient on the shared parameters is ``ratio``
    times ``task_a``'s (within ``rtol``, relative)? Measured on the next step's minibatches, on a copy."""
    call = "gradient_norm_ratio()"
    _trainer(trainer, call)
    _names([task_a, task_b], "task_a and task_b", call)
    _positive(ratio, "ratio", call)
    _positive(rtol, "rtol", call)
    norms = weighted_gradient_norms(trainer, [task_a, task_b])
    a, b = norms[task_a], norms[task_b]
    got = b / a if a > 0 else float("inf")
    details = {"norm_a": a, "norm_b": b, "ratio": got, "target": ratio, "rtol": rtol,
               "weight_a": trainer.task(task_a).weight, "weight_b": trainer.task(task_b).weight}
    name = f"gradient norm of {task_b} = {ratio:g} x {task_a}"
    if abs(got / ratio - 1) <= rtol:
        return CheckResult(name, True, f"‖{task_b}‖ / ‖{task_a}‖ = {got:.3f} (weighted, on the shared parameters)",
                           details)
    wb = trainer.task(task_b).weight
    if b > 0 and wb > 0:
        want = wb * ratio * a / b
        details["suggested_weight_b"] = want
        hint = f"with {task_a}'s weight kept, a weight of about {want:.3g} for {task_b} would do (now {wb:g})"
    else:
        hint = f"{task_b} contributes no gradient: give it a positive weight"
    return CheckResult(name, False, f"‖{task_b}‖ / ‖{task_a}‖ = {got:.3f}, want {ratio:g} ± {rtol:.0%}; {hint}",
                       details)


# ------------------------------------------------------------------------------- the planted NaN
@dataclass
class PlantedNaN:
    """A step's accumulation with one poisoned minibatch; the answer stays inside (``repr`` hides it)."""

    task: str
    linkedset: str
    minibatch: int
    batches: list[Any] = field(repr=False)

    def __repr__(self) -> str:
        return (f"PlantedNaN: {len(self.batches)} minibatches processed, one of them carries a NaN; "
                "find which (task, linked set, minibatch) and check with exercises.found_planted_nan(puzzle, answer)")


def _poison(batch: Any, rng: random.Random) -> Any:
    """A copy of ``batch`` with one NaN in its first floating-point input."""
    data, lengths = batch
    data = dict(data)
    for key, value in data.items():
        if isinstance(value, Tensor) and value.is_floating_point() and value.numel():
            value = value.clone()
            flat = value.view(-1)
            flat[rng.randrange(flat.numel())] = float("nan")
            data[key] = value
            return data, lengths
    raise ConfigError("plant_nan(): the minibatch has no floating-point input to poison")


def plant_nan(trainer: Trainer, seed: int = 0, minibatches: int = 4) -> PlantedNaN:
    """Process ``minibatches`` minibatches by hand (round robin over the active (task, linked set) pairs),
    one of them, chosen by ``seed``, with a NaN in its input; the trainer is left accumulating (the student
    calls ``normalize``/``clip``/``apply`` or ``mtlab.debug.find_nonfinite``; ``reset()`` discards it)."""
    _trainer(trainer, "plant_nan()")
    _count(seed, "seed", "plant_nan()")
    _count(minibatches, "minibatches", "plant_nan()", least=2)  # one to hide among others
    pairs = [(t, s) for t, sets in trainer.active_tasks().items() for s in sets]
    if not pairs:
        raise ConfigError("plant_nan(): every task or linked set has weight 0; raise a weight first")
    busy = [t for t in trainer.tasks if trainer.state(t).phase not in (Phase.EMPTY, Phase.APPLIED)]
    if busy:  # a step applied (phase "applied") holds nothing of the next one
        raise ConfigError(f"plant_nan(): a task already holds part of a step ({', '.join(busy)}); call "
                          "trainer.reset() or finish the step first")
    rng = random.Random(seed)
    bad = rng.randrange(minibatches)
    order = [pairs[i % len(pairs)] for i in range(minibatches)]
    answer: tuple[str, str, int] | None = None
    batches = []
    for i, (t, s) in enumerate(order):
        batch = next(trainer.stream(t, s))
        if i == bad:
            batch = _poison(batch, rng)
            acc = trainer.state(t)  # a step applied before: this minibatch begins a fresh accumulation
            answer = (t, s, 0 if acc.phase in (Phase.EMPTY, Phase.APPLIED) else acc.minibatches)
        batches.append(batch)
        try:
            trainer.process_minibatch(t, s, batch=batch)
        except NonFiniteError:
            pass  # a trainer that refuses NaN at once keeps the record: the search still works
    assert answer is not None
    return PlantedNaN(answer[0], answer[1], answer[2], batches)


def _answer(answer: Any) -> tuple[Any, Any, Any]:
    if isinstance(answer, Mapping):
        missing = [k for k in ("task", "linkedset", "minibatch") if k not in answer]
        if missing:
            raise ConfigError(f"the answer lacks {missing}: give {{'task': ..., 'linkedset': ..., 'minibatch': ...}} "
                              "(mtlab.debug.find_nonfinite(trainer) returns such a dict)")
        return answer["task"], answer["linkedset"], answer["minibatch"]
    if isinstance(answer, (tuple, list)) and len(answer) == 3:
        return tuple(answer)
    raise ConfigError("give the answer as (task, linkedset, minibatch) or a dict with those keys, "
                      f"got {type(answer).__name__}")


def found_planted_nan(puzzle: PlantedNaN, answer: Any) -> CheckResult:
    """Does ``answer`` (``(task, linkedset, minibatch)`` or a dict with those keys, minibatch counted from 0
    within the task, as ``trainer.state(task).records`` lists them) name the poisoned minibatch?"""
    if not isinstance(puzzle, PlantedNaN):
        raise ConfigError(f"found_planted_nan(): puzzle must be what plant_nan() returned, got {type(puzzle).__name__}")
    task, linkedset, minibatch = _answer(answer)
    truth = (puzzle.task, puzzle.linkedset, puzzle.minibatch)
    details = {"answer": {"task": task, "linkedset": linkedset, "minibatch": minibatch}}
    kinds = [f"the {name} must be {want} (got {type(got).__name__} {got!r})" for name, got, ok, want in (
        ("task", task, isinstance(task, str), "a task's name, a string"),
        ("linked set", linkedset, isinstance(linkedset, str), "a linked set's name, a string"),
        ("minibatch", minibatch, isinstance(minibatch, int) and not isinstance(minibatch, bool),
         "a whole number (an int, counted from 0 within the task)")) if not ok]
    if kinds:  # a wrong type is not a wrong answer: say what to write instead
        return CheckResult("find the planted NaN", False, "; ".join(kinds), details)
    if (task, linkedset, minibatch) == truth:
        return CheckResult("find the planted NaN", True,
                           f"task {task!r}, linked set {linkedset!r}, minibatch {minibatch}: that is the one", details)
    wrong = [n for n, a, b in zip(("task", "linked set", "minibatch"), (task, linkedset, minibatch), truth) if a != b]
    return CheckResult("find the planted NaN", False,
                       f"not that one: the {' and the '.join(wrong)} {'differs' if len(wrong) == 1 else 'differ'} "
                       "(minibatches count from 0 within the task); look at each record's loss in "
                       "trainer.state(task).records, or call mtlab.debug.find_nonfinite(trainer)", details)
