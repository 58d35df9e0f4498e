"""The segment-length curriculum (stages), segmenting, trainset_frac and init_file."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.runs import assert_same
from helpers.recipes import TINY_TOML
from helpers.runs import LENGTHS, SEGMENTS, STAGES, staged

import mtlab
from mtlab.base.errors import ConfigError
from mtlab.training.loop import Schedule, run
from mtlab.apps.recipe import from_recipe, load
from mtlab.tasks.sampling import BatchStream
from mtlab.tasks.sources import SegmentedExamples

pytestmark = pytest.mark.usefixtures("one_thread")

def test_stages_switch_data_settings_lr_and_optimizer(monkeypatch: pytest.MonkeyPatch) -> None:
    tr, sch = staged()
    # stage 1: ceil(12 segments / (2 x 2)) = 3 steps; stage 2: ceil(6 utterances / (3 x 1)) = 2 steps
    assert [s["num_steps"] for s in sch.stages] == [3, 2] and sch.num_steps == 5
    assert tr.tasks["a"].batch_size == 2 and tr.numbatches_to_aggregate == 2
    assert isinstance(tr.tasks["a"].linkedsets["clean"].examples, SegmentedExamples)
    drawn: list[tuple[int, int, int, int]] = []  # (step, batch size, longest, frames)
    original = BatchStream.__next__

    def record(self: BatchStream) -> Any:
        data, lens = original(self)
        drawn.append((tr.step_count, int(lens["x"].shape[0]), int(lens["x"].max()), int(lens["x"].sum())))
        return data, lens

    monkeypatch.setattr(BatchStream, "__next__", record)
    run(tr, sch, progress=False)
    assert sch.last_stop == "done" and tr.step_count == 5 and sch.stage == 1 and sch.stage_start == 3
    first, second = [d for d in drawn if d[0] < 3], [d for d in drawn if d[0] >= 3]
    assert len(first) == 3 * 2 * 2 and len(second) == 2 * 2  # steps x linked sets x numbatches_to_aggregate
    assert all(b <= 2 and longest <= 5 for _, b, longest, _ in first)
    assert sum(f for *_, f in first) == 2 * sum(n for _, _, n in SEGMENTS)  # every segment once per linked set
    assert all(b == 3 for _, b, _, _ in second) and max(longest for _, _, longest, _ in second) == 25
    assert sum(f for *_, f in second) == 2 * sum(LENGTHS)  # every whole utterance once per linked set
    lr = [0.01 * 0.5 ** (s / 3) for s in range(3)] + [0.005, 0.005]
    assert tr.history["lr"].tolist() == pytest.approx(lr, rel=1e-15)
    # A fresh optimizer state at the switch (the original builds a new trainer per stage): 2 Adam steps since.
    steps = {int(st["step"]) for st in tr.optimizer.state.values()}
    assert steps == {2}
    assert not isinstance(tr.tasks["a"].linkedsets["clean"].examples, SegmentedExamples)


def test_each_stage_validates_on_its_own_view_from_its_step_0(monkeypatch: pytest.MonkeyPatch) -> None:
    tr, sch = staged(valid_frequency=2, validate_at_step_0=True)
    seen: list[tuple[int, bool]] = []

    def evaluate_totals(task: str, linkedset: str, num_batches: Any = None, examples: Any = None) -> tuple[float, float]:
        if linkedset == "clean":
            seen.append((tr.step_count, isinstance(tr.linkedset(task, linkedset).valid, SegmentedExamples)))
        return 1.0 / (1 + len(seen)), 1.0

    tr.evaluate_totals = evaluate_totals  # type: ignore[method-assign]
    run(tr, sch, progress=False)
    # stage 1 (steps 0-3): its step 0 and local step 2; stage 2 (steps 3-5): its step 0 (3) and local step 2 (5)
    assert seen == [(0, True), (2, True), (3, False), (5, False)]
    assert [r["segment_length"] for r in sch.validation] == ["5", "5", "full", "full"]
    assert [r["action"] for r in sch.validation] == ["better"] * 4  # a fresh best per stage


def test_a_stopped_stage_hands_its_best_model_to_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    ref, ref_sch = staged()
    run(ref, ref_sch, steps=1, progress=False)  # one step of the first stage
    tr, sch = staged(valid_frequency=1, num_tries=1, best_model_final=True, validate_at_step_0=True)
    # stage 1: steps 0, 1 better, 2 worse: stop, back to step 1; stage 2 from there: 1, 2, 3 (a fresh best)
    values, count = [1.0, 0.5, 0.7, 0.9, 0.8, 0.7], []

    def evaluate_totals(task: str, linkedset: str, num_batches: Any = None, examples: Any = None) -> tuple[float, float]:
        count.extend([1] if linkedset == "clean" else [])
        return values[len(count) - 1], 1.0

    tr.evaluate_totals = evaluate_totals  # type: ignore[method-assign]
    at_switch: dict[str, torch.Tensor] = {}
    switch = Schedule.next_stage

    def spy(self: Schedule, trainer: mtlab.Trainer, progress: bool = False) -> None:
        at_switch.update({k: p.detach().clone() for k, p in trainer.params.items()})
        switch(self, trainer, progress)

    monkeypatch.setattr(Schedule, "next_stage", spy)
    run(tr, sch, progress=False)
    assert all(torch.equal(at_switch[k], p) for k, p in ref.params.items())
    assert [r["action"] for r in sch.validation][:3] == ["better", "better", "worse+stop+go_back_to_1"]
    # stage 2 begins at step 1 and runs its 2 steps: the run ends at step 3 (5 planned, 2 of stage 1 unused)
    assert sch.stage == 1 and sch.stage_start == 1 and tr.step_count == 3 and sch.num_steps == 3
    assert sch.last_stop == "done" and sch.validation[3]["step"] == 1 and sch.validation[3]["action"] == "better"


# ---------------------------------------------------------------------------------- recipes
def tiny(root: Path, **trainer: Any) -> dict[str, Any]:
    recipe = tomllib.loads(TINY_TOML.format(root=root, num_steps=6, valid_frequency=0))
    recipe["trainer"].update(trainer)
    recipe["trainer"].pop("num_steps")
    return recipe


RECIPE_STAGES = [{"segment_length": 20, "batch_size": 4, "numbatches_to_aggregate": 2, "num_tries": "none"},
                 {"segment_length": "full", "batch_size": 2, "initial_learning_rate": 0.005}]


@pytest.mark.slow
def test_recipe_stages_resume_exactly(tiny_corpus: Path, tmp_path: Path) -> None:
    recipe = tiny(tiny_corpus, stages=RECIPE_STAGES, num_epochs=1.0)
    full = from_recipe(recipe)
    sch = full.schedule
    segs = full.trainer.linkedset("frames", "clean").examples
    assert isinstance(segs, SegmentedExamples) and sch.num_tries is None
    # 8 utterances; the most segments of any linked set over batch_size x numbatches_to_aggregate = 4 x 2
    assert sch.stages[0]["num_steps"] == -(-len(segs) // 8) and sch.stages[1]["num_steps"] == 4  # ceil(8 / 2)
    total = sch.num_steps
    run(full, progress=False)
    half = from_recipe(recipe)
    run(half, steps=1, progress=False, expdir=tmp_path / "exp")
    resumed = load(tmp_path / "exp" / "final.pt")
    assert resumed.schedule.stage == 0 and resumed.trainer.task("spk").batch_size == 4
    run(resumed, progress=False)
    assert resumed.trainer.step_count == full.trainer.step_count == total and resumed.schedule.stage == 1
    a, b = full.trainer.state_dict(), resumed.trainer.state_dict()
    for key in ("models", "update", "streams", "step", "knobs"):
        assert_same(a[key], b[key], key)


def test_recipe_trainset_frac_and_num_tries_none(tiny_corpus: Path) -> None:
    recipe = tiny(tiny_corpus, num_tries="none", num_epochs=1.0)
    recipe["tasks"]["frames"]["trainset_frac"] = 0.5
    exp = from_recipe(recipe)
    assert exp.schedule.num_tries is None
    assert len(exp.trainer.linkedset("frames", "clean").examples) == 4  # int(8 x 0.5)
    assert len(exp.trainer.linkedset("spk", "clean").examples) == 8
    assert exp.schedule.num_steps == 3  # ceil(8 / 3): the spk task's full linked set is the largest


@pytest.mark.slow
def test_recipe_init_file_loads_the_weights(tiny_corpus: Path, tmp_path: Path) -> None:
    first = from_recipe(tiny(tiny_corpus, num_epochs=1.0))
    run(first, steps=2, progress=False)
    first.save(tmp_path / "first.pt")
    torch.save({k: m.state_dict() for k, m in first.trainer.models.items()}, tmp_path / "weights.pt")
    for source in ("first.pt", "weights.pt"):
        exp = from_recipe(tiny(tiny_corpus, num_epochs=1.0, seed=7, init_file=str(tmp_path / source)))
        assert exp.trainer.step_count == 0
        for name, model in first.trainer.models.items():
            assert_same(exp.trainer.models[name].state_dict(), model.state_dict(), name)
    fresh = from_recipe(tiny(tiny_corpus, num_epochs=1.0, seed=7))  # without init_file: other weights
    assert any(not torch.equal(p, first.trainer.params[k]) for k, p in fresh.trainer.params.items())


@pytest.mark.parametrize("change,message", [
    ({"stages": [{"segment_length": 0}]}, "segment_length = 0"),
    ({"stages": [{"segment_length": 10, "batchsize": 4}]}, "unknown key 'batchsize'"),
    ({"stages": [{"segment_length": 10, "batch_size": 0}]}, "batch_size = 0"),
    ({"stages": []}, "list of stage tables"),
    ({"num_tries": "never"}, "num_tries"),
    ({"go_back_data": "replay"}, "go_back_data"),
    ({"init_file": "missing.pt"}, "init_file: .*missing.pt not found"),
])
def test_bad_stage_settings_name_the_key(tiny_corpus: Path, change: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        from_recipe(tiny(tiny_corpus, **change))


def test_init_file_errors(tiny_corpus: Path, tmp_path: Path) -> None:
    (tmp_path / "network.ckpt.index").write_text("")
    with pytest.raises(ConfigError, match="TensorFlow checkpoint"):
        from_recipe(tiny(tiny_corpus, init_file=str(tmp_path / "network.ckpt")))
    torch.save({"enc": {}}, tmp_path / "partial.pt")
    with pytest.raises(ConfigError, match=r"no weights for models \['pool', 'spk_head', 'frame_head'\]"):
        from_recipe(tiny(tiny_corpus, init_file=str(tmp_path / "partial.pt")))
    recipe = tiny(tiny_corpus)
    recipe["tasks"]["spk"]["trainset_frac"] = 0
    with pytest.raises(ConfigError, match=r"\[tasks.spk\] trainset_frac = 0"):
        from_recipe(recipe)


def test_ini_trainer_cfg_num_tries_none_and_stages_only_in_toml(tmp_path: Path) -> None:
    from mtlab.apps.recipe import load_trainer_cfg

    (tmp_path / "trainer.cfg").write_text("[trainer]\nnum_tries = None\nvalidate_at_step_0 = True\n")
    assert load_trainer_cfg(tmp_path / "trainer.cfg") == {"num_tries": None, "validate_at_step_0": True}
    (tmp_path / "trainer.cfg").write_text("[trainer]\nstages = 100 full\n")
    with pytest.raises(ConfigError, match="write the stages in the TOML recipe"):
        load_trainer_cfg(tmp_path / "trainer.cfg")


def test_per_stage_clipping_normalization_and_validation_frequency() -> None:
    stages = [{**STAGES[0], "clip_grad_value": 0.5, "valid_frequency": 1},
              {**STAGES[1], "clip_grad_value": False, "normalize_gradients": False, "num_tries": "none"}]
    tr, sch = staged(stages, valid_frequency=2, num_tries=4)
    seen: list[tuple[int, Any, bool]] = []
    tr.add_callback(lambda event, info: seen.append((info["step"], tr.clip_grad_value, tr.normalize_gradients))
                    if event == "apply" else None)
    run(tr, sch, progress=False)
    assert seen == [(1, 0.5, True), (2, 0.5, True), (3, 0.5, True), (4, None, False), (5, None, False)]
    assert str(tr.chain) == "Chain([])" and sch.num_tries is None
    # stage 1 validates every step (1, 2, 3), stage 2 every 2 of its own steps (5); the run's last look: none
    assert [r["step"] for r in sch.validation] == [1, 2, 3, 5]


def test_schedule_stages_check_their_values() -> None:
    with pytest.raises(ConfigError, match=r"stages\[0\] batch_size must be an integer >= 1"):
        Schedule(num_steps=3, stages=[{"segment_length": 5, "num_steps": 3, "batch_size": 0}])
    with pytest.raises(ConfigError, match=r"stages\[0\] initial_learning_rate must be > 0"):
        Schedule(num_steps=3, stages=[{"segment_length": 5, "num_steps": 3, "initial_learning_rate": -1.0}])
    with pytest.raises(ConfigError, match=r"stages\[0\] needs num_steps"):
        Schedule(num_steps=3, stages=[{"segment_length": "full"}])
