"""ResetBLSTM (the original's dbresetlstm) against a per-frame plain-PyTorch oracle, and its import."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from helpers import assert_grads_reach_weights_and_valid_frames
from torch import Tensor, nn
from helpers.paths import NABU_RECIPES

from mtlab.base.errors import ConfigError
from mtlab.models import ResetBLSTM, ResetBLSTMInsert, build_model
from mtlab.nabu import import_nabu

pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------ the oracle: one frame at a time
def step(lstm: nn.LSTM, x: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    """One frame of ``lstm`` (its own weights) from state ``(h, c)``."""
    _, (h2, c2) = lstm(x.reshape(1, 1, -1), (h.reshape(1, 1, -1), c.reshape(1, 1, -1)))
    return h2.reshape(-1), c2.reshape(-1)


def reset_cell(lstm: nn.LSTM, xs: list, t_reset: int, group: int, reset: bool) -> tuple[list, list]:
    """The original's (group) reset LSTM cell over one unpadded sequence in its own time: before frame
    ``t``, when ``t % group == group - 1``, replica ``(t // group) % n`` is zeroed; every replica then
    steps on its own input ``xs[t][k]``; the output is replica ``((t + 1) // group) % n``. Without
    ``reset``: a plain LSTM over ``xs[t]``."""
    H, dtype = lstm.hidden_size, lstm.weight_hh_l0.dtype
    if not reset:
        h = c = torch.zeros(H, dtype=dtype)
        acts = []
        for x in xs:
            h, c = step(lstm, x, h, c)
            acts.append(h)
        return acts, []
    n = t_reset // group
    hs, cs = [torch.zeros(H, dtype=dtype) for _ in range(n)], [torch.zeros(H, dtype=dtype) for _ in range(n)]
    acts, reps = [], []
    for t, x in enumerate(xs):
        if t % group == group - 1:
            hs[(t // group) % n] = torch.zeros(H, dtype=dtype)
            cs[(t // group) % n] = torch.zeros(H, dtype=dtype)
        for k in range(n):
            hs[k], cs[k] = step(lstm, x[k], hs[k], cs[k])
        reps.append(list(hs))
        acts.append(hs[((t + 1) // group) % n])
    return acts, reps


def permute(acts: tuple, reps: tuple, L: int, t_reset: int, prev: int, group: int, prev_group: int,
            fw_reset: bool, bw_reset: bool, separate: bool) -> tuple[list, list]:
    """The original's permute_versions for one sequence, with Python integers."""
    n, prev_n = t_reset // group, prev // prev_group
    for_f, for_b = [], []
    for t in range(L):
        rt = L - 1 - t
        ff, bf, fb, bb = [], [], [], []
        for k in range(n):
            tau_f = min((t - group * k) % t_reset, prev - 1)
            tau_b = min((rt - group * k) % t_reset, prev - 1)

            def idx(time: int, tau: int) -> int:
                return math.ceil((time - tau) / prev_group) % prev_n

            ff.append(reps[0][t][idx(t, tau_f)] if fw_reset else None)
            bb.append(reps[1][t][idx(rt, tau_b)] if bw_reset else None)
            bf.append(reps[1][t][idx(rt, tau_f)] if bw_reset else acts[1][t])
            fb.append(reps[0][t][idx(t, tau_b)] if fw_reset else acts[0][t])
        f_in = [torch.cat((a, b)) for a, b in zip(ff, bf)] if fw_reset else torch.cat((acts[0][t], acts[1][t]))
        b_in = [torch.cat((a, b)) for a, b in zip(fb, bb)] if bw_reset else torch.cat((acts[0][t], acts[1][t]))
        if separate:
            f_in = ff if fw_reset else acts[0][t]
            b_in = bb if bw_reset else acts[1][t]
        for_f.append(f_in)
        for_b.append(b_in)
    return for_f, for_b


def oracle(model: ResetBLSTM, x: Tensor, L: int, extra: Tensor | None = None, at: int = -1) -> Tensor:
    """``[L, 2H]`` for one sequence of ``x`` ``[T, D]`` cut to its ``L`` valid frames; layer ``at`` also
    reads ``extra`` joined to every replica's input."""
    frames = list(x[:L])
    for_f: list = []
    for_b: list = []
    acts: tuple = ()
    reps: tuple = ()
    for layer, (t_reset, group) in enumerate(zip(model.t_resets, model.group_sizes)):
        n = t_reset // group
        if layer == 0:
            for_f = [[f] * n if model.forward_reset else f for f in frames]
            for_b = [[f] * n if model.backward_reset else f for f in frames]
        else:
            for_f, for_b = permute(acts, reps, L, t_reset, model.t_resets[layer - 1], group,
                                   model.group_sizes[layer - 1], model.forward_reset, model.backward_reset,
                                   model.separate_directions)
        if layer == at:
            for_f = [[torch.cat((r, extra)) for r in f] for f in for_f]
            for_b = [[torch.cat((r, extra)) for r in f] for f in for_b]
        act_f, rep_f = reset_cell(model.forward_lstms[layer], for_f, t_reset, group, model.forward_reset)
        act_b, rep_b = reset_cell(model.backward_lstms[layer], for_b[::-1], t_reset, group, model.backward_reset)
        acts, reps = (act_f, act_b[::-1]), (rep_f, rep_b[::-1])
    return torch.stack([torch.cat((a, b)) for a, b in zip(*acts)])


CASES = [
    dict(num_layers=1, t_reset=4),
    dict(num_layers=1, t_reset=6, group_size=2),
    dict(num_layers=2, t_reset=3),
    dict(num_layers=2, t_reset=[3, 5], group_size=[1, 1]),
    dict(num_layers=2, t_reset=[2, 6], group_size=[1, 3]),  # as MERL_DC_diffstatereset_2spk (5 12, 1 3)
    dict(num_layers=2, t_reset=4, group_size=2),
    dict(num_layers=2, t_reset=3, forward_reset=False),
    dict(num_layers=2, t_reset=3, backward_reset=False, separate_directions=True),
    dict(num_layers=3, t_reset=1),
]


@pytest.mark.parametrize("settings", CASES, ids=lambda s: "-".join(f"{k}={v}" for k, v in s.items()))
def test_matches_the_per_frame_oracle_on_padded_batches(settings: dict) -> None:
    torch.manual_seed(0)
    model = ResetBLSTM(3, 4, **settings).double()
    x = torch.randn(3, 13, 3, dtype=torch.float64)
    lengths = torch.tensor([13, 9, 2])
    y = model(x, lengths)
    for b, L in enumerate(lengths.tolist()):
        torch.testing.assert_close(y[b, :L], oracle(model, x[b], L))
        assert y[b, L:].abs().sum() == 0


@pytest.mark.parametrize("combine_layer", [1, 2])
def test_the_additional_input_joins_the_combine_layer(combine_layer: int) -> None:
    torch.manual_seed(5)
    model = ResetBLSTMInsert(3, 4, extra_dim=2, combine_layer=combine_layer, num_layers=2, t_reset=[2, 4],
                             group_size=[1, 2]).double()
    assert model.forward_lstms[combine_layer - 1].input_size == (3 if combine_layer == 1 else 8) + 2
    x = torch.randn(2, 9, 3, dtype=torch.float64)
    vectors = torch.randn(2, 2, dtype=torch.float64)
    lengths = torch.tensor([9, 6])
    y = model(x, vectors, seq_lengths=lengths)
    for b, L in enumerate(lengths.tolist()):
        torch.testing.assert_close(y[b, :L], oracle(model, x[b], L, vectors[b], combine_layer - 1))
    with pytest.raises(ConfigError, match="combine_layer = 3"):
        ResetBLSTMInsert(3, 4, extra_dim=2, combine_layer=3, num_layers=2)
    with pytest.raises(ConfigError, match="needs forward_reset and backward_reset"):
        ResetBLSTMInsert(3, 4, extra_dim=2, forward_reset=False)


def test_one_layer_output_is_an_lstm_over_the_last_t_reset_frames() -> None:
    torch.manual_seed(1)
    model = ResetBLSTM(2, 3, t_reset=4).double()
    x = torch.randn(1, 10, 2, dtype=torch.float64)
    y = model(x, torch.tensor([10]))[0]
    for t in range(10):
        window = x[:, max(0, t - 3):t + 1]
        fw = model.forward_lstms[0](window)[0][0, -1]
        ahead = x[:, t:t + 4].flip(1)
        bw = model.backward_lstms[0](ahead)[0][0, -1]
        torch.testing.assert_close(y[t], torch.cat((fw, bw)))


def test_padded_frames_never_change_valid_outputs() -> None:
    torch.manual_seed(2)
    model = ResetBLSTM(5, 6, num_layers=2, t_reset=[3, 6], group_size=[1, 2])
    x = torch.randn(4, 20, 5)
    lengths = torch.tensor([20, 11, 7, 1])
    y = model(x, lengths)
    noisy = x.clone()
    for b, L in enumerate(lengths.tolist()):
        noisy[b, L:] = 1e3 * torch.randn(20 - L, 5)
    torch.testing.assert_close(model(noisy, lengths), y)
    alone = model(x[1:2, :11], lengths[1:2])
    torch.testing.assert_close(alone[0], y[1, :11], atol=1e-6, rtol=1e-5)


def test_gradients_reach_every_weight_and_only_valid_inputs() -> None:
    torch.manual_seed(3)
    assert_grads_reach_weights_and_valid_frames(ResetBLSTM(4, 5, num_layers=2, t_reset=4))


def test_the_context_is_bounded_by_t_reset() -> None:
    torch.manual_seed(4)
    model = ResetBLSTM(2, 3, num_layers=2, t_reset=3)
    x = torch.randn(1, 12, 2, requires_grad=True)
    model(x, torch.tensor([12]))[0, 6].sum().backward()
    assert x.grad is not None
    reached = (x.grad[0].abs().sum(-1) > 0).nonzero().flatten().tolist()
    assert reached == [4, 5, 6, 7, 8]  # two frames of past and future, as a 3-frame window in each direction


def test_settings_that_cannot_work_are_errors() -> None:
    with pytest.raises(ConfigError, match="multiple of its group_size"):
        ResetBLSTM(2, 3, t_reset=5, group_size=2)
    with pytest.raises(ConfigError, match="at least the previous"):
        ResetBLSTM(2, 3, num_layers=2, t_reset=[6, 3])
    with pytest.raises(ConfigError, match="one per layer"):
        ResetBLSTM(2, 3, num_layers=3, t_reset=[2, 3])
    with pytest.raises(ConfigError, match="use BLSTM"):
        ResetBLSTM(2, 3, forward_reset=False, backward_reset=False)
    assert isinstance(build_model("ResetBLSTM", input_dim=2, hidden=3, t_reset=[2]), ResetBLSTM)


# ------------------------------------------------------------------ the importer: model.cfg's dbresetlstm
RESET_MAIN = """[main]
architecture = dbresetlstm
num_units = 8
t_reset = 3 6
group_size = 1 2
symmetric_context = True
separate_directions = False
forward_reset = True
backward_reset = True
num_layers = 2
input_noise = 0.2
dropout = 1.0
recurrent_dropout = 1.0
layer_norm = False

"""


def reset_recipe(folder: Path) -> Path:
    from helpers.nabu import MODEL, write_recipe

    start, end = MODEL.index("[main]"), MODEL.index("[outlayer]")
    return write_recipe(folder, **{"model.cfg": MODEL[:start] + RESET_MAIN + MODEL[end:]})


def test_the_importer_maps_the_model_cfg_keys(tmp_path: Path) -> None:
    recipe = import_nabu(reset_recipe(tmp_path / "MERL_RESET"))
    spec = recipe["models"]["main"]
    assert spec == {"type": "ResetBLSTM", "input_dim": 129, "hidden": 8, "num_layers": 2, "t_reset": [3, 6],
                    "group_size": [1, 2], "forward_reset": True, "backward_reset": True,
                    "separate_directions": False, "input_noise": 0.2}
    assert recipe["models"]["outlayer"]["input_dim"] == 16
    model = build_model(spec["type"], **{k: v for k, v in spec.items() if k != "type"})
    assert isinstance(model, ResetBLSTM) and model.t_resets == [3, 6] and model.group_sizes == [1, 2]
    assert model(torch.randn(2, 7, 129), torch.tensor([7, 4])).shape == (2, 7, 16)


def test_one_value_for_every_layer_and_the_directions(tmp_path: Path) -> None:
    folder = reset_recipe(tmp_path / "MERL_RESET")
    text = (folder / "model.cfg").read_text()
    text = text.replace("t_reset = 3 6\ngroup_size = 1 2\n", "t_reset = 4\n").replace(
        "forward_reset = True", "forward_reset = False").replace("separate_directions = False",
                                                                 "separate_directions = True")
    (folder / "model.cfg").write_text(text)
    spec = import_nabu(folder)["models"]["main"]
    assert (spec["t_reset"], spec["group_size"]) == ([4, 4], [1, 1])
    assert (spec["forward_reset"], spec["backward_reset"], spec["separate_directions"]) == (False, True, True)


REFUSED_RESET = [
    ("symmetric_context = True", "symmetric_context = False", "\\[main\\] symmetric_context: 'False': the original"),
    ("dropout = 1.0\nrecurrent", "dropout = 0.9\nrecurrent", "\\[main\\] dropout: the original's dbresetlstm raises"),
    ("recurrent_dropout = 1.0", "recurrent_dropout = 0.8", "\\[main\\] recurrent_dropout: mtlab's ResetBLSTM"),
    ("layer_norm = False", "layer_norm = True", "\\[main\\] layer_norm: mtlab's ResetBLSTM"),
    ("forward_reset = True\nbackward_reset = True", "forward_reset = False\nbackward_reset = False",
     "\\[main\\] forward_reset: with backward_reset False too"),
]


@pytest.mark.parametrize("old, new, message", REFUSED_RESET, ids=[r[1] for r in REFUSED_RESET])
def test_a_value_mtlab_cannot_honour_is_refused_naming_file_key_and_why(tmp_path: Path, old: str, new: str,
                                                                        message: str) -> None:
    folder = reset_recipe(tmp_path / "MERL_RESET")
    text = (folder / "model.cfg").read_text()
    assert old in text
    (folder / "model.cfg").write_text(text.replace(old, new, 1))
    with pytest.raises(ConfigError, match=message) as err:
        import_nabu(folder)
    assert str(folder / "model.cfg") in str(err.value)
    assert import_nabu(folder, strict=False)["nabu"]["unsupported"]


@pytest.mark.parametrize("old, new, message", [
    ("t_reset = 3 6", "t_reset = 6 3", "must not decrease"),
    ("t_reset = 3 6", "t_reset = 3 5", "multiple of its group_size"),
    ("t_reset = 3 6", "t_reset = 3 6 9", "one per layer"),
    ("t_reset = 3 6", "t_reset = three", "must be an integer"),
    ("t_reset = 3 6\n", "", "needs 't_reset'"),
])
def test_malformed_reset_settings_are_errors(tmp_path: Path, old: str, new: str, message: str) -> None:
    folder = reset_recipe(tmp_path / "MERL_RESET")
    (folder / "model.cfg").write_text((folder / "model.cfg").read_text().replace(old, new, 1))
    with pytest.raises(ConfigError, match=message):
        import_nabu(folder)


RECIPES = NABU_RECIPES / "papers" / \
    "Journal_paper_reset_LSTM_2020"


@pytest.mark.skipif(not RECIPES.is_dir(), reason="the original's recipes are not next to this checkout")
def test_the_original_reset_recipes_map_every_dbresetlstm() -> None:
    found = 0
    for folder in sorted(p.parent for p in RECIPES.rglob("trainer.cfg")):
        recipe = import_nabu(folder, strict=False)
        assert not [u for u in recipe["nabu"].get("unsupported", []) if "dbresetlstm'" in u["why"]
                    or "ResetBLSTM" in u["why"]], folder
        found += sum(m["type"] == "ResetBLSTM" for m in recipe["models"].values())
    assert found >= 12


def test_the_importer_maps_the_insert_variant_with_the_ivector_size(tmp_path: Path) -> None:
    from helpers.nabu_ivectors import write_ivec_recipe

    folder = write_ivec_recipe(tmp_path / "MERL_IVEC_AFTER_LAY1")
    graph = "nodes = n0 n1 bin_emb\nn0_model = concat\nn0_inputs = features ivecs\nn1_model = main\nn1_inputs = n0"
    for file in ("trainer.cfg", "validation_evaluator.cfg"):
        text = (folder / file).read_text()
        assert graph in text
        (folder / file).write_text(text.replace(graph, "nodes = n1 bin_emb\nn1_model = main\n"
                                                      "n1_inputs = features ivecs"))
    model_cfg = (folder / "model.cfg").read_text()
    start, end = model_cfg.index("[main]"), model_cfg.index("[outlayer]")
    main = RESET_MAIN.replace("architecture = dbresetlstm", "architecture = dbresetlstm_insert_additional_input\n"
                                                            "combine_layer = 2")
    (folder / "model.cfg").write_text(model_cfg[:start] + main + model_cfg[end:])
    spec = import_nabu(folder)["models"]["main"]
    assert (spec["type"], spec["input_dim"], spec["extra_dim"], spec["combine_layer"]) == \
        ("ResetBLSTMInsert", 129, 10, 2)  # two speakers' 5-dim i-vectors
    model = build_model(spec["type"], **{k: v for k, v in spec.items() if k != "type"})
    assert model(torch.randn(2, 5, 129), torch.randn(2, 10), seq_lengths=torch.tensor([5, 3])).shape == (2, 5, 16)
    (folder / "model.cfg").write_text((folder / "model.cfg").read_text().replace("combine_layer = 2",
                                                                                 "combine_layer = 3"))
    with pytest.raises(ConfigError, match="combine_layer = 3: a layer from 1 to num_layers \\(2\\)"):
        import_nabu(folder)
