"""Separation metrics the field reports, with the best speaker permutation and the mixture baseline.

- ``si_sdr``: scale-invariant SDR (Le Roux et al. 2019), zero-mean, dB; computed here (closed form).
- ``sdr``: BSS-eval SDR (Vincent et al. 2006), a 512-tap distortion filter allowed, dB, as mir_eval,
  museval and torchmetrics give it; computed here in numpy (tests check it against
  ``mir_eval.separation.bss_eval_sources``).
- ``snr``: the plain ``10 log10(‖s‖² / ‖s − ŝ‖²)``, dB, no filter and no scaling; computed here.
- ``stoi`` / ``estoi``: (extended) short-time objective intelligibility (Taal et al. 2011); ``pystoi``.
- ``pesq``: ITU-T P.862 PESQ (MOS-LQO), narrow band at 8 kHz, wide band at 16 kHz; the ``pesq`` package.

``pystoi`` and ``pesq`` come with ``pip install "mtlab[metrics]"``, and ``soundfile``, which reads 24-bit and float
WAVs for :func:`evaluate_lists` (16-bit PCM needs nothing).
:func:`score` scores one utterance, :func:`evaluate_table` many (a per-utterance table and a summary
with the mixture baseline and the improvements), :func:`evaluate_lists` reads them from list files.
"""

from __future__ import annotations

import itertools
import wave
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..base.errors import BatchError, ConfigError

EPS = 1e-10  # relative floor of si_sdr and snr: a perfect estimate scores 100 dB
BSS_FILTER_LENGTH = 512  # BSS-eval's distortion filter (taps), as in mir_eval and the papers that cite it
DEFAULT_METRICS = ("si_sdr", "sdr", "snr")
Metric = Callable[[Tensor, Tensor], Tensor]
EXTRA_HINT = 'pip install "mtlab[metrics]"'


def _need(module: str, metric: str) -> Any:
    """Import an optional metric package, or raise ImportError naming the extra that installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(f"metric {metric!r} needs the package {module!r}: {EXTRA_HINT}") from err


def _ratio_db(num: Tensor, den: Tensor, scale: Tensor, eps: float) -> Tensor:
    """``10 log10(num / den)`` with a floor RELATIVE to ``scale`` (an energy of the signals), so the score of
    quiet signals is the score of loud ones; the floor caps a perfect estimate at ``10 log10(1/eps)`` dB, and
    the dtype's smallest normal number only keeps silence from dividing zero by zero (0 dB)."""
    floor = eps * scale + torch.finfo(scale.dtype).tiny
    return 10 * torch.log10((num + floor) / (den + floor))


def si_sdr(estimate: Tensor, reference: Tensor, zero_mean: bool = True, eps: float = EPS) -> Tensor:
    """SI-SDR in dB over the last axis, batched over leading axes: ``10 log10(‖αs‖² / ‖αs − ŝ‖²)``,
    ``α = <ŝ, s> / ‖s‖²``; the same for any gain of the estimate (``eps`` is relative to its energy).

    Examples:
        >>> s = torch.sin(torch.linspace(0, 100, 8000, dtype=torch.float64))
        >>> noisy = s + 0.1 * torch.cos(torch.linspace(0, 777, 8000, dtype=torch.float64))
        >>> bool(torch.isclose(si_sdr(0.001 * noisy, s), si_sdr(noisy, s)))   # the gain does not matter
        True
    """
    if zero_mean:
        estimate = estimate - estimate.mean(-1, keepdim=True)
        reference = reference - reference.mean(-1, keepdim=True)
    ref_energy = reference.square().sum(-1, keepdim=True)
    alpha = (estimate * reference).sum(-1, keepdim=True) / (ref_energy + torch.finfo(ref_energy.dtype).tiny)
    target = alpha * reference
    noise = estimate - target
    return _ratio_db(target.square().sum(-1), noise.square().sum(-1), estimate.square().sum(-1), eps)


def snr(estimate: Tensor, reference: Tensor, eps: float = EPS) -> Tensor:
    """Plain signal-to-error ratio in dB over the last axis: ``10 log10(‖ref‖² / ‖ref − est‖²)`` (``eps`` is
    relative to the reference's energy, so a common gain of both signals leaves it unchanged)."""
    ref_energy = reference.square().sum(-1)
    return _ratio_db(ref_energy, (reference - estimate).square().sum(-1), ref_energy, eps)


def sdr(estimate: Tensor, reference: Tensor, filter_length: int = BSS_FILTER_LENGTH) -> Tensor:
    """BSS-eval SDR in dB over the last axis, pairwise, batched over (broadcast) leading axes.

    The SDR of an estimate against a reference depends on that pair only: the target is the estimate's
    projection on ``filter_length`` delayed copies of the reference, the error is the rest, so it is
    computed pair by pair, exactly as ``mir_eval.separation.bss_eval_sources(...)[0]`` does for the same
    pairing (FFT correlations, the Toeplitz Gram system, the projection by FFT convolution).

    The solves run in numpy (float64), not in torch: torch's CPU LAPACK (oneMKL) fails on batched float64
    solves once ``torch.set_num_threads`` has changed the thread count, and then never returns.
    """
    est, ref = torch.broadcast_tensors(estimate, reference)
    n = est.shape[-1]
    if n < filter_length:
        raise BatchError(f"sdr: {n} samples is shorter than the {filter_length}-tap BSS-eval filter; "
                         "score longer signals or pass a smaller filter_length")
    lead = est.shape[:-1]
    e = est.detach().reshape(-1, n).to("cpu", torch.float64).numpy()
    s = ref.detach().reshape(-1, n).to("cpu", torch.float64).numpy()
    length = n + filter_length - 1
    nfft = 1 << (length - 1).bit_length()
    s_f = np.fft.rfft(s, nfft)
    auto = np.fft.irfft(s_f * s_f.conj(), nfft)[:, :filter_length]  # auto[k] = sum_t s[t] s[t+k]
    cross = np.fft.irfft(np.fft.rfft(e, nfft) * s_f.conj(), nfft)[:, :filter_length]  # sum_t e[t+k] s[t]
    lags = np.abs(np.arange(filter_length)[:, None] - np.arange(filter_length)[None, :])
    try:
        coef = np.linalg.solve(auto[:, lags], cross[..., None])[..., 0]
    except np.linalg.LinAlgError:  # a silent reference makes the Gram matrix singular; mir_eval falls back the same way
        coef = np.stack([np.linalg.lstsq(auto[i][lags], cross[i], rcond=None)[0] for i in range(len(auto))])
    target = np.fft.irfft(s_f * np.fft.rfft(coef, nfft), nfft)[:, :length]
    error = np.pad(e, ((0, 0), (0, filter_length - 1))) - target
    value = 10 * np.log10((target**2).sum(-1) / (error**2).sum(-1))
    return torch.from_numpy(value).reshape(lead)


def bss_eval(estimates: np.ndarray, references: np.ndarray, filter_length: int = BSS_FILTER_LENGTH
             ) -> dict[str, np.ndarray]:
    """BSS-eval's SDR, SIR and SAR (dB) of every estimate against every reference: ``{"sdr", "sir", "sar"}``, each
    ``[estimate, reference]``, as ``mir_eval.separation.bss_eval_sources`` (and the original's ``bss_eval.py``, a
    copy of it) computes them pair by pair with ``compute_permutation=True``.

    With ``P_j`` the estimate's projection on ``filter_length`` delayed copies of reference ``j`` and ``P`` its
    projection on those of every reference: SDR = ‖P_j‖² / ‖ŝ − P_j‖², SIR = ‖P_j‖² / ‖P − P_j‖²,
    SAR = ‖P‖² / ‖ŝ − P‖² (ŝ zero-padded by ``filter_length - 1``). ``P`` does not depend on ``j``, so one
    solve of the joint Gram system serves every pair. numpy, float64 (see :func:`sdr` for why not torch)."""
    e, s = np.asarray(estimates, np.float64), np.asarray(references, np.float64)
    if e.ndim != 2 or e.shape != s.shape:
        raise BatchError(f"bss_eval: estimates {e.shape} and references {s.shape} must both be [S, N]")
    S, n = s.shape
    F = filter_length
    if n < F:
        raise BatchError(f"bss_eval: {n} samples is shorter than the {F}-tap BSS-eval filter")
    length = n + F - 1
    nfft = 1 << (length - 1).bit_length()
    s_f, e_f = np.fft.rfft(s, nfft), np.fft.rfft(e, nfft)
    corr = np.fft.irfft(s_f[:, None] * s_f[None].conj(), nfft)  # corr[i, j, k] = sum_t s_i[t + k] s_j[t]
    lags = np.arange(F)[None, :] - np.arange(F)[:, None]  # block (i, j)[a, b] = sum_t s_i[t - a] s_j[t - b]
    gram = corr[:, :, lags % nfft].transpose(0, 2, 1, 3).reshape(S * F, S * F)
    cross = np.fft.irfft(e_f[:, None] * s_f[None].conj(), nfft)[..., :F]  # [est, ref, a]: sum_t e[t] s[t - a]

    def solve(matrix: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        try:
            return np.linalg.solve(matrix, rhs)
        except np.linalg.LinAlgError:  # a silent reference: mir_eval falls back to least squares the same way
            return np.linalg.lstsq(matrix, rhs, rcond=None)[0]

    joint = solve(gram, cross.reshape(S, S * F).T).T.reshape(S, S, F)  # [est, ref, tap]
    p_all = np.fft.irfft((np.fft.rfft(joint, nfft) * s_f[None]).sum(1), nfft)[:, :length]  # [est, length]
    single = np.stack([solve(gram[j * F:(j + 1) * F, j * F:(j + 1) * F], cross[:, j].T).T for j in range(S)], 1)
    p_one = np.fft.irfft(np.fft.rfft(single, nfft) * s_f[None], nfft)[..., :length]  # [est, ref, length]
    padded = np.pad(e, ((0, 0), (0, F - 1)))

    def db(num: np.ndarray, den: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore"):  # a zero error is +inf dB, as the original's _safe_db gives
            return 10 * np.log10(num / den)

    energy = (p_one ** 2).sum(-1)
    sar = db((p_all ** 2).sum(-1), ((padded - p_all) ** 2).sum(-1))
    return {"sdr": db(energy, ((padded[:, None] - p_one) ** 2).sum(-1)),
            "sir": db(energy, ((p_all[:, None] - p_one) ** 2).sum(-1)),
            "sar": np.repeat(sar[:, None], S, axis=1)}


def order_by_mean_sir(pairs: dict[str, np.ndarray]) -> tuple[int, ...]:
    """The original's speaker order (``bss_eval.py:542-543``): the permutation with the largest mean SIR over
    the references, the first of equal ones (``np.argmax``); ``perm[s]`` is the estimate matched to reference s."""
    S = pairs["sir"].shape[0]
    perms = list(itertools.permutations(range(S)))
    mean_sir = [np.mean(pairs["sir"][list(p), np.arange(S)]) for p in perms]
    return perms[int(np.argmax(mean_sir))]


def stoi(estimate: Tensor, reference: Tensor, sample_rate: int, extended: bool = False) -> Tensor:
    """STOI (or extended STOI) over the last axis, batched over (broadcast) leading axes; ``pystoi``."""
    pystoi = _need("pystoi", "stoi")
    est, ref = torch.broadcast_tensors(estimate, reference)
    flat_est = est.reshape(-1, est.shape[-1]).double().cpu().numpy()
    flat_ref = ref.reshape(-1, ref.shape[-1]).double().cpu().numpy()
    values = [pystoi.stoi(r, e, sample_rate, extended=extended) for r, e in zip(flat_ref, flat_est)]
    return torch.tensor(values, dtype=torch.float64).reshape(est.shape[:-1])


def pesq(estimate: Tensor, reference: Tensor, sample_rate: int, mode: str | None = None) -> Tensor:
    """PESQ (MOS-LQO) over the last axis, batched over (broadcast) leading axes; the ``pesq`` package.

    ``mode`` is ``"nb"`` (narrow band, the default at 8 kHz) or ``"wb"`` (wide band, the default at 16 kHz).
    """
    if sample_rate not in (8000, 16000):
        raise ConfigError(f"pesq: sample rate {sample_rate} Hz is not supported; PESQ needs 8000 or 16000 Hz")
    mode = mode or ("nb" if sample_rate == 8000 else "wb")
    if mode == "wb" and sample_rate != 16000:
        raise ConfigError("pesq: wide-band mode needs 16000 Hz audio; use mode='nb' at 8000 Hz")
    lib = _need("pesq", "pesq")
    est, ref = torch.broadcast_tensors(estimate, reference)
    flat_est = est.reshape(-1, est.shape[-1]).double().cpu().numpy()
    flat_ref = ref.reshape(-1, ref.shape[-1]).double().cpu().numpy()
    values = []
    for r, e in zip(flat_ref, flat_est):
        try:
            values.append(lib.pesq(sample_rate, r, e, mode))
        except Exception as err:  # the C code reports e.g. "no utterances detected" as its own exception types
            raise BatchError(f"pesq: {err}; PESQ needs speech in the reference (a few hundred ms at least)") from err
    return torch.tensor(values, dtype=torch.float64).reshape(est.shape[:-1])


def metric_function(name: str, sample_rate: int) -> Metric:
    """The pairwise metric called ``name`` (see the module table) as ``fn(estimate, reference)``."""
    if name == "si_sdr":
        return si_sdr
    if name == "sdr":
        return sdr
    if name == "snr":
        return snr
    if name in ("stoi", "estoi"):
        return lambda e, r: stoi(e, r, sample_rate, extended=name == "estoi")
    if name == "pesq":
        return lambda e, r: pesq(e, r, sample_rate)
    raise ConfigError(f"unknown metric {name!r}; choose from si_sdr, sdr, snr, stoi, estoi, pesq")


def best_permutation(estimates: Tensor, references: Tensor, metric: Metric = si_sdr) -> tuple[Tensor, tuple[int, ...]]:
    """Scores ``[S]`` of ``estimates [S, N]`` against ``references [S, N]`` under the permutation
    that maximises their sum; ``perm[s]`` is the estimate matched to reference ``s``."""
    if estimates.dim() != 2 or estimates.shape != references.shape:
        raise BatchError(
            f"estimates {tuple(estimates.shape)} and references {tuple(references.shape)} must both be [S, N]"
        )
    s = references.shape[0]
    pair = metric(estimates[:, None, :], references[None, :, :])  # [est, ref]
    perms = list(itertools.permutations(range(s)))
    totals = torch.stack([pair[list(p), list(range(s))].sum() for p in perms])
    best = perms[int(totals.argmax())]
    return pair[list(best), list(range(s))], best


@dataclass(frozen=True)
class SeparationScores:
    """Per-source scores of one utterance: ``scores[m]`` of the estimates, ``baseline[m]`` of the mixture.

    Attribute access follows the table columns: ``sc.sdr``, ``sc.sdr_mix`` and ``sc.sdri`` (improvement)
    for every metric that was computed.
    """

    scores: dict[str, Tensor]
    baseline: dict[str, Tensor]
    perm: tuple[int, ...]
    metrics: tuple[str, ...] = field(default=DEFAULT_METRICS)

    def __getattr__(self, key: str) -> Tensor:
        scores, baseline = self.__dict__.get("scores", {}), self.__dict__.get("baseline", {})
        if key in scores:
            return scores[key]
        if key.endswith("_mix") and key[:-4] in baseline:
            return baseline[key[:-4]]
        if key.endswith("i") and key[:-1] in scores:
            return scores[key[:-1]] - baseline[key[:-1]]
        raise AttributeError(f"SeparationScores has no {key!r}; computed metrics: {', '.join(scores)}")

    def row(self) -> dict[str, float]:
        """Means over the sources as plain floats: ``m``, ``m_mix`` and ``mi`` for every metric ``m``."""
        out: dict[str, float] = {}
        for m in self.scores:
            out[m] = float(self.scores[m].mean())
            out[f"{m}_mix"] = float(self.baseline[m].mean())
            out[f"{m}i"] = out[m] - out[f"{m}_mix"]
        return out


ORDERS = ("si_sdr", "sir")  # how score() matches estimates to references


def score(estimates: Tensor, references: Tensor, mixture: Tensor, metrics: Sequence[str] = DEFAULT_METRICS,
          sample_rate: int = 8000, order: str = "si_sdr") -> SeparationScores:
    """``metrics`` of the estimates and of the mixture as the baseline, the estimates matched to the references
    by ``order``: ``"si_sdr"`` (mtlab's: the permutation of the largest summed SI-SDR) or ``"sir"`` (the
    original's: the largest mean BSS-eval SIR, :func:`order_by_mean_sir`; then ``sdr``, ``sir`` and ``sar`` are
    BSS-eval's of that match, as the original's scorer reports them, besides ``metrics``).

    Signals are cut to the shortest of the three (an iSTFT can be a few samples short).
    """
    if order not in ORDERS:
        raise ConfigError(f"score order {order!r}; valid: {', '.join(ORDERS)}")
    n = min(estimates.shape[-1], references.shape[-1], mixture.shape[-1])
    est, ref, mix = estimates[..., :n].double(), references[..., :n].double(), mixture[..., :n].double()
    mix_rep = mix.expand_as(ref)
    scores: dict[str, Tensor] = {}
    baseline: dict[str, Tensor] = {}
    if order == "sir":
        pairs = bss_eval(est.numpy(), ref.numpy())
        perm = order_by_mean_sir(pairs)
        base = bss_eval(mix_rep.numpy(), ref.numpy())
        diag = list(range(ref.shape[0]))
        for name in ("sdr", "sir", "sar"):
            scores[name] = torch.from_numpy(pairs[name][list(perm), diag].copy())
            baseline[name] = torch.from_numpy(base[name][diag, diag].copy())
        si = None
    else:
        si, perm = best_permutation(est, ref, si_sdr)
    matched = est[list(perm)]
    for name in metrics:
        if name in scores:
            continue
        fn = metric_function(name, sample_rate)
        scores[name] = si if name == "si_sdr" and si is not None else fn(matched, ref)
        baseline[name] = fn(mix_rep, ref)
    return SeparationScores(scores, baseline, perm, tuple(scores))


# ---------------------------------------------------------------------------------- tables
@dataclass
class Evaluation:
    """``utterances``: one row per utterance; ``summary``: per metric, the means of the separated
    signals, of the mixture, of the improvement, its standard deviation and the count."""

    utterances: Any  # pandas.DataFrame
    summary: Any  # pandas.DataFrame
    paths: dict[str, Path] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"Evaluation({len(self.utterances)} utterances)\n{self.summary.to_string(float_format='%.3f')}"


Utterance = tuple[str, Tensor, Tensor, Tensor]  # name, estimates [S, N], references [S, N], mixture [N]


def evaluate_table(utterances: Iterable[Utterance], metrics: Sequence[str] = DEFAULT_METRICS, sample_rate: int = 8000,
                   out_dir: str | Path | None = None, prefix: str = "evaluation") -> Evaluation:
    """Score every ``(name, estimates, references, mixture)``; with ``out_dir`` write
    ``<prefix>_utterances.csv`` and ``<prefix>_summary.csv`` there.

    Examples:
        >>> ev = evaluate_table([("utt1", est, refs, mix)], metrics=("si_sdr", "sdr", "stoi"))  # doctest: +SKIP
        >>> ev.summary.loc["sdr", "improvement"]  # doctest: +SKIP
    """
    import pandas as pd

    for name in metrics:
        metric_function(name, sample_rate)  # unknown names fail before any work
    rows = []
    for name, est, ref, mix in utterances:
        sc = score(est, ref, mix, metrics, sample_rate)
        rows.append({"name": name, "perm": " ".join(map(str, sc.perm)), **sc.row()})
    if not rows:
        raise ConfigError("evaluate_table: no utterances to score")
    table = pd.DataFrame(rows)
    summary = pd.DataFrame(
        {"separated": [table[m].mean() for m in metrics], "mixture": [table[f"{m}_mix"].mean() for m in metrics],
         "improvement": [table[f"{m}i"].mean() for m in metrics],
         "improvement_std": [table[f"{m}i"].std(ddof=0) for m in metrics], "count": [len(table)] * len(metrics)},
        index=pd.Index(list(metrics), name="metric"))
    paths: dict[str, Path] = {}
    if out_dir is not None:
        folder = Path(out_dir)
        folder.mkdir(parents=True, exist_ok=True)
        paths = {"utterances": folder / f"{prefix}_utterances.csv", "summary": folder / f"{prefix}_summary.csv"}
        table.to_csv(paths["utterances"], index=False, float_format="%.4f")
        summary.to_csv(paths["summary"], float_format="%.4f")
    return Evaluation(table, summary, paths)


def _is_pcm16(path: Path) -> bool:
    try:
        with wave.open(str(path), "rb") as w:
            return w.getsampwidth() == 2
    except (wave.Error, EOFError, OSError):  # float WAVs (format 3) are not for the wave module
        return False


def read_audio(path: str | Path, sample_rate: int = 8000, origin: str | None = None) -> Tensor:
    """A mono WAV as float32 samples for scoring: 16-bit PCM (mtlab's reader), 24/32-bit PCM and 32/64-bit
    float (what most tools write) through ``soundfile``; other formats and rates are a DataError naming the
    file (and ``origin``, its list line)."""
    from ..data import DataError, read_wav

    path = Path(path)
    if not path.is_file() or _is_pcm16(path):
        return read_wav(path, sample_rate, origin=origin)
    where = f"{path} ({origin})" if origin else str(path)
    try:
        import soundfile as sf
    except ImportError as err:
        raise ImportError(f"{where} is not 16-bit PCM: reading 24-bit and float WAVs needs the package "
                          f"'soundfile': {EXTRA_HINT}") from err
    try:
        data, rate = sf.read(str(path), dtype="float32", always_2d=True)
    except Exception as exc:  # noqa: BLE001 (libsndfile's errors all mean "not readable audio")
        raise DataError(f"{where}: not a readable WAV file ({exc}); write 16/24/32-bit PCM or float WAV") from None
    if data.shape[1] != 1:
        raise DataError(f"{where}: {data.shape[1]} channels, expected mono; mix it down to one channel")
    if rate != sample_rate:
        raise DataError(f"{where}: sample rate {rate} Hz, expected {sample_rate} Hz; resample it to {sample_rate} Hz")
    return torch.from_numpy(np.ascontiguousarray(data[:, 0]))


def evaluate_lists(mixture: str | Path, references: Sequence[str | Path], estimates: Sequence[str | Path],
                   metrics: Sequence[str] = DEFAULT_METRICS, sample_rate: int = 8000,
                   out_dir: str | Path | None = None, prefix: str = "evaluation") -> Evaluation:
    """:func:`evaluate_table` on WAV files named by list files (``name path`` lines, as ``mtlab prepare``
    writes): one list for the mixtures, one per reference source, one per estimated source.

    Utterances are those of the estimate lists; each must be in the mixture and reference lists.
    """
    from ..data import DataError, read_list

    if len(references) != len(estimates):
        raise ConfigError(f"evaluate_lists: {len(references)} reference lists but {len(estimates)} estimate lists; "
                          "give one estimate list per source")
    mix_list = read_list(mixture)
    ref_lists = [read_list(p) for p in references]
    est_lists = [read_list(p) for p in estimates]
    names = list(est_lists[0])
    for label, lst in [(str(mixture), mix_list), *zip(map(str, references), ref_lists),
                       *zip(map(str, estimates), est_lists)]:
        missing = [n for n in names if n not in lst]
        if missing:
            raise DataError(f"{label}: no entry for {len(missing)} estimated utterance(s), e.g. {missing[0]!r}; "
                            "the lists must name the same utterances")

    def load(entry: Any) -> Tensor:
        return read_audio(entry.resolve(), sample_rate, origin=entry.where)

    def utterances() -> Iterable[Utterance]:
        for n in names:
            yield (n, torch.stack(_same_length([load(lst[n]) for lst in est_lists])),
                   torch.stack(_same_length([load(lst[n]) for lst in ref_lists])), load(mix_list[n]))

    return evaluate_table(utterances(), metrics, sample_rate, out_dir, prefix)


def _same_length(waves: list[Tensor]) -> list[Tensor]:
    n = min(int(w.shape[-1]) for w in waves)
    return [w[..., :n] for w in waves]

