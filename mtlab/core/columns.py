"""The history's column names, built and read in one place.

A row of ``trainer.history`` has ``step``, ``lr`` and ``skipped``, then per task ``<task>/weight``,
``<task>/<set>/weight``, ``<task>/loss``, ``<task>/<set>/loss``, ``<task>/grad_norm``, ``<task>/grad_norm_clipped``,
``<task>/clip_fraction``, ``<task>/minibatches`` (and ``<task>/<name>`` for what a transform of the chain
measured), then the update's ``weighting/<task>``, ``combine/<group>/<task>``, ``cos/<model>/<a>,<b>``,
``direction_norm/<group>`` and ``direction_norm``; with ``noise_scale=True`` the noise scale's ``gns/<task>``,
``gns/<task>/<model>``, ``gns_trace/<task>``, ``gns_g2/<task>`` and ``gns_minibatches/<task>``. A linked set is
named ``<task>/<set>`` (``set_key``) wherever it is a key: weights, validation records, sliders, legend labels.

>>> task_column("a", "loss"), set_column("a", "clean", "loss"), cosine_column("enc", "a", "b")
('a/loss', 'a/clean/loss', 'cos/enc/a,b')
>>> parse_column("a/clean/loss")
Column(kind='loss', task='a', linkedset='clean', group='', pair=())
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

COMBINE, COSINE, WEIGHTING, DIRECTION = "combine", "cos", "weighting", "direction_norm"  # the update's prefixes
NOISE = "gns"  # the gradient noise scale (B_simple), per task and per model
NOISE_PARTS = (NOISE, "gns_trace", "gns_g2", "gns_minibatches")  # what core.noise writes per task


def set_key(task: str, linkedset: str) -> str:
    """``<task>/<set>``: a linked set's name as a key (weights, validation records, sliders, labels)."""
    return f"{task}/{linkedset}"


def split_key(key: str) -> tuple[str, str]:
    """``(task, set)`` of a ``set_key`` (``(task, "")`` for a task's own key)."""
    task, _, linkedset = key.partition("/")
    return task, linkedset


@functools.cache  # built for every row of every step: the same few names
def task_column(task: str, name: str) -> str:
    """``<task>/<name>``: a task's loss, weight, gradient norm, clip fraction, minibatches or a transform's statistic."""
    return f"{task}/{name}"


@functools.cache  # built for every row of every step: the same few names
def set_column(task: str, linkedset: str, name: str) -> str:
    """``<task>/<set>/<name>``: a linked set's loss or weight."""
    return f"{task}/{linkedset}/{name}"


def weighting_column(task: str) -> str:
    """A loss weighting's coefficient for ``task``."""
    return f"{WEIGHTING}/{task}"


def combine_column(group: str, task: str) -> str:
    """The weight a combination method gave ``task`` on a group of shared parameters."""
    return f"{COMBINE}/{group}/{task}"


@functools.cache  # built for every row of every step: the same few names
def cosine_column(model: str, a: str, b: str) -> str:
    """The cosine similarity of tasks ``a`` and ``b``'s processed gradients on ``model``."""
    return f"{COSINE}/{model}/{a},{b}"


def noise_column(task: str, model: str | None = None, part: str = NOISE) -> str:
    """The noise scale of ``task`` (on one ``model``'s parameters), or another of its ``NOISE_PARTS``."""
    return f"{part}/{task}" if model is None else f"{part}/{task}/{model}"


@functools.cache  # built for every row of every step: the same few names
def direction_column(group: str | None = None) -> str:
    """The norm of the update's direction (over one group of shared parameters, or over every parameter)."""
    return DIRECTION if group is None else f"{DIRECTION}/{group}"


@dataclass(frozen=True)
class Column:
    """What a column holds: ``kind`` is its last part for a task's columns (``loss``, ``grad_norm`` ...), or
    ``combine``, ``cos``, ``weighting``, ``direction_norm`` for the update's, ``gns``... for the noise scale's; ``step``, ``lr``, ``skipped`` for
    the row's own."""

    kind: str
    task: str = ""
    linkedset: str = ""
    group: str = ""  # the group (combine, direction_norm) or the model (cos, gns)
    pair: tuple[str, ...] = ()  # the two tasks of a cosine


def parse_column(column: str) -> Column:
    """The parts of a history column name (the inverse of the builders above)."""
    head, _, rest = column.partition("/")
    if head == COMBINE:
        group, _, task = rest.rpartition("/")
        return Column(COMBINE, task=task, group=group)
    if head == COSINE:
        model, _, pair = rest.rpartition("/")
        return Column(COSINE, group=model, pair=tuple(pair.split(",")))
    if head == WEIGHTING:
        return Column(WEIGHTING, task=rest)
    if head == DIRECTION:
        return Column(DIRECTION, group=rest)
    if head in NOISE_PARTS:
        task, _, model = rest.partition("/")
        return Column(head, task=task, group=model)
    if not rest:
        return Column(column)
    middle, _, kind = rest.rpartition("/")
    return Column(kind, task=head, linkedset=middle)
