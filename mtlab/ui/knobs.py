"""The knobs of a trainer as plain data: what "re-initialise, back to the starting knobs" sets again, and the
choice offered beside the button."""

from __future__ import annotations

from typing import Any, TYPE_CHECKING

if TYPE_CHECKING:
    from ..core.trainer import Trainer

# The choice beside "re-initialise": its label on screen -> the value ``Controller.reinitialize(knobs=...)`` takes.
KNOB_CHOICES = {"keep": "keep the knobs", "start": "starting knobs"}


def knobs_of(trainer: Trainer) -> dict[str, Any]:
    """Every knob a dashboard moves: weights (task and linked set), lr, clip value, combine method, minibatches
    per step and batch size of each task."""
    return {"weights": dict(trainer.weights()), "lr": float(trainer.lr), "clip": trainer.clip_grad_value,
            "combine": str(getattr(trainer.update, "method", None) or "sum"),
            "k": dict(trainer.minibatches_per_step), "batch": {n: t.batch_size for n, t in trainer.tasks.items()}}


def apply_knobs(trainer: Trainer, knobs: dict[str, Any]) -> list[str]:
    """Set ``knobs`` (from ``knobs_of``) on ``trainer`` through its public calls (journaled, as from the dashboard);
    what changed, in words (``lr 0.002``, ``frames/noisy weight 0.5``)."""
    now, changed = knobs_of(trainer), []
    for key, value in knobs["weights"].items():
        if now["weights"].get(key) != value:
            task, _, lset = key.partition("/")
            if lset:
                trainer.set_weight(task, lset, value)
            else:
                trainer.set_task_weight(task, value)
            changed.append(f"{key} weight {value:g}")
    if now["lr"] != knobs["lr"]:
        trainer.lr = knobs["lr"]
        changed.append(f"lr {knobs['lr']:.3g}")
    if now["clip"] != knobs["clip"]:
        trainer.clip_grad_value = knobs["clip"]
        changed.append("clipping off" if knobs["clip"] is None else f"clip value {knobs['clip']:.3g}")
    if now["combine"] != knobs["combine"] and not trainer.acc_steps:
        trainer.set_combine(knobs["combine"])
        changed.append(f"combine {knobs['combine']}")
    for task, k in knobs["k"].items():
        if now["k"].get(task) != k:
            trainer.set_minibatches_per_step(k, task)
            changed.append(f"K of {task} {k}")
    for task, size in knobs["batch"].items():
        if now["batch"].get(task) != size:
            trainer.set_batch_size(task, size)
            changed.append(f"batch size of {task} {size}")
    return changed
