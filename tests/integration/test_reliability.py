"""Fault campaign: non-finite values, failing calls, damaged checkpoints, a full disk, vanished data.
Each case says what it tried (tests/helpers/campaign.py); scripts/reliability_report.py prints the table."""

from __future__ import annotations

import errno
import shutil

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from helpers.campaign import record

import mtlab
from helpers import make_examples, make_models, task_a, task_b
from mtlab.core.state import CheckpointError, load_safe

EX = make_examples(16, 31)


def build(nonfinite="skip", **kw):
    return mtlab.Trainer(make_models(), [task_a((EX, EX), batch_size=4), task_b(EX, batch_size=4)],
                         clip_grad_value=1.0, numbatches_to_aggregate=2, device="cpu", nonfinite=nonfinite, **kw)


@pytest.mark.slow
@settings(max_examples=settings.default.max_examples)
@given(plan=st.lists(st.tuples(st.integers(0, 5), st.sampled_from(["input_nan", "input_inf", "grad_enc", "grad_head_b"])),
                     min_size=1, max_size=3))
def test_nonfinite_values_never_reach_the_parameters_under_skip(plan):
    tr = build()
    bad_steps = {s for s, _ in plan}
    kinds = {s: k for s, k in plan}
    for step in range(6):
        kind = kinds.get(step)
        handle = None
        if kind in ("grad_enc", "grad_head_b"):
            name = "enc.lin.weight" if kind == "grad_enc" else "head_b.weight"
            handle = tr.params[name].register_hook(lambda g: g * float("nan"))
        if kind in ("input_nan", "input_inf"):
            data, lens = mtlab.collate(EX[:3])
            data["x"][1, 0, 2] = float("nan") if kind == "input_nan" else float("inf")
            tr.reset()
            for t, sets in (("a", ["clean", "noisy"]), ("b", ["clean"])):
                for s in sets:
                    tr.process_minibatch(t, s, batch=(data, lens) if (t, s) == ("a", "noisy") else None)
            tr.normalize(); tr.clip(); tr.apply()
        else:
            tr.step()
        if handle is not None:
            handle.remove()
        ok = all(torch.isfinite(p).all() for p in tr.params.values())
        record("non-finite value injected" if kind else "clean step", ok)
        assert ok
    skipped = tr.history["skipped"].tolist()
    assert [i for i, s in enumerate(skipped) if s] == sorted(bad_steps)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["process_minibatch", "normalize", "clip", "apply"])
def test_an_exception_inside_a_call_leaves_the_state_before_it(where, monkeypatch):
    tr = build(nonfinite="raise")
    tr.step()
    if where != "process_minibatch":
        tr.process_minibatch("a", "clean"); tr.process_minibatch("b", "clean")
    if where in ("clip", "apply"):
        tr.normalize()
    if where == "apply":
        tr.clip()
    phases = tr.phase()
    params = {k: p.detach().clone() for k, p in tr.params.items()}
    grads = {t: {k: v.clone() for k, v in tr.state(t).grads.items()} for t in tr.tasks}
    opt_steps = {id(p): int(s["step"]) for p, s in tr.optimizer.state.items()}

    class Injected(RuntimeError):
        pass

    def fail(*args, **kwargs):
        raise Injected(where)

    if where == "process_minibatch":
        monkeypatch.setattr(tr.tasks["a"], "loss", fail)
    elif where == "normalize":
        monkeypatch.setattr(mtlab.base.gradops, "div_", fail)
    elif where == "clip":
        monkeypatch.setattr(mtlab.base.gradops, "clamp_", fail)
    else:
        monkeypatch.setattr(tr.optimizer, "step", fail)
    with pytest.raises((Injected, mtlab.BatchError)):
        if where == "process_minibatch":
            tr.process_minibatch("a", "clean")
        else:
            getattr(tr, where)()
    monkeypatch.undo()
    held = (tr.phase() == phases
            and all(torch.equal(params[k], p) for k, p in tr.params.items())
            and all(torch.equal(grads[t][k], v) for t in tr.tasks for k, v in tr.state(t).grads.items())
            and {id(p): int(s["step"]) for p, s in tr.optimizer.state.items()} == opt_steps)
    record(f"exception inside {where}", held)
    assert held
    tr.reset(); tr.step()  # and it goes on
    assert tr.step_count == 2


def good_checkpoint(tmp_path):
    tr = build()
    tr.step()
    path = tmp_path / "ck.pt"
    tr.save(path)
    return tr, path


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["truncated", "flipped_bytes", "empty", "wrong_version", "not_mtlab",
                                    "crafted_pickle", "missing"])
def test_damaged_checkpoints_give_a_clear_error_and_run_nothing(damage, tmp_path):
    tr, path = good_checkpoint(tmp_path)
    bad = tmp_path / "bad.pt"
    marker = tmp_path / "executed"
    raw = path.read_bytes()
    if damage == "truncated":
        bad.write_bytes(raw[: len(raw) // 2])
    elif damage == "flipped_bytes":
        b = bytearray(raw)
        for i in range(len(b) // 3, len(b) // 3 + 64):
            b[i] ^= 0xFF
        bad.write_bytes(bytes(b))
    elif damage == "empty":
        bad.write_bytes(b"")
    elif damage == "wrong_version":
        state = torch.load(path, weights_only=True)
        state["version"] = 99
        torch.save(state, bad)
    elif damage == "not_mtlab":
        torch.save({"weights": torch.zeros(3)}, bad)
    elif damage == "crafted_pickle":
        class Evil:
            def __reduce__(self):
                return (open, (str(marker), "w"))
        torch.save({"format": "mtlab-trainer", "version": 1, "evil": Evil()}, bad)
    before = {k: p.detach().clone() for k, p in tr.params.items()}
    target = tmp_path / "nope.pt" if damage == "missing" else bad
    with pytest.raises((CheckpointError, mtlab.ConfigError)) as err:
        tr.load_checkpoint(target)
    msg = str(err.value)
    held = (str(target) in msg or "version" in msg) and not marker.exists() and \
        all(torch.equal(before[k], p) for k, p in tr.params.items())
    record(f"damaged checkpoint: {damage}", held)
    assert held, msg


@pytest.mark.slow
def test_disk_full_while_saving_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    tr, path = good_checkpoint(tmp_path)
    old = path.read_bytes()
    tr.step()

    def full_disk(obj, f, *args, **kwargs):
        f.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(mtlab.core.state.torch, "save", full_disk)
    with pytest.raises(CheckpointError, match="No space left.*previous checkpoint .* intact"):
        tr.save(path)
    monkeypatch.undo()
    held = path.read_bytes() == old and load_safe(path)["step"] == 1 and \
        not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    record("disk full while saving", held)
    assert held
    tr.save(path)  # space is back: saving works again
    assert load_safe(path)["step"] == 2


@pytest.mark.slow
def test_a_data_file_deleted_mid_run(tmp_path):
    root = tmp_path / "data_samples"
    shutil.copytree(mtlab.data.data_samples_dir(), root)
    train = mtlab.data.load_split(root=root, split="train", linkedset="clean")
    models = {"enc": mtlab.models.BLSTM(129, 8), "head": torch.nn.Linear(16, 3)}
    task = mtlab.Task("frames", [mtlab.Node("h", "enc", ["features"]), mtlab.Node("o", "head", ["h"])],
                      ["features"], ["frame_target"], ["o"],
                      mtlab.losses.CrossEntropy(output="o", target="frame_target"),
                      {"clean": mtlab.LinkedSet(train)}, batch_size=4)
    tr = mtlab.Trainer(models, [task], device="cpu")
    tr.step()
    victim = sorted((root / "train").glob("**/*.wav"))[0]
    victim.unlink()
    tr.step()  # features live in memory: the run goes on
    with pytest.raises(mtlab.data.DataError) as err:
        mtlab.data.load_split(root=root, split="train", linkedset="clean")
    held = victim.name in str(err.value) and tr.step_count == 2
    record("data file deleted mid-run", held)
    assert held, str(err.value)


# ---------------------------------------------------------------------------------- composite refusals
@pytest.mark.parametrize("where", ["process_minibatch", "normalize", "clip", "apply"])
@pytest.mark.parametrize("composite", ["step", "run"])
def test_a_refusal_inside_a_composite_call_keeps_its_promise(where, composite, monkeypatch):
    """step(): what it drew stays accumulated for inspection, and the error says so; mtlab.run: the step is
    rolled back (data positions as before). Neither touches parameters, optimizer or step count."""
    tr = build(nonfinite="raise")
    tr.step()
    params = {k: p.detach().clone() for k, p in tr.params.items()}
    opt_steps = {id(p): int(s["step"]) for p, s in tr.optimizer.state.items()}
    positions = {k: (s.epoch, s.position) for k, s in tr.streams.items()}

    class Injected(mtlab.MtlabError):
        pass

    def fail(*args, **kwargs):
        raise Injected(f"injected in {where}")

    target = {"process_minibatch": (tr.plans["b"], "loss"), "normalize": (mtlab.base.gradops, "div_"),
              "clip": (mtlab.base.gradops, "clamp_"), "apply": (tr.update, "step")}[where]
    monkeypatch.setattr(*target, fail)
    with pytest.raises(Injected) as err:
        tr.step() if composite == "step" else mtlab.run(tr, steps=1, progress=False)
    monkeypatch.undo()
    notes = "\n".join([str(err.value), *getattr(err.value, "__notes__", [])])
    held = (all(torch.equal(params[k], p) for k, p in tr.params.items()) and tr.step_count == 1
            and {id(p): int(s["step"]) for p, s in tr.optimizer.state.items()} == opt_steps)
    if composite == "step":
        held = held and "kept for inspection" in notes and tr.state("a").minibatches == 4  # a drew 2 rounds x 2 sets
    else:
        held = (held and "rolled back" in notes and set(tr.phase().values()) == {mtlab.Phase.EMPTY}
                and {k: (s.epoch, s.position) for k, s in tr.streams.items()} == positions)
    record(f"composite refusal: {composite} at {where}", held)
    assert held, notes
    tr.reset(); tr.step()  # and it goes on
    assert tr.step_count == 2


# ---------------------------------------------------------------------------------- foreign checkpoints
FOREIGN = {
    "a head of another size": lambda m: m.__setitem__("head_a", torch.nn.Linear(8, 7).double()),
    "every head of another size": lambda m: (m.__setitem__("head_a", torch.nn.Linear(8, 7).double()),
                                             m.__setitem__("head_b", torch.nn.Linear(8, 4).double())),
    "a wider unused model": lambda m: m.__setitem__("unused", torch.nn.Linear(8, 9).double()),
    "a layer without bias": lambda m: m.__setitem__("head_b", torch.nn.Linear(8, 3, bias=False).double()),
}


@pytest.mark.parametrize("variant", list(FOREIGN))
@pytest.mark.parametrize("how", ["load_checkpoint", "init_file"])
def test_a_foreign_checkpoint_is_refused_naming_it_and_changes_nothing(variant, how, tmp_path):
    from mtlab.apps.recipe import load_initial_weights

    models = make_models(seed=5)
    FOREIGN[variant](models)
    other = mtlab.Trainer(models, [task_a((EX, EX), batch_size=4), task_b(EX, batch_size=4)], device="cpu")
    path = tmp_path / "other.pt"
    other.save(path)
    tr = build()
    tr.step()
    before = tr.state_dict()
    with pytest.raises(mtlab.ConfigError) as err:
        tr.load_checkpoint(path) if how == "load_checkpoint" else load_initial_weights(tr, path)
    after = tr.state_dict()
    held = (str(path) in str(err.value) and "saved" in str(err.value)
            and all(torch.equal(before["models"][m][k], v) for m in after["models"] for k, v in after["models"][m].items())
            and after["step"] == before["step"] and after["streams"] == before["streams"])
    record(f"foreign checkpoint ({how}): {variant}", held)
    assert held, str(err.value)


# ---------------------------------------------------------------------------------- lists and WAVs
NOT_UTF8 = {"latin-1 name": "utt2 caf\u00e9.wav".encode("latin-1"),
            "cp1252 quote": "utt2 \u2019.wav".encode("cp1252"),
            "utf-16 line": "utt2 b.wav".encode("utf-16"),
            "cut utf-8 sequence": "utt2 \u00e9.wav".encode()[:-5] + b".wav"}


@pytest.mark.parametrize("variant", list(NOT_UTF8))
def test_a_list_that_is_not_utf8_is_refused_naming_file_and_line(variant, tmp_path, capsys):
    from mtlab.apps.cli import main
    from mtlab.data import DataError, data_samples_dir, read_list

    bad = tmp_path / "e1.scp"
    bad.write_bytes(b"utt1 a.wav\n" + NOT_UTF8[variant] + b"\n")
    with pytest.raises(DataError) as err:
        read_list(bad)
    folder = data_samples_dir() / "dev"
    code = main(["score", "--mixture", str(folder / "mix_clean.scp"), "--references", str(folder / "s1.scp"),
                 "--estimates", str(bad)])
    shown = capsys.readouterr().err
    held = f"{bad}:2: not UTF-8" in str(err.value) and code == 2 and f"{bad}:2" in shown and "Traceback" not in shown
    record(f"non-UTF-8 list: {variant}", held)
    assert held, shown


@pytest.mark.parametrize("subtype", ["FLOAT", "DOUBLE", "PCM_24", "PCM_32", "PCM_16"])
def test_a_list_of_float_or_24_bit_wavs_is_scored(subtype, tmp_path):
    sf = pytest.importorskip("soundfile", reason="soundfile reads float WAVs (mtlab[metrics])")
    from mtlab.data import data_samples_dir, read_list
    from mtlab.separation import metrics as M

    folder = data_samples_dir() / "dev"
    name = sorted(read_list(folder / "mix_clean.scp"))[0]
    refs = [read_list(folder / f"s{k}.scp")[name].resolve() for k in (1, 2)]
    for k, ref in enumerate(refs, start=1):
        wav, rate = sf.read(str(ref), dtype="float64")
        sf.write(str(tmp_path / f"e{k}.wav"), 0.5 * wav, rate, subtype=subtype)
        (tmp_path / f"e{k}.scp").write_text(f"{name} e{k}.wav\n")
    ev = M.evaluate_lists(folder / "mix_clean.scp", [folder / "s1.scp", folder / "s2.scp"],
                          [tmp_path / "e1.scp", tmp_path / "e2.scp"], metrics=("si_sdr",))
    held = float(ev.utterances["si_sdr"].iloc[0]) > 40  # the references at half gain: a near-perfect score
    record(f"float-WAV list: {subtype}", held)
    assert held, ev.utterances
