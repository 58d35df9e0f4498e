"""A history as series (``mtlab.training.plotseries``): the validation points a plot draws, one marker per point
that a reader can see."""

from __future__ import annotations

from mtlab.training.plotseries import validation_series


def test_a_task_of_one_linked_set_gets_one_validation_marker_not_two_on_top_of_each_other():
    # the loop's records: the task's loss and its only linked set's are the same numbers
    records = [{"step": s, "task": "tag", "linkedset": "train", "loss": v} for s, v in ((30, 1.2), (60, 0.9))]
    records += [{"step": s, "tag/train": v, "tag": v, "loss": v, "best": v, "action": "better"}
                for s, v in ((30, 1.2), (60, 0.9))]
    assert validation_series(records) == {"tag/train": ([30, 60], [1.2, 0.9])}
    # two linked sets: the task's own (their weighted mean) is a point of its own
    two = [{"step": 30, "a/clean": 1.0, "a/noisy": 2.0, "a": 1.5}]
    assert set(validation_series(two)) == {"a/clean", "a/noisy", "a"}
    # a task validated on its own (no linked set named) keeps its points
    assert validation_series([{"step": 5, "b": 0.7}]) == {"b": ([5], [0.7])}
