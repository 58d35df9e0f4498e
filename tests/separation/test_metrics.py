"""Separation metrics against their reference libraries (mir_eval, pystoi, pesq) on fixtures from data_samples/."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from helpers.paths import TESTS

from mtlab.data import data_samples_dir, read_list, read_wav
from mtlab.base.errors import BatchError, ConfigError
from mtlab.separation import metrics as M

mir_eval_separation = pytest.importorskip("mir_eval.separation", reason="mir_eval is a dev dependency")


def dev_utterance(index: int) -> tuple[str, torch.Tensor, torch.Tensor]:
    folder = data_samples_dir() / "dev"
    name = sorted(read_list(folder / "mix_clean.scp"))[index]
    mix = read_wav(read_list(folder / "mix_clean.scp")[name].resolve()).double()
    refs = torch.stack([read_wav(read_list(folder / f"s{k}.scp")[name].resolve()) for k in (1, 2)]).double()
    return name, mix, refs


def degraded(refs: torch.Tensor, seed: int) -> torch.Tensor:
    """Estimates as a separator leaves them: leakage of the other source, noise and a short filter."""
    g = torch.Generator().manual_seed(seed)
    est = refs + 0.25 * refs.flip(0) + 0.1 * refs.std() * torch.randn(refs.shape, generator=g, dtype=torch.float64)
    taps = torch.tensor([[[0.3, 1.0, -0.2]]], dtype=torch.float64)
    est[0] = torch.nn.functional.conv1d(est[0][None, None], taps, padding=1)[0, 0]
    return est


def mir_eval_sdr(refs: torch.Tensor, est: torch.Tensor) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # bss_eval_sources is deprecated in mir_eval 0.8, still the reference
        return mir_eval_separation.bss_eval_sources(refs.numpy(), est.numpy(), compute_permutation=False)[0]


@pytest.mark.slow
@pytest.mark.parametrize("index,seed", [(0, 1), (5, 2), (11, 3)])
def test_bss_sdr_matches_mir_eval(index: int, seed: int) -> None:
    _, mix, refs = dev_utterance(index)
    est = degraded(refs, seed)
    ours = M.sdr(est, refs)
    np.testing.assert_allclose(ours.numpy(), mir_eval_sdr(refs, est), atol=1e-6)
    # The mixture as the estimate of every source (the baseline of SDRi).
    mix_rep = mix.expand_as(refs).clone()
    np.testing.assert_allclose(M.sdr(mix_rep, refs).numpy(), mir_eval_sdr(refs, mix_rep), atol=1e-6)


@pytest.mark.slow
def test_bss_sdr_returns_in_a_fresh_process() -> None:
    # Regression: after torch.set_num_threads changed the thread count, batched float64 solves through
    # torch's CPU LAPACK (oneMKL) failed ("Parameter 6 was incorrect on entry to DLASWP") and deadlocked in
    # MKL's thread team, so the first SDR of a run never returned. A fresh process shows it on its own.
    import subprocess

    code = (
        "import sys; sys.path[:0] = sys.argv[1:]; import test_metrics as T; from mtlab.separation import metrics as M; "
        "import torch; torch.set_num_threads(1); torch.set_num_threads(2); "  # as `mtlab train --threads` and the tests do
        "_, mix, refs = T.dev_utterance(0); print(M.sdr(T.degraded(refs, 1), refs).tolist())"
    )
    try:
        done = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent), str(TESTS)], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("M.sdr did not return within 60 s in a fresh process (a LAPACK deadlock)")
    assert done.returncode == 0, done.stderr
    assert "ERROR" not in done.stderr, done.stderr
    assert len(eval(done.stdout)) == 2


def test_bss_sdr_differs_from_snr_where_a_filter_helps() -> None:
    _, _, refs = dev_utterance(2)
    ref = refs[0]
    est = ref + 0.6 * torch.nn.functional.pad(ref[:-3], (3, 0))  # an echo 3 samples later (a causal filter)
    # A short filter is allowed distortion for BSS-eval (near perfect), but an error for the plain SNR.
    assert float(M.sdr(est, ref)) > 40 and float(M.snr(est, ref)) < 10


@pytest.mark.slow
def test_score_uses_the_permutation_for_every_metric_and_the_mixture_baseline() -> None:
    _, mix, refs = dev_utterance(3)
    est = degraded(refs, 4).flip(0)  # estimates in the other order
    sc = M.score(est, refs, mix, metrics=("si_sdr", "sdr", "snr"))
    assert sc.perm == (1, 0)
    np.testing.assert_allclose(sc.sdr.numpy(), mir_eval_sdr(refs, est.flip(0)), atol=0.01)
    np.testing.assert_allclose(sc.sdr_mix.numpy(), mir_eval_sdr(refs, mix.expand_as(refs).clone()), atol=0.01)
    torch.testing.assert_close(sc.sdri, sc.sdr - sc.sdr_mix)
    torch.testing.assert_close(sc.snr, M.snr(est.flip(0), refs))
    row = sc.row()
    assert set(row) == {f"{m}{s}" for m in ("si_sdr", "sdr", "snr") for s in ("", "_mix", "i")}
    assert row["sdri"] == pytest.approx(float(sc.sdr.mean() - sc.sdr_mix.mean()))
    with pytest.raises(AttributeError, match="stoi"):
        sc.stoi  # noqa: B018 (not computed)


def test_stoi_matches_pystoi() -> None:
    pystoi = pytest.importorskip("pystoi", reason="pystoi comes with the metrics extra")
    _, _, refs = dev_utterance(1)
    est = degraded(refs, 5)
    ours = M.stoi(est, refs, 8000)
    expected = [pystoi.stoi(r, e, 8000) for r, e in zip(refs.numpy(), est.numpy())]
    np.testing.assert_allclose(ours.numpy(), expected, rtol=0, atol=1e-12)
    assert (ours > 0.5).all() and (ours < 1).all()


def test_pesq_matches_the_pesq_package_and_checks_rates() -> None:
    lib = pytest.importorskip("pesq", reason="pesq needs a C compiler to install")
    _, _, refs = dev_utterance(1)
    est = degraded(refs, 6)
    ours = M.pesq(est, refs, 8000)
    expected = [lib.pesq(8000, r, e, "nb") for r, e in zip(refs.numpy(), est.numpy())]
    np.testing.assert_allclose(ours.numpy(), expected, atol=1e-9)
    assert float(M.pesq(refs[0], refs[0], 8000)) > float(ours[0])
    with pytest.raises(ConfigError, match="8000 or 16000"):
        M.pesq(est, refs, 22050)
    with pytest.raises(ConfigError, match="wide-band"):
        M.pesq(est, refs, 8000, mode="wb")


def test_missing_optional_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("pystoi", "pesq"):
        monkeypatch.setitem(sys.modules, name, None)  # makes `import name` raise ImportError
    x = torch.randn(2, 8000, dtype=torch.float64)
    with pytest.raises(ImportError, match=r'mtlab\[metrics\]'):
        M.pesq(x, x, 8000)
    with pytest.raises(ImportError, match=r'mtlab\[metrics\]'):
        M.stoi(x, x, 8000)


def test_bad_input_is_named() -> None:
    x = torch.randn(2, 100, dtype=torch.float64)
    with pytest.raises(BatchError, match="filter"):
        M.sdr(x, x)
    with pytest.raises(ConfigError, match="unknown metric 'sisnr'"):
        M.evaluate_table([], metrics=("sisnr",))
    with pytest.raises(ConfigError, match="no utterances"):
        M.evaluate_table([])


@pytest.mark.slow
def test_evaluate_table_rows_summary_and_files(tmp_path) -> None:
    utts = []
    for i in range(3):
        name, mix, refs = dev_utterance(i)
        utts.append((name, degraded(refs, 10 + i), refs, mix))
    ev = M.evaluate_table(utts, metrics=("si_sdr", "sdr", "stoi"), out_dir=tmp_path, prefix="dev")
    assert list(ev.utterances["name"]) == [u[0] for u in utts]
    for m in ("si_sdr", "sdr", "stoi"):
        assert ev.summary.loc[m, "separated"] == pytest.approx(ev.utterances[m].mean())
        assert ev.summary.loc[m, "mixture"] == pytest.approx(ev.utterances[f"{m}_mix"].mean())
        assert ev.summary.loc[m, "improvement"] == pytest.approx(
            ev.summary.loc[m, "separated"] - ev.summary.loc[m, "mixture"])
    # Each row's SDR is mir_eval's mean over the sources.
    for (_name, est, refs, _), sdr_value in zip(utts, ev.utterances["sdr"]):
        assert sdr_value == pytest.approx(float(mir_eval_sdr(refs, est).mean()), abs=0.01)
    back = pd.read_csv(ev.paths["utterances"])
    assert list(back["name"]) == list(ev.utterances["name"])
    np.testing.assert_allclose(back["sdri"], ev.utterances["sdri"], atol=1e-4)
    summary = pd.read_csv(ev.paths["summary"], index_col="metric")
    assert summary.loc["stoi", "count"] == 3


@pytest.mark.slow
def test_evaluate_lists_reads_kaldi_lists(tmp_path) -> None:
    import wave

    folder = data_samples_dir() / "dev"
    names = sorted(read_list(folder / "mix_clean.scp"))[:2]
    lines = {k: [] for k in ("e1", "e2")}
    for name in names:
        refs = torch.stack([read_wav(read_list(folder / f"s{k}.scp")[name].resolve()) for k in (1, 2)]).double()
        est = degraded(refs, 7).flip(0)  # a separator's arbitrary output order
        for k, key in enumerate(("e1", "e2")):
            path = tmp_path / f"{key}_{name}.wav"
            with wave.open(str(path), "wb") as w:
                w.setnchannels(1), w.setsampwidth(2), w.setframerate(8000)
                w.writeframes((est[k].clamp(-1, 0.99997) * 32768).round().short().numpy().tobytes())
            lines[key].append(f"{name} {path.name}\n")
    for key, text in lines.items():
        (tmp_path / f"{key}.scp").write_text("".join(text))
    ev = M.evaluate_lists(folder / "mix_clean.scp", [folder / "s1.scp", folder / "s2.scp"],
                          [tmp_path / "e1.scp", tmp_path / "e2.scp"], metrics=("si_sdr", "sdr"))
    assert list(ev.utterances["name"]) == names and set(ev.utterances["perm"]) == {"1 0"}
    assert (ev.utterances["sdri"] > 3).all()
    with pytest.raises(ConfigError, match="one estimate list per source"):
        M.evaluate_lists(folder / "mix_clean.scp", [folder / "s1.scp", folder / "s2.scp"], [tmp_path / "e1.scp"])


@pytest.mark.slow
def test_cli_score_writes_the_tables_of_evaluate_lists(tmp_path, capsys) -> None:
    import wave

    from mtlab.apps.cli import main

    folder = data_samples_dir() / "test"
    names = sorted(read_list(folder / "mix_clean.scp"))[:2]
    for k in (1, 2):
        (tmp_path / f"e{k}.scp").write_text("".join(f"{n} e{k}_{n}.wav\n" for n in names))
    for name in names:
        refs = torch.stack([read_wav(read_list(folder / f"s{k}.scp")[name].resolve()) for k in (1, 2)]).double()
        est = degraded(refs, 8)
        for k in (1, 2):
            with wave.open(str(tmp_path / f"e{k}_{name}.wav"), "wb") as w:
                w.setnchannels(1), w.setsampwidth(2), w.setframerate(8000)
                w.writeframes((est[k - 1].clamp(-1, 0.99997) * 32768).round().short().numpy().tobytes())
    lists = ["--mixture", str(folder / "mix_clean.scp"), "--references", str(folder / "s1.scp"),
             str(folder / "s2.scp"), "--estimates", str(tmp_path / "e1.scp"), str(tmp_path / "e2.scp")]
    assert main(["score", *lists, "--metrics", "si_sdr,sdr,stoi", "--out", str(tmp_path / "out")]) == 0
    assert "sdr" in capsys.readouterr().out
    expected = M.evaluate_lists(folder / "mix_clean.scp", [folder / "s1.scp", folder / "s2.scp"],
                                [tmp_path / "e1.scp", tmp_path / "e2.scp"], metrics=("si_sdr", "sdr", "stoi"))
    summary = pd.read_csv(tmp_path / "out" / "evaluation_summary.csv", index_col="metric")
    np.testing.assert_allclose(summary[["separated", "mixture", "improvement"]].to_numpy(),
                               expected.summary[["separated", "mixture", "improvement"]].to_numpy(), atol=1e-3)
    rows = pd.read_csv(tmp_path / "out" / "evaluation_utterances.csv")
    assert list(rows["name"]) == names
    assert main(["score", *lists, "--metrics", "sisnr"]) == 2
    assert "unknown metric 'sisnr'" in capsys.readouterr().err


@pytest.mark.parametrize("gain", [1.0, 1e-3])
def test_si_sdr_and_snr_follow_their_formulas_for_quiet_signals(gain: float) -> None:
    """The exact formulas in float64 numpy, no floor: a quiet estimate (gain 0.001) scores as a loud one."""
    _, _, refs = dev_utterance(2)
    est = degraded(refs, 4)
    s, e = refs.numpy() - refs.numpy().mean(-1, keepdims=True), gain * est.numpy()
    e = e - e.mean(-1, keepdims=True)
    target = (e * s).sum(-1, keepdims=True) / (s * s).sum(-1, keepdims=True) * s
    exact_si = 10 * np.log10((target ** 2).sum(-1) / ((e - target) ** 2).sum(-1))
    np.testing.assert_allclose(M.si_sdr(gain * est, refs).numpy(), exact_si, atol=1e-6)
    quiet_refs, quiet_est = gain * refs, gain * est  # SNR: both quiet, same ratio
    exact_snr = 10 * np.log10((refs.numpy() ** 2).sum(-1) / ((refs.numpy() - est.numpy()) ** 2).sum(-1))
    np.testing.assert_allclose(M.snr(quiet_est, quiet_refs).numpy(), exact_snr, atol=1e-6)
    assert torch.isfinite(M.si_sdr(refs, refs)).all() and M.si_sdr(refs, refs).min() > 90  # a perfect estimate
    assert M.si_sdr(torch.zeros_like(refs), refs).isfinite().all()  # silence scores, no NaN


@pytest.mark.parametrize("subtype", ["FLOAT", "PCM_24", "PCM_32", "DOUBLE"])
def test_score_reads_float_and_24_bit_wavs(tmp_path: Path, subtype: str) -> None:
    sf = pytest.importorskip("soundfile", reason="soundfile reads float and 24-bit WAVs (mtlab[metrics])")
    folder = data_samples_dir() / "dev"
    names = sorted(read_list(folder / "mix_clean.scp"))[:2]
    for k in (1, 2):
        (tmp_path / f"e{k}.scp").write_text("".join(f"{n} e{k}_{n}.wav\n" for n in names))
    expected_rows = []
    for name in names:
        refs = torch.stack([read_wav(read_list(folder / f"s{k}.scp")[name].resolve()) for k in (1, 2)]).double()
        est = degraded(refs, 9).clamp(-1, 0.999)
        for k in (1, 2):
            sf.write(str(tmp_path / f"e{k}_{name}.wav"), est[k - 1].numpy(), 8000, subtype=subtype)
            back, _ = sf.read(str(tmp_path / f"e{k}_{name}.wav"), dtype="float64")
            est[k - 1] = torch.from_numpy(back)
        expected_rows.append(float(M.si_sdr(est, refs).mean()))  # the estimates in the references' order
    ev = M.evaluate_lists(folder / "mix_clean.scp", [folder / "s1.scp", folder / "s2.scp"],
                          [tmp_path / "e1.scp", tmp_path / "e2.scp"], metrics=("si_sdr",))
    assert list(ev.utterances["perm"]) == ["0 1", "0 1"]
    np.testing.assert_allclose(ev.utterances["si_sdr"].to_numpy(), expected_rows, atol=1e-3)
