"""The event vocabulary: every event emitted is a member of ``Event`` with its own payload type; listeners
written for strings and dicts keep working; an unknown name or a wrong payload is refused."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from helpers import DecayingScale, make_examples, make_models, task_a, task_b

import mtlab
from mtlab.core import events
from mtlab.core.events import PAYLOADS, Event, Events, MinibatchInfo, Payload, RestoreInfo, ValidationInfo

MTLAB = Path(mtlab.__file__).parent


def trainer() -> mtlab.Trainer:
    ex_c, ex_n = make_examples(12, 40), make_examples(12, 41)
    chain = mtlab.Chain([mtlab.Normalize(), DecayingScale(0.5), mtlab.ClipByValue(1.0)])
    tasks = [task_a((ex_c, ex_n), batch_size=3), task_b(ex_c, batch_size=3)]
    for t in tasks:
        for ls in t.linkedsets.values():
            ls.valid = ex_c[:3]
    return mtlab.Trainer(make_models(), tasks, device="cpu", lr=1e-2, chain=chain)


def test_every_event_a_trainer_and_the_loop_emit_is_a_member_with_its_payload_type() -> None:
    tr, seen = trainer(), []
    tr.add_callback(lambda event, info: seen.append((event, info)))
    tr.step()
    tr.load_state_dict(tr.state_dict())
    tr.fork("other")
    tr.set_weight("a", "noisy", 0.3)
    tr.set_task_weight("b", 0.5)
    tr.set_minibatches_per_step(2, "a")
    tr.set_batch_size("a", 2)
    tr.set_combine("sum")
    tr.evaluate("a", "clean", num_batches=1)
    tr.process_minibatch("a", "clean")
    tr.reset()
    tr.reinitialize()
    mtlab.run(tr, mtlab.Schedule(num_steps=1, valid_frequency=1), progress=False)
    for event, info in seen:
        assert isinstance(event, Event), event
        assert type(info) is PAYLOADS[event], (event, type(info).__name__)
    # everything except data_skipped (bad data; checked in the source below)
    assert {e for e, _ in seen} == set(Event) - {Event.DATA_SKIPPED}
    scaled = [info for e, info in seen if e == Event.TRANSFORM]
    assert {(i.task, i.call) for i in scaled} == {("a", "scale"), ("b", "scale")}


def test_every_emit_in_mtlab_passes_a_member_and_its_payload() -> None:
    """Each ``.emit(...)`` call in the package names ``Event.X`` and builds ``PAYLOADS[Event.X]`` (or
    ``call_done`` for the chain's calls): no string and no dict reaches a listener."""
    named: set[Event] = set()
    for path in MTLAB.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "emit"):
                continue
            if path.name == "events.py" or not ast.unparse(node.func).endswith("events.emit"):
                continue
            where = f"{path.relative_to(MTLAB)}:{node.lineno}"
            if isinstance(node.args[0], ast.Starred):
                assert ast.unparse(node.args[0].value).startswith("call_done("), where
                named |= {Event.NORMALIZE, Event.CLIP, Event.TRANSFORM}
                continue
            event, info = node.args
            assert isinstance(event, ast.Attribute) and ast.unparse(event.value) == "Event", where
            member = Event[event.attr]
            named.add(member)
            assert isinstance(info, ast.Call) and ast.unparse(info.func) == PAYLOADS[member].__name__, where
    assert named == set(Event)  # and every member is emitted somewhere


def test_call_done_names_the_builtin_calls_and_a_user_transform() -> None:
    acc = object()
    assert [call_event[0] for call_event in (events.call_done(c, "a", acc) for c in ("normalize", "clip", "mine"))] \
        == [Event.NORMALIZE, Event.CLIP, Event.TRANSFORM]
    event, info = events.call_done("mine", "a", acc)
    assert dict(info) == {"task": "a", "state": acc, "call": "mine"}


def test_an_old_style_listener_reads_strings_and_dicts() -> None:
    tr, seen = trainer(), []

    def old(event: str, info: dict) -> None:
        if event == "minibatch":
            seen.append((info["task"], info.get("linkedset"), info.get("missing", "-"), sorted(dict(info))))
        if event in ("apply",):
            seen.append(("apply", info["step"], "row" in info, len(info)))

    tr.add_callback(old)
    tr.step()
    assert ("a", "clean", "-", ["linkedset", "state", "task"]) in seen and ("b", "clean", "-",
                                                                              ["linkedset", "state", "task"]) in seen
    assert seen[-1] == ("apply", 1, True, 3)
    info = RestoreInfo(step=3)
    assert info == {"step": 3} and info.step == info["step"] == 3 and list(info) == ["step"]
    with pytest.raises(KeyError):
        info["task"]
    with pytest.raises(AttributeError):
        info.step = 4  # type: ignore[misc]  # frozen


def test_an_unknown_event_or_a_wrong_payload_is_refused_naming_the_fix() -> None:
    ev, seen = Events(), []
    ev.subscribe(lambda e, i: seen.append(e))
    with pytest.raises(ValueError, match="unknown event 'x'.*minibatch, normalize, clip.*run_end"):
        ev.emit("x", RestoreInfo(step=1))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="'restore' carries a RestoreInfo, got dict"):
        ev.emit(Event.RESTORE, {"step": 1})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="carries a ValidationInfo, got MinibatchInfo"):
        ev.emit(Event.VALIDATION, MinibatchInfo("a", "clean", None))  # type: ignore[arg-type]
    assert seen == []
    ev.emit("restore", RestoreInfo(step=1))  # type: ignore[arg-type]  # the name of a member is the member
    ev.emit(Event.VALIDATION, ValidationInfo(step=1, record={"loss": 1.0}))
    assert seen == ["restore", Event.VALIDATION]


def test_every_payload_type_is_a_frozen_mapping_dataclass() -> None:
    assert set(PAYLOADS) == set(Event)
    assert len(set(PAYLOADS.values())) == len(Event)  # one type per event
    for event, cls in PAYLOADS.items():
        assert issubclass(cls, Payload) and cls.__dataclass_params__.frozen, event  # type: ignore[attr-defined]
