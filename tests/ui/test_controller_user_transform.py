"""A transform written outside mtlab gets its call, its place in explain(), its dashboard button, its phase
errors, its history column and its checkpointed state from the chain alone."""

from __future__ import annotations

import pytest
import torch
from helpers.trainers import batches, ce_sum

import mtlab
import mtlab.ui
from helpers import DecayingScale, clone_models, make_examples, make_models, task_a
from mtlab.ui.controller import Controller


def make(chain: mtlab.Chain, models=None) -> mtlab.Trainer:
    ex = make_examples(12, 4)
    return mtlab.Trainer(models or make_models(), [task_a((ex, ex), weights=(1.0, 0.3))], lr=1e-2, device="cpu",
                         chain=chain)


def test_a_user_transform_gets_its_call_explain_line_button_and_gradient(one_thread) -> None:
    models = make_models()
    oracle = clone_models(models)
    tr = make(mtlab.Chain([mtlab.Normalize(), DecayingScale(0.25), mtlab.ClipByValue(0.01)]), models)
    assert tr.chain.calls() == ["normalize", "scale", "clip"]
    text = mtlab.debug.explain(tr)
    assert "4. scale()" in text and "DecayingScale(0.25): Multiply each task's gradient" in text
    plan = list(zip((1.0, 0.3), batches(1, sizes=(3, 2), lengths=((2, 5), (9, 14)))))
    for (_, batch), s in zip(plan, ("clean", "noisy")):
        tr.process_minibatch("a", s, batch)
    tr.normalize()
    assert tr.next_calls() == {"a": "scale"}
    with pytest.raises(mtlab.PhaseError, match=r"has not been processed; call scale\(\) first"):
        tr.clip()
    assert mtlab.debug.next_call(tr).startswith("scale(): DecayingScale(0.25)")

    # the dashboard (headless: widgets without a browser) offers the call as a button that makes it
    dash = mtlab.ui.dashboard(tr, plots=False)
    try:
        row = [b.description for b in dash.buttons.values()]
        assert "scale" in dash.buttons and "scale" in row and "Multiply" in dash.buttons["scale"].tooltip
        dash.buttons["scale"].click()
        assert "scale: done" in dash.status.value, dash.status.value
    finally:
        dash.close()
    assert tr.next_calls() == {"a": "clip"} and tr.phase() == {"a": "processed"}

    # plain PyTorch: the gradient of Σ w·loss / Σ w·normalizer in one pass, times the factor
    total, norm = 0.0, 0.0
    for w, batch in plan:
        loss, n = ce_sum(oracle, batch)
        total, norm = total + w * loss, norm + w * n
    (total / norm).backward()
    expect = {f"{mn}.{pn}": p.grad * 0.25 for mn, m in oracle.items() for pn, p in m.named_parameters()
              if p.grad is not None}
    got = tr.state("a").grads
    assert set(got) == set(expect)
    for k in expect:
        torch.testing.assert_close(got[k], expect[k], rtol=1e-12, atol=1e-15)
    tr.clip()
    tr.apply()
    assert tr.history["a/scale"].tolist() == [0.25]
    tr.step()
    assert tr.history["a/scale"].tolist() == [0.25, 0.125]


def test_the_controller_makes_a_chain_call_by_name(one_thread) -> None:
    tr = make(mtlab.Chain([DecayingScale(2.0)]))
    c = Controller(tr)
    try:
        assert not c.call("scale") and "process_minibatch" in c.state().status
        c.minibatch("a", "clean")
        before = {k: v.clone() for k, v in tr.state("a").grads.items()}
        assert c.call("scale")
        for k, v in tr.state("a").grads.items():
            torch.testing.assert_close(v, before[k] * 2.0)
        with pytest.raises(ValueError, match="'minibatch', 'normalize', 'clip', 'scale', 'apply'"):
            c.call("shrink")
    finally:
        c.detach("test over")
