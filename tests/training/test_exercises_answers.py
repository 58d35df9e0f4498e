"""The planted-NaN check tells a wrong type from a wrong value: the right minibatch given as the string "0" is
told to be an int, not "the minibatch differs"; a wrong value says minibatches count from 0 within the task."""

from __future__ import annotations

from mtlab import exercises

from .test_exercises import shared_trainer


def test_a_wrong_type_is_told_apart_from_a_wrong_value():
    tr, _ = shared_trainer()
    puzzle = exercises.plant_nan(tr, seed=3, minibatches=5)
    as_text = exercises.found_planted_nan(puzzle, (puzzle.task, puzzle.linkedset, str(puzzle.minibatch)))
    assert not as_text and "differs" not in as_text.message
    assert f"the minibatch must be a whole number (an int, counted from 0 within the task) (got str '{puzzle.minibatch}')" \
        in as_text.message
    wrong = exercises.found_planted_nan(puzzle, (puzzle.task, puzzle.linkedset, puzzle.minibatch + 1))
    assert not wrong and "the minibatch differs (minibatches count from 0 within the task)" in wrong.message
    assert exercises.found_planted_nan(puzzle, (puzzle.task, puzzle.linkedset, puzzle.minibatch))
