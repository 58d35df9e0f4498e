"""The original's scoring, on its own code: BSS-eval's SDR, SIR and SAR and the speaker order by mean SIR against
``nabu/postprocessing/scorers/bss_eval.py`` (its functions as written, run here where the original's source is
present, else against ``mir_eval.separation``, of which it is a copy), and the summary against ``scorer.py``'s
``summarize`` (mean, std, median of SDR, SIR and SAR, overall and per mixture type)."""

from __future__ import annotations

import math
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers.paths import SHARED_NABU

from mtlab.nabu.evaluation import _write_wav, original_summary, read_spkinfo
from mtlab.separation.metrics import bss_eval, order_by_mean_sir, score

pytestmark = pytest.mark.usefixtures("one_thread")

ORIGINAL = SHARED_NABU / "nabu" / "postprocessing" / "scorers"
FUNCTIONS = ("validate", "_any_source_silent", "bss_eval_sources", "_bss_decomp_mtifilt", "_project",
             "_bss_source_crit", "_safe_db")


def original_bss_eval_sources() -> Any:
    """``bss_eval.py``'s ``bss_eval_sources`` with the functions it calls, their source as written (the file is
    Python 2: only these functions, which are valid Python 3, are run), or mir_eval's, of which it is a copy."""
    path = ORIGINAL / "bss_eval.py"
    if not path.is_file():
        import mir_eval.separation

        return mir_eval.separation.bss_eval_sources
    import itertools

    import scipy.fftpack
    from scipy.linalg import toeplitz
    from scipy.signal import fftconvolve

    text = path.read_text(encoding="utf-8")
    namespace: dict[str, Any] = {"np": _NumpyWithInf(), "scipy": scipy, "toeplitz": toeplitz,
                                 "fftconvolve": fftconvolve, "itertools": itertools, "warnings": warnings,
                                 "MAX_SOURCES": 100}
    for name in FUNCTIONS:
        match = re.search(rf"^def {name}\(.*?(?=^def |\Z)", text, re.DOTALL | re.MULTILINE)
        assert match, name
        exec(compile(match.group(0), str(path), "exec"), namespace)  # noqa: S102 (the original's code, as written)
    return namespace["bss_eval_sources"]


class _NumpyWithInf:
    """numpy with ``np.Inf`` (removed in numpy 2), which the original's ``_safe_db`` returns."""

    def __getattr__(self, name: str) -> Any:
        return np.inf if name == "Inf" else getattr(np, name)


def signals(seed: int, n: int = 1200, speakers: int = 2) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    refs = rng.normal(size=(speakers, n))
    mixing = rng.uniform(0.1, 1.0, size=(speakers, speakers))
    est = mixing @ refs + 0.3 * rng.normal(size=(speakers, n))
    return refs, est


@pytest.mark.slow  # the original's bss_eval solves a (speakers x 512)-square system per pair: seconds
@pytest.mark.parametrize("seed,speakers", [(0, 2), (2, 3)])
def test_sdr_sir_sar_and_the_order_by_mean_sir_are_the_originals(seed: int, speakers: int) -> None:
    refs, est = signals(seed, speakers=speakers)
    theirs = original_bss_eval_sources()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sdr, sir, sar, perm = theirs(refs, est)
    pairs = bss_eval(est, refs)
    ours = order_by_mean_sir(pairs)
    assert ours == tuple(int(p) for p in perm)
    idx = (list(ours), list(range(speakers)))
    for mine, want in ((pairs["sdr"][idx], sdr), (pairs["sir"][idx], sir), (pairs["sar"][idx], sar)):
        np.testing.assert_allclose(mine, want, atol=1e-7)
    sc = score(torch.from_numpy(est), torch.from_numpy(refs), torch.from_numpy(refs.sum(0)), ("sdr", "si_sdr"),
               order="sir")
    assert sc.perm == ours
    np.testing.assert_allclose(sc.sir.numpy(), sir, atol=1e-7)
    np.testing.assert_allclose(sc.sar.numpy(), sar, atol=1e-7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base = theirs(refs, np.stack([refs.sum(0)] * speakers))  # the original's "base" scenario: the mixture
    np.testing.assert_allclose(sc.sdr_mix.numpy(), base[0], atol=1e-7)
    np.testing.assert_allclose(sc.sir_mix.numpy(), base[1], atol=1e-7)


@pytest.mark.slow  # BSS-eval's 1024-square solves: about a second on a quiet machine
def test_the_order_by_mean_sir_can_differ_from_the_order_by_si_sdr() -> None:
    """A poorly separated pair where the two criteria disagree: the reported SDR follows the chosen order."""
    rng = np.random.default_rng(7)
    refs = rng.normal(size=(2, 1200))
    est = rng.uniform(-1, 1, size=(2, 2)) @ refs + rng.uniform(0, 1.5) * rng.normal(size=(2, 1200))
    pairs = bss_eval(est, refs)
    mix = torch.from_numpy(refs.sum(0))
    by_sir = score(torch.from_numpy(est), torch.from_numpy(refs), mix, ("sdr",), order="sir")
    by_si = score(torch.from_numpy(est), torch.from_numpy(refs), mix, ("sdr", "si_sdr"))
    assert by_sir.perm == order_by_mean_sir(pairs) == (1, 0) and by_si.perm == (0, 1)
    np.testing.assert_allclose(by_sir.sdr.numpy(), pairs["sdr"][[1, 0], [0, 1]])
    assert abs(float(by_sir.sdr.mean()) - float(by_si.sdr.mean())) > 0.1


def original_summarize(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``scorer.py:262-290`` (``summarize``) and ``get_statistics`` (``scorer.py:349-364``) as written, on the
    original's ``results[utt] = {"score": {metric: {scen: [per speaker]}}, "spk_info": {"mix_type": ...}}``."""
    mix_types = ["all_m", "all_f", "same_gen", "diff_gen"]
    utts = list(results.keys())
    mix_type_indeces = {m: [i for i, u in enumerate(utts) if results[u]["spk_info"]["mix_type"][m]] for m in mix_types}
    summary: dict[str, Any] = {}
    for metric in ("SDR", "SIR", "SAR"):
        summary[metric] = {}
        for scen in ("SS", "base"):
            tmp = [np.mean(results[u]["score"][metric][scen]) for u in utts]
            stats = {"all": tmp, **{m: [tmp[i] for i in mix_type_indeces[m]] for m in mix_types}}
            summary[metric][scen] = {k: {"mean": np.mean(v), "std": np.std(v), "median": np.median(v)}
                                     for k, v in stats.items()}
    return summary


def test_the_summary_is_the_originals_overall_and_per_mixture_type(tmp_path: Path) -> None:
    spkinfo = tmp_path / "utt_spkinfo.txt"
    spkinfo.write_text("u1 x 01a M 02b M\nu2 x 03c F 04d M\nu3 x 05e F 06f F\nu4 x 07g M 08h F\n")
    genders = read_spkinfo(spkinfo)
    assert genders == {"u1": ["M", "M"], "u2": ["F", "M"], "u3": ["F", "F"], "u4": ["M", "F"]}
    rng = np.random.default_rng(3)
    rows, results = [], {}
    for utt, g in genders.items():
        per = {m: {"SS": rng.normal(8, 3, size=2).tolist(), "base": rng.normal(0, 1, size=2).tolist()}
               for m in ("SDR", "SIR", "SAR")}
        rows.append({"utterance": utt, **{k: v for m in ("sdr", "sir", "sar") for k, v in
                                          ((m, float(np.mean(per[m.upper()]["SS"]))),
                                           (f"{m}_mix", float(np.mean(per[m.upper()]["base"]))))}})
        mix = {"all_m": g == ["M", "M"], "all_f": g == ["F", "F"], "same_gen": g[0] == g[1], "diff_gen": g[0] != g[1]}
        results[utt] = {"score": per, "spk_info": {"mix_type": mix}}
    want = original_summarize(results)
    got = original_summary(rows, genders)
    assert len(got) == 3 * 2 * 5
    for row in got:
        expected = want[row["metric"]][row["scenario"]][row["mix_type"]]
        for stat in ("mean", "std", "median"):
            assert math.isclose(row[stat], expected[stat], rel_tol=1e-12, abs_tol=1e-12), (row, stat)
    assert {r["mix_type"]: r["utterances"] for r in got if r["metric"] == "SDR" and r["scenario"] == "SS"} == \
        {"all": 4, "all_m": 1, "all_f": 1, "same_gen": 2, "diff_gen": 2}
    assert {r["mix_type"] for r in original_summary(rows, None)} == {"all"}  # no spkinfo: overall only


def test_float32_wavs_as_the_original_writes_them(tmp_path: Path) -> None:
    from scipy.io import wavfile

    signal = np.sin(np.linspace(0, 20, 800)) * 0.8
    _write_wav(tmp_path / "f.wav", signal, "float32")
    rate, data = wavfile.read(tmp_path / "f.wav")
    assert rate == 8000 and data.dtype == np.float32 and np.array_equal(data, signal.astype(np.float32))
    _write_wav(tmp_path / "i.wav", signal)
    assert wavfile.read(tmp_path / "i.wav")[1].dtype == np.int16
