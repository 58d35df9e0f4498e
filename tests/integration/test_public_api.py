"""Every public name of release 0.2 still works from ``import mtlab``, or the changelog names where it went."""

from __future__ import annotations

import importlib
import json

import pytest
from helpers.paths import PUBLIC_API, REPO

import mtlab

RELEASE = json.loads(PUBLIC_API.read_text())  # {"": mtlab.__all__, "loop": [...]}
SCHEDULE = "mtlab.training.schedule"
# Names whose module was split in 0.3: (attribute of mtlab, name) -> the module that holds it now.
MOVED = {
    **{("loop", n): SCHEDULE for n in ("GO_BACK_DATA", "SETTINGS", "STAGE_KEYS", "STAGE_SCHEDULE_KEYS",
                                       "STAGE_TRAINER_KEYS", "STATE_FIELDS", "check_stage", "stage_view")},
    ("loop", "validate"): "mtlab.training.validation",
    ("loop", "SegmentedExamples"): "mtlab.tasks.sources",
    ("loop", "check_count"): "mtlab.tasks.task",
    ("loop", "check_positive"): "mtlab.tasks.task",
    ("recipe", "STAGE_KEYS"): SCHEDULE,
    ("recipe", "check_stage"): SCHEDULE,
}
# Aliases dropped in 0.3 (one name per thing): (attribute of mtlab, name) -> the name to use.
REMOVED = {("", "TaskState"): "Accumulator", ("models", "batch_loss"): "loss"}
CASES = [(sub, name) for sub, names in RELEASE.items() for name in names]


@pytest.mark.parametrize(("sub", "name"), CASES, ids=[f"{s or 'mtlab'}.{n}" for s, n in CASES])
def test_public_name_of_the_last_release(sub: str, name: str) -> None:
    if (sub, name) in REMOVED:
        changelog = (REPO / "CHANGELOG.md").read_text()
        assert f"`{name}`" in changelog and f"`{REMOVED[(sub, name)]}`" in changelog, \
            f"the changelog does not say that {name} is gone and {REMOVED[(sub, name)]} replaces it"
        return
    if (sub, name) in MOVED:
        home = MOVED[(sub, name)]
        assert hasattr(importlib.import_module(home), name), f"{name} is not in {home}"
        changelog = (REPO / "CHANGELOG.md").read_text()
        assert f"`{home}`" in changelog, f"the changelog does not say that mtlab.{sub}.{name} moved to {home}"
        return
    owner = getattr(mtlab, sub) if sub else mtlab
    assert hasattr(owner, name), f"mtlab{'.' + sub if sub else ''}.{name} is gone; keep it or name its new home in MOVED"


def test_the_release_list_is_not_empty() -> None:
    assert len(CASES) > 150 and "Trainer" in RELEASE[""]
