"""Mixed precision: mtlab's step against the AMP loop a user writes in plain PyTorch (CPU autocast and
``torch.amp.GradScaler`` run on the CPU), per task as mtlab defines the step."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from helpers.recipes import write_tiny_recipe

import mtlab
from helpers import Encoder
from mtlab.base.batching import collate
from mtlab.base.errors import ConfigError
from mtlab.core.precision import Precision, check_precision

K, CLIP, LR, WB = 2, 0.5, 1e-2, 0.5  # minibatches per task and step, clip value, Adam lr, task b's weight
DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def make_models(seed: int = 0) -> dict[str, nn.Module]:
    torch.manual_seed(seed)
    return {"enc": Encoder(4, 8), "head_a": nn.Linear(8, 5), "head_b": nn.Linear(8, 2)}


def examples(n: int, seed: int, target_scale: float = 1.0) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        t = int(torch.randint(2, 9, (1,), generator=g))
        out.append({"x": torch.randn(t, 4, generator=g), "y": torch.randint(0, 5, (t,), generator=g),
                    "z": target_scale * torch.randn(t, 2, generator=g)})
    return out


def make_tasks() -> list[mtlab.Task]:
    n = mtlab.Node
    a = mtlab.Task("a", [n("h", "enc", ["x"]), n("logits", "head_a", ["h"])], ["x"], ["y"], ["logits"],
                   mtlab.losses.CrossEntropy(output="logits", target="y"), {"train": mtlab.LinkedSet()})
    b = mtlab.Task("b", [n("h", "enc", ["x"]), n("out", "head_b", ["h"])], ["x"], ["z"], ["out"],
                   mtlab.losses.MSE(output="out", target="z"), {"train": mtlab.LinkedSet()}, weight=WB)
    return [a, b]


def step_batches(step: int, overflow: bool = False) -> dict[str, list]:
    """K minibatches per task; with ``overflow`` task b's second one has targets of 1e3 (its scaled
    fp16 gradient overflows while its float32 loss stays finite)."""
    return {"a": [collate(examples(3, 1000 * step + k)) for k in range(K)],
            "b": [collate(examples(3, 1000 * step + 500 + k, 1e3 if overflow and k == 1 else 1.0)) for k in range(K)]}


class AmpLoop:
    """The AMP loop a user writes for two tasks sharing an encoder: per task, K × ``scaler.scale(loss)
    .backward()``, ``scaler.unscale_``, divide by the frame count, ``clip_grad_value_``; then the weighted
    sum of the tasks' gradients, the optimizer step (skipped where any gradient is not finite, as
    ``scaler.step`` skips) and ``scaler.update()``. The loss runs in float32 outside autocast."""

    def __init__(self, models: dict[str, nn.Module], precision: str, **scaler_options) -> None:
        self.models, self.dtype = models, DTYPES.get(precision)
        self.scaler = torch.amp.GradScaler("cpu", **scaler_options) if precision == "16-mixed" else None
        self.task_params = {"a": [*models["enc"].parameters(), *models["head_a"].parameters()],
                            "b": [*models["enc"].parameters(), *models["head_b"].parameters()]}
        # scaler.unscale_ works per optimizer: one handle per task carries its gradients (never stepped)
        self.handles = {t: torch.optim.SGD(ps, lr=0.0) for t, ps in self.task_params.items()}
        self.params = [p for m in models.values() for p in m.parameters()]
        self.opt = torch.optim.Adam(self.params, lr=LR, fused=True)

    def loss(self, task: str, batch) -> tuple[torch.Tensor, torch.Tensor]:
        data, lens = batch
        with torch.autocast("cpu", dtype=self.dtype, enabled=self.dtype is not None):
            h = self.models["enc"](data["x"])
            out = self.models["head_a" if task == "a" else "head_b"](h)
        out = out.float()
        valid = torch.arange(out.shape[1])[None] < lens["x"][:, None]
        if task == "a":
            y = torch.where(valid, data["y"], -100)
            return F.cross_entropy(out.flatten(0, 1), y.flatten(), ignore_index=-100, reduction="sum"), valid.sum()
        kept = torch.where(valid[..., None], out, data["z"])
        return F.mse_loss(kept, data["z"], reduction="sum"), valid.sum() * 2

    def task_grads(self, task: str, batches) -> list[torch.Tensor]:
        for p in self.params:
            p.grad = None
        frames = 0
        for batch in batches:
            loss, n = self.loss(task, batch)
            (self.scaler.scale(loss) if self.scaler else loss).backward()
            frames = frames + n
        if self.scaler:
            self.scaler.unscale_(self.handles[task])
        for p in self.task_params[task]:
            p.grad.div_(frames.float())
        torch.nn.utils.clip_grad_value_(self.task_params[task], CLIP)
        return [p.grad.clone() for p in self.task_params[task]]

    def step(self, batches: dict[str, list]) -> bool:
        ga, gb = self.task_grads("a", batches["a"]), self.task_grads("b", batches["b"])
        ne = len(list(self.models["enc"].parameters()))
        for i, p in enumerate(self.models["enc"].parameters()):
            p.grad = torch.mul(ga[i], 1.0).add_(gb[i], alpha=WB)
        for p, g in zip(self.models["head_a"].parameters(), ga[ne:]):
            p.grad = g
        for p, g in zip(self.models["head_b"].parameters(), gb[ne:]):
            p.grad = torch.mul(g, WB)
        skipped = not all(torch.isfinite(g).all() for g in ga + gb)
        if not skipped:
            self.opt.step()
        if self.scaler:
            self.scaler.update()
        return skipped


def mtlab_step(tr: mtlab.Trainer, batches: dict[str, list]) -> None:
    for task in ("a", "b"):
        for batch in batches[task]:
            tr.process_minibatch(task, "train", batch=batch)
    tr.normalize(); tr.clip(); tr.apply()


def trainer(models, precision, nonfinite="raise", **kw) -> mtlab.Trainer:
    return mtlab.Trainer(models, make_tasks(), lr=LR, clip_grad_value=CLIP, device="cpu", nonfinite=nonfinite,
                         precision=precision, **kw)


def same_params(a: dict[str, nn.Module], b: dict[str, nn.Module]) -> bool:
    return all(torch.equal(p, q) for k in a for p, q in zip(a[k].parameters(), b[k].parameters()))


@pytest.mark.parametrize("precision", ["32", "bf16-mixed", "16-mixed"])
def test_steps_equal_the_users_amp_loop_bit_for_bit(precision):
    models = make_models()
    opts = {"init_scale": 2.0 ** 8} if precision == "16-mixed" else {}  # 2**16 overflows this MSE task
    ref = AmpLoop(copy.deepcopy(models), precision, **opts)
    tr = trainer(models, {"type": precision, **opts})
    for step in range(3):
        b = step_batches(step)
        mtlab_step(tr, b)
        assert not ref.step(b)
        assert same_params(tr.models, ref.models), f"step {step}"
    assert not same_params(tr.models, make_models())  # it trained
    h = tr.history
    assert not h["skipped"].any()
    if precision == "16-mixed":
        assert tr.precision.scaler.get_scale() == ref.scaler.get_scale() == 2.0 ** 8
        assert list(h["grad_scale"]) == [2.0 ** 8] * 3
    else:
        assert "grad_scale" not in h


def test_fp16_state_is_scaled_while_accumulating_and_unscaled_after():
    models = make_models()
    tr = trainer(copy.deepcopy(models), {"type": "16-mixed", "init_scale": 2.0 ** 8})
    plain = trainer(copy.deepcopy(models), {"type": "16-mixed", "init_scale": 1.0})
    b = step_batches(0)
    for t in (tr, plain):
        for batch in b["a"]:
            t.process_minibatch("a", "train", batch=batch)
    scaled, unscaled = (t.state("a").grads["head_a.weight"].clone() for t in (tr, plain))
    torch.testing.assert_close(scaled, 256 * unscaled, rtol=2e-2, atol=1e-3)  # fp16 backward rounds per scale
    assert tr.state("a").loss == plain.state("a").loss  # the loss is never scaled
    tr.normalize("a")
    torch.testing.assert_close(tr.state("a").grads["head_a.weight"] * tr.state("a").normalizer.float(),
                               scaled / 256, rtol=1e-6, atol=1e-6)


@pytest.mark.slow  # about a second of CPU or more: the full suite runs it, the quick check does not
def test_fp16_overflow_in_one_tasks_minibatch_skips_the_whole_step_as_the_scaler_does():
    models = make_models()
    opts = {"init_scale": 2.0 ** 8, "growth_interval": 2}
    ref = AmpLoop(copy.deepcopy(models), "16-mixed", **opts)
    tr = trainer(models, {"type": "16-mixed", **opts})  # nonfinite="raise": an fp16 overflow is not an error
    skipped = []
    for step, overflow in enumerate([False, True, False, False, True, False]):
        b = step_batches(step, overflow)
        before = {k: p.clone() for k, p in tr.params.items()}
        mtlab_step(tr, b)
        skipped.append(ref.step(b))
        assert same_params(tr.models, ref.models), f"step {step}"
        assert tr.precision.scaler.get_scale() == ref.scaler.get_scale(), f"step {step}"
        if overflow:  # task a was finite: the whole step is dropped all the same
            assert bool(torch.isfinite(tr.state("a").grad_norm)) and not bool(torch.isfinite(tr.state("b").grad_norm))
            assert all(torch.equal(before[k], p) for k, p in tr.params.items())
    assert skipped == [False, True, False, False, True, False]
    h = tr.history
    assert list(h["skipped"]) == skipped
    # 256, back off to 128, grow after 2 good steps to 256, back off to 128, ...
    assert list(h["grad_scale"]) == [256.0, 256.0, 128.0, 128.0, 256.0, 128.0]
    assert tr.precision.scaler.get_scale() == 128.0


def test_fp16_nonfinite_loss_still_raises_under_the_raise_policy():
    tr = trainer(make_models(), "16-mixed")
    b = step_batches(0)
    data, lens = b["b"][0]
    data = {**data, "z": torch.full_like(data["z"], float("inf"))}
    tr.process_minibatch("a", "train", batch=b["a"][0])
    tr.process_minibatch("b", "train", batch=(data, lens))
    tr.normalize(); tr.clip()
    with pytest.raises(mtlab.NonFiniteError, match="non-finite loss"):
        tr.apply()


def test_fp16_resume_is_bit_exact_with_the_scaler_state(tmp_path):
    opts = {"type": "16-mixed", "init_scale": 2.0 ** 8, "growth_interval": 1}
    tr = trainer(make_models(), opts)
    mtlab_step(tr, step_batches(0))
    mtlab_step(tr, step_batches(1, overflow=True))
    for batch in step_batches(2)["a"]:  # mid-accumulation: the buffers hold scaled gradients
        tr.process_minibatch("a", "train", batch=batch)
    tr.save(tmp_path / "ck.pt")
    other = trainer(make_models(seed=7), {"type": "16-mixed", "init_scale": 2.0 ** 15, "growth_interval": 9})
    other.load_checkpoint(tmp_path / "ck.pt")
    assert other.precision.scaler.state_dict() == tr.precision.scaler.state_dict()
    for t in (tr, other):
        for batch in step_batches(2)["b"]:
            t.process_minibatch("b", "train", batch=batch)
        t.normalize(); t.clip(); t.apply()
        mtlab_step(t, step_batches(3))
    assert all(torch.equal(p, other.params[k]) for k, p in tr.params.items())
    assert other.history.equals(tr.history)
    assert other.precision.scaler.get_scale() == tr.precision.scaler.get_scale() == 1024.0  # 256 -> 512, overflow 256, 512, 1024


def test_a_state_taken_mid_accumulation_is_refused_under_other_loss_scaling(tmp_path):
    tr = trainer(make_models(), "16-mixed")
    tr.process_minibatch("a", "train", batch=step_batches(0)["a"][0])
    state = tr.state_dict()
    with pytest.raises(ConfigError, match="precision='16-mixed'"):
        trainer(make_models(), "bf16-mixed").load_state_dict(state)
    tr.normalize(); tr.clip(); tr.apply()
    other = trainer(make_models(), "32")
    other.load_state_dict(tr.state_dict())  # between steps any precision continues
    assert all(torch.equal(p, other.params[k]) for k, p in tr.params.items())


def test_losses_run_in_float32_inside_autocast():
    seen = {}

    class Spy(mtlab.losses.CrossEntropy):
        def __call__(self, targets, outputs, seq_lengths):
            seen["dtype"] = outputs["logits"].dtype
            seen["autocast"] = torch.is_autocast_enabled("cpu")
            return super().__call__(targets, outputs, seq_lengths)

    tasks = make_tasks()
    tasks[0].loss = Spy(output="logits", target="y")
    tr = mtlab.Trainer(make_models(), tasks, device="cpu", precision="bf16")
    tr.process_minibatch("a", "train", batch=step_batches(0)["a"][0])
    assert seen == {"dtype": torch.float32, "autocast": False}
    assert all(g.dtype == torch.float32 for g in tr.state("a").grads.values())  # fp32 master weights and grads
    assert all(p.dtype == torch.float32 for p in tr.params.values())


def test_precision_settings_are_checked():
    assert check_precision("bf16") == "bf16-mixed" and check_precision(16) == "16-mixed"
    with pytest.raises(ConfigError, match="'32', 'bf16-mixed', '16-mixed'"):
        trainer(make_models(), "half")
    with pytest.raises(ConfigError, match="need precision = \"16-mixed\""):
        trainer(make_models(), {"type": "bf16-mixed", "init_scale": 2.0})
    with pytest.raises(ConfigError, match="valid: \\['init_scale'"):
        Precision("16-mixed", "cpu", init_sacle=2.0)


# ---------------------------------------------------------------- recipe key and command-line flag
from pathlib import Path  # noqa: E402

from mtlab.apps.cli import main  # noqa: E402
from mtlab.apps.recipe import from_recipe, load_recipe  # noqa: E402
from mtlab.core.state import load_safe  # noqa: E402


def test_the_recipe_key_sets_precision(tiny_corpus: Path, tmp_path: Path) -> None:
    recipe = load_recipe(write_tiny_recipe(tmp_path / "tiny.toml", tiny_corpus, num_steps=0))
    recipe["trainer"]["precision"] = "bf16-mixed"
    tr = from_recipe(recipe).trainer
    assert tr.precision.mode == "bf16-mixed" and tr.precision.scaler is None and not tr.compiled
    assert from_recipe(load_recipe(tmp_path / "tiny.toml")).trainer.precision.mode == "32"
    recipe["trainer"]["precision"] = "half"
    with pytest.raises(ConfigError, match="precision = 'half' is not allowed; valid: 32, bf16-mixed, 16-mixed"):
        from_recipe(recipe)


@pytest.mark.slow
def test_the_precision_flag_is_written_into_the_recipe_the_checkpoint_carries(tiny_corpus: Path, tmp_path: Path,
                                                                              capsys) -> None:
    path = write_tiny_recipe(tmp_path / "tiny.toml", tiny_corpus, num_steps=2, valid_frequency=0)
    assert main(["train", str(path), "--expdir", str(tmp_path / "exp"), "--steps", "2", "--no-progress",
                 "--precision", "16-mixed"]) == 0
    state = load_safe(tmp_path / "exp" / "final.pt")
    assert state["recipe"]["trainer"]["precision"] == "16-mixed" and "compile" not in state["recipe"]["trainer"]
    assert state["precision"]["mode"] == "16-mixed" and state["precision"]["scaler"]["scale"] > 0
    assert len(state["history"]) == 2 and all("grad_scale" in row for row in state["history"])
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["train", str(path), "--expdir", str(tmp_path / "exp2"), "--precision", "half"])
    assert "invalid choice: 'half'" in capsys.readouterr().err


def test_mixed_precision_changes_the_forward_so_the_comparisons_above_mean_something():
    grads = {}
    for precision in ("32", "bf16-mixed", "16-mixed"):
        tr = trainer(make_models(), {"type": precision, "init_scale": 1.0} if precision == "16-mixed" else precision)
        tr.process_minibatch("a", "train", batch=step_batches(0)["a"][0])
        tr.normalize()
        grads[precision] = tr.state("a").grads["enc.lin.weight"].clone()
    assert not torch.equal(grads["32"], grads["bf16-mixed"]) and not torch.equal(grads["32"], grads["16-mixed"])
    torch.testing.assert_close(grads["bf16-mixed"], grads["32"], rtol=0.1, atol=1e-2)
    torch.testing.assert_close(grads["16-mixed"], grads["32"], rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_recurrent_models_run_under_cpu_autocast_in_float32(dtype):
    from mtlab.models import BLSTM, BRNN, ResetBLSTM

    x, lengths = torch.randn(1, 6, 4), torch.tensor([6])  # batch 1: oneDNN's half-precision LSTM path
    for model in (BLSTM(4, 3), BRNN(4, 3), ResetBLSTM(4, 3, t_reset=2)):
        expected = model(x, lengths)
        with torch.autocast("cpu", dtype=dtype):
            got = model(x.to(dtype), lengths)  # a half-precision input, as from a layer under autocast
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, model(x.to(dtype).float(), lengths))
        assert expected.shape == got.shape
