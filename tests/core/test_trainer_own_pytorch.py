"""The user's own PyTorch, as PyTorch means it: an optimizer factory's lr, param groups, LR schedulers, frozen
parameters and checkpoints of another optimizer, each checked against a plain-PyTorch loop that steps the same
gradients (read from the trainer before each apply) with the user's optimizer and scheduler."""

from __future__ import annotations

import copy

import pytest
import torch

import mtlab
from helpers import make_examples, make_models, task_a
from helpers.trainers import assert_trees_equal
from mtlab.base.errors import ConfigError
from mtlab.core.knobs import KNOBS, Knob


def trainer(optimizer=None, lr=None, scheduler=None, models=None, **kw) -> mtlab.Trainer:
    ex = make_examples(24, 3)
    return mtlab.Trainer(models or make_models(), [task_a((ex, ex), weights=(1.0, 0.0))], lr=lr, device="cpu",
                         optimizer=optimizer, scheduler=scheduler, **kw)


def oracle_params(tr: mtlab.Trainer) -> dict[str, torch.nn.Parameter]:
    """Independent copies of the trainer's parameters, stepped by a plain loop."""
    return {k: torch.nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad) for k, p in tr.params.items()}


def step_both(tr: mtlab.Trainer, opt: torch.optim.Optimizer, params: dict, sched=None) -> None:
    """One step of the trainer, by hand; the plain loop steps the same gradients with the user's optimizer."""
    tr.process_minibatch("a", "clean")
    tr.normalize()
    grads = {k: g.clone() for k, g in tr.state("a").grads.items()}
    tr.apply()
    opt.zero_grad(set_to_none=True)
    for k, g in grads.items():
        if params[k].requires_grad:
            params[k].grad = g
    opt.step()
    if sched is not None:
        sched.step()


def assert_params_equal(tr: mtlab.Trainer, params: dict) -> None:
    for k, p in tr.params.items():
        torch.testing.assert_close(p.detach(), params[k].detach(), rtol=0, atol=0, msg=k)


def test_a_factory_without_lr_trains_at_the_optimizers_lr():
    tr = trainer(optimizer=lambda ps: torch.optim.SGD(ps, lr=0.5))
    assert tr.lr == 0.5 and tr.optimizer.param_groups[0]["lr"] == 0.5
    params = oracle_params(tr)
    opt = torch.optim.SGD(list(params.values()), lr=0.5)
    for _ in range(3):
        step_both(tr, opt, params)
    assert_params_equal(tr, params)
    assert list(tr.history["lr"]) == [0.5, 0.5, 0.5]


def test_a_disagreeing_lr_is_refused_naming_both_and_an_agreeing_one_is_taken():
    with pytest.raises(ConfigError, match=r"lr=0.001.*SGD, lr=0.5.*give the lr once"):
        trainer(optimizer=lambda ps: torch.optim.SGD(ps, lr=0.5), lr=1e-3)
    assert trainer(optimizer=lambda ps: torch.optim.SGD(ps, lr=0.5), lr=0.5).lr == 0.5
    assert trainer().lr == 1e-3 and trainer(lr=3e-3).optimizer.param_groups[0]["lr"] == 3e-3


def groups_factory(models):
    enc, head = list(models["enc"].parameters()), list(models["head_a"].parameters())

    def make(ps):
        return torch.optim.SGD([{"params": enc, "lr": 1e-4}, {"params": head}], lr=0.5, momentum=0.9)
    return make


def test_param_groups_keep_their_lrs_and_the_lr_knob_scales_them_all():
    models = make_models()
    tr = trainer(optimizer=groups_factory(models), models=models)
    assert tr.lr == 0.5 and [g["lr"] for g in tr.optimizer.param_groups] == [1e-4, 0.5]
    params = oracle_params(tr)
    opt = torch.optim.SGD([{"params": [params[k] for k in params if k.startswith("enc.")], "lr": 1e-4},
                           {"params": [params[k] for k in params if k.startswith("head_a.")]}], lr=0.5, momentum=0.9)
    step_both(tr, opt, params)
    tr.set("lr", 0.25)  # the base lr halved: every group halved, the ratio 1/5000 kept
    for g in opt.param_groups:
        g["lr"] *= 0.5
    assert [g["lr"] for g in tr.optimizer.param_groups] == [5e-5, 0.25] and tr.lr == 0.25
    step_both(tr, opt, params)
    assert_params_equal(tr, params)
    h = tr.history
    assert list(h["lr"]) == [0.5, 0.25] and list(h["lr/0"]) == [1e-4, 5e-5] and list(h["lr/1"]) == [0.5, 0.25]


def test_a_scheduler_is_stepped_once_per_apply_as_in_a_plain_loop_and_the_history_shows_it():
    tr = trainer(optimizer=lambda ps: torch.optim.SGD(ps, lr=0.4),
                 scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5))
    params = oracle_params(tr)
    opt = torch.optim.SGD(list(params.values()), lr=0.4)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    for _ in range(5):
        step_both(tr, opt, params, sched)
    assert_params_equal(tr, params)
    assert list(tr.history["lr"]) == [0.4, 0.4, 0.2, 0.2, 0.1]
    assert tr.optimizer.param_groups[0]["lr"] == opt.param_groups[0]["lr"] == 0.1


def test_a_scheduler_built_on_the_trainers_optimizer_and_stepped_by_hand_takes_effect():
    tr = trainer(optimizer=lambda ps: torch.optim.SGD(ps, lr=0.4))
    mine = torch.optim.lr_scheduler.ExponentialLR(tr.optimizer, gamma=0.5)
    params = oracle_params(tr)
    opt = torch.optim.SGD(list(params.values()), lr=0.4)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.5)
    for _ in range(3):
        step_both(tr, opt, params, sched)
        mine.step()
    assert_params_equal(tr, params)
    assert list(tr.history["lr"]) == [0.4, 0.2, 0.1]


def lambda_sched(opt):
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))


def test_a_knob_change_on_top_of_a_closed_form_schedule_stays_in_force():
    tr = trainer(optimizer=lambda ps: torch.optim.SGD(ps, lr=0.4), scheduler=lambda_sched)
    tr.step()
    tr.step()  # lr 0.4 / 3 now
    tr.set("lr", 0.4 / 3 * 2)  # twice the scheduled lr
    tr.step()
    # LambdaLR recomputes from its base lrs: they were scaled with the groups, so the factor 2 holds
    assert tr.optimizer.param_groups[0]["lr"] == pytest.approx(2 * 0.4 / 4, rel=1e-12)
    assert tr.history["lr"].iloc[-1] == pytest.approx(2 * 0.4 / 3, rel=1e-12)


def test_a_schedule_and_a_knob_change_resume_fork_and_replay_bit_for_bit():
    def build():
        torch.manual_seed(0)
        return trainer(optimizer=lambda ps: torch.optim.SGD(ps, lr=0.4, momentum=0.9), scheduler=lambda_sched,
                       models=make_models())
    tr = build()
    tr.step(); tr.step()
    snap = tr.state_dict()
    tr.set("lr", 0.05)
    tr.step(); tr.step()
    resumed = build()
    resumed.load_state_dict(snap)
    assert resumed.optimizer.param_groups[0]["lr"] == snap["update"]["optimizer"]["param_groups"][0]["lr"]
    resumed.set("lr", 0.05)
    resumed.step(); resumed.step()
    assert_trees_equal({k: p.detach() for k, p in tr.params.items()}, {k: p.detach() for k, p in resumed.params.items()})
    fork = tr.fork("f")
    fork.step(); tr.step()
    assert_trees_equal({k: p.detach() for k, p in tr.params.items()}, {k: p.detach() for k, p in fork.params.items()})
    assert tr.schedule.scheduler.last_epoch == fork.schedule.scheduler.last_epoch == 5
    replayed = mtlab.replay(tr.journal, build())
    assert_trees_equal({k: p.detach() for k, p in tr.params.items()},
                       {k: p.detach() for k, p in replayed.params.items()})
    assert list(replayed.history["lr"]) == list(tr.history["lr"])
    assert [e["kind"] for e in tr.journal.changes()] == ["lr", "fork"]


def test_a_parameter_frozen_between_steps_is_untouched_by_adamw_and_its_grad_is_none():
    tr = trainer(optimizer=lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1))
    params = oracle_params(tr)
    opt = torch.optim.AdamW(list(params.values()), lr=0.01, weight_decay=0.1)
    step_both(tr, opt, params)
    tr.params["enc.lin.weight"].requires_grad_(False)
    params["enc.lin.weight"].requires_grad_(False)
    before = tr.params["enc.lin.weight"].detach().clone()
    step_both(tr, opt, params)
    step_both(tr, opt, params)
    assert torch.equal(tr.params["enc.lin.weight"].detach(), before)
    assert tr.params["enc.lin.weight"].grad is None
    tr.params["enc.lin.weight"].requires_grad_(True)  # unfrozen: trains again from the next step
    params["enc.lin.weight"].requires_grad_(True)
    step_both(tr, opt, params)
    assert not torch.equal(tr.params["enc.lin.weight"].detach(), before)
    assert_params_equal(tr, params)


def test_a_parameter_frozen_when_built_and_unfrozen_later_trains():
    models = make_models()
    models["enc"].lin.weight.requires_grad_(False)
    tr = trainer(optimizer=lambda ps: torch.optim.SGD(ps, lr=0.3, momentum=0.5), models=models)
    assert "enc.lin.weight" in tr.params  # covered by the optimizer, as Adam(model.parameters()) covers it
    params = oracle_params(tr)
    opt = torch.optim.SGD(list(params.values()), lr=0.3, momentum=0.5)
    step_both(tr, opt, params)
    frozen = tr.params["enc.lin.weight"].detach().clone()
    models["enc"].lin.weight.requires_grad_(True)
    params["enc.lin.weight"].requires_grad_(True)
    step_both(tr, opt, params)
    step_both(tr, opt, params)
    assert not torch.equal(tr.params["enc.lin.weight"].detach(), frozen)
    assert_params_equal(tr, params)


@pytest.mark.parametrize("other", ["class", "groups"])
def test_a_checkpoint_of_another_optimizer_is_refused_before_anything_loads(tmp_path, other):
    models = make_models()
    if other == "class":
        saved = trainer(optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))
    else:
        saved = trainer(optimizer=groups_factory(models), models=models)
    saved.step(); saved.step()
    path = saved.save(tmp_path / "ckpt.pt")
    tr = trainer(optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)) if other == "groups" else trainer()
    before = copy.deepcopy(tr.state_dict())
    with pytest.raises(mtlab.ConfigError, match="optimizer" if other == "class" else "param groups") as err:
        tr.load_checkpoint(path)
    if other == "class":
        assert "torch.optim.sgd.SGD" in str(err.value) and "torch.optim.adam.Adam" in str(err.value)
    assert_trees_equal({k: v for k, v in tr.state_dict().items() if k != "journal"},
                       {k: v for k, v in before.items() if k != "journal"})
    tr.step()  # still usable
    assert tr.step_count == 1


def test_an_unknown_knob_in_a_state_is_refused_and_entries_of_ones_own_beside_it_are_left_alone():
    tr = trainer()
    tr.step()
    state = tr.state_dict()
    tr.load_state_dict({**state, "epoch": 3})  # torch.save({**trainer.state_dict(), "epoch": 3}) as a user writes
    with pytest.raises(mtlab.ConfigError, match="unknown knob 'nope'"):
        tr.load_state_dict({**state, "knobs": [*state["knobs"], {"name": "nope", "task": None, "linkedset": None,
                                                                  "value": 1}]})


def test_two_stateful_transforms_of_one_class_keep_their_own_state():
    class Counter(mtlab.Transform):
        call = "count"

        def __init__(self, start):
            self.n = start

        def __call__(self, acc):
            self.n += 1

        def state_dict(self):
            return {"n": self.n}

        def load_state_dict(self, state):
            self.n = state["n"]

    chain = mtlab.Chain([mtlab.Normalize(), Counter(0), Counter(4)])
    tr = trainer(chain=chain)
    tr.step()
    state = tr.state_dict()
    assert [c.n for c in chain.transforms[1:]] == [1, 5]
    fresh_chain = mtlab.Chain([mtlab.Normalize(), Counter(0), Counter(0)])
    fresh = trainer(chain=fresh_chain)
    fresh.load_state_dict(state)
    assert [c.n for c in fresh_chain.transforms[1:]] == [1, 5]


def test_a_new_knob_is_one_row_and_the_line_where_it_acts():
    # the row
    KNOBS.add(Knob("loss_scale", "trainer", lambda tr, v, t, s: mtlab.tasks.task.check_positive(v, "loss_scale"),
                   default=1.0, control=("linear", 0.1, 2.0)))
    try:
        def build():
            torch.manual_seed(0)
            return trainer(models=make_models())
        tr = build()
        # the line where it acts: the user's loop scales the lr by it (any use reads trainer.get)
        seen = []
        tr.add_callback(lambda ev, info: seen.append((info.name, info.value)) if ev == "knob" else None)
        tr.step()
        tr.set("loss_scale", 0.5)
        assert tr.get("loss_scale") == 0.5 and seen == [("loss_scale", 0.5)]
        assert tr.journal.changes()[-1]["kind"] == "loss_scale"
        with pytest.raises(mtlab.ConfigError, match="loss_scale"):
            tr.set("loss_scale", -1)
        tr.step()
        state = tr.state_dict()
        assert {"name": "loss_scale", "task": None, "linkedset": None, "value": 0.5} in state["knobs"]
        resumed = build()
        resumed.load_state_dict(state)
        assert resumed.get("loss_scale") == 0.5
        assert tr.fork("f").get("loss_scale") == 0.5
        assert mtlab.replay(tr.journal, build()).get("loss_scale") == 0.5
    finally:
        KNOBS.remove("loss_scale")


def test_set_checks_the_scope_and_names_the_fix():
    tr = trainer()
    with pytest.raises(ConfigError, match=r"unknown knob 'learning_rate'.*'lr'"):
        tr.set("learning_rate", 1e-3)
    with pytest.raises(ConfigError, match=r"needs task= and linkedset="):
        tr.set("weight", 0.5)
    with pytest.raises(ConfigError, match=r"linked sets: \['clean', 'noisy'\]"):
        tr.set("weight", 0.5, task="a", linkedset="other")
    with pytest.raises(ConfigError, match="the trainer's, not a task's"):
        tr.set("lr", 0.5, task="a")
    change = tr.set("weight", 0.5, task="a", linkedset="noisy")
    assert tr.get("weight", task="a", linkedset="noisy") == 0.5 and "from the next minibatch" in str(change)


def test_a_state_of_another_optimizer_written_before_optimizers_were_recorded_is_refused():
    sgd = trainer(optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))
    sgd.step()
    state = {k: v for k, v in sgd.state_dict().items() if k != "optimizers"}
    adam = trainer()
    with pytest.raises(mtlab.ConfigError, match="saved with another optimizer; nothing was loaded"):
        adam.load_state_dict(state)
    adam.step()
    assert adam.step_count == 1 and isinstance(adam.optimizer, torch.optim.Adam)


@pytest.mark.parametrize("piece", ["update", "scheduler", "task"])
def test_an_unknown_entry_inside_a_piece_of_a_state_is_refused_before_anything_changes(piece):
    tr = trainer(optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
                 scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, 2))
    tr.step()
    state = tr.state_dict()
    if piece == "task":
        state["tasks"]["a"]["surprise"] = 1
    else:
        state[piece]["surprise"] = 1
    tr.step()
    before = {k: p.detach().clone() for k, p in tr.params.items()}
    with pytest.raises(mtlab.ConfigError, match=r"\['surprise'\]; nothing was loaded"):
        tr.load_state_dict(state)
    assert tr.step_count == 2 and all(torch.equal(p, before[k]) for k, p in tr.params.items())


def test_reinitialize_starts_the_schedule_again():
    tr = trainer(optimizer=lambda ps: torch.optim.SGD(ps, lr=0.4),
                 scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5))
    tr.step(); tr.step()
    assert tr.lr == 0.1
    tr.reinitialize()
    assert tr.lr == 0.4 and tr.schedule.scheduler.last_epoch == 0
    tr.step()
    assert tr.history["lr"].iloc[-1] == 0.4
