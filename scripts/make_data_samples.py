"""Generate mtlab's small, deterministic sample speech corpus into ``data_samples/``.

Speech is rendered with espeak-ng (10 synthetic speakers: voice x pitch x speed), resampled to 8 kHz,
and mixed two speakers at a time (wsj0-2mix style, "max" length, the shorter source at a random offset).
Every mixture exists in two linked sets: ``mix_clean`` (s1 + s2) and ``mix_noisy`` (s1 + s2 + white noise
at ``SNR_DB`` relative to the clean mixture's mean power). Sources are stored exactly as they appear in the
mixture, so ``mix_clean == s1 + s2`` sample by sample (int16).

Usage::

    python scripts/make_data_samples.py [--out data_samples]

Running it twice gives byte-identical files (fixed seeds; espeak-ng output is deterministic for a given
version, recorded in ``generation.json``). Only this script needs espeak-ng and scipy; mtlab does not.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import shutil
import subprocess
import sys
import tempfile
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SEED = 20240611
SAMPLE_RATE = 8000
ESPEAK_RATE = 22050
SNR_DB = 10.0
SIR_RANGE_DB = (0.0, 5.0)
PEAK_RANGE = (0.25, 0.5)
SPLITS: dict[str, int] = {"train": 120, "dev": 24, "test": 24}
STREAMS = ("mix_clean", "mix_noisy", "s1", "s2")
MAX_SECONDS = 3.0

# (espeak-ng voice, pitch 0-99, speed words/min); the index is the speaker id.
SPEAKERS: list[tuple[str, int, int]] = [
    ("en-us+m3", 40, 165),
    ("en-us+f3", 70, 175),
    ("en+m1", 30, 150),
    ("en+f2", 80, 165),
    ("en-gb-scotland+m2", 50, 185),
    ("en-029+f4", 60, 155),
    ("en-us+m7", 45, 195),
    ("en-gb-x-rp+f1", 75, 145),
    ("en-us+m5", 25, 170),
    ("en-gb+f5", 90, 160),
]

DIGITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "oh"]
WORDS = [
    "red", "green", "blue", "white", "lay", "place", "set", "put", "bin", "at", "by", "with",
    "now", "again", "soon", "please", "apple", "river", "window", "garden", "yellow", "morning",
    "signal", "bright", "quiet", "table", "number", "letter", "paper", "silver",
]
SUBJECTS = ["the cat", "a dog", "my friend", "the teacher", "our team", "the pilot", "a child", "the robot"]
VERBS = ["opens", "finds", "paints", "carries", "follows", "watches", "cleans", "moves"]
OBJECTS = ["the door", "a box", "the boat", "this map", "the lamp", "a chair", "the clock", "that bag"]


@dataclass(frozen=True)
class Utterance:
    """One source utterance: a speaker id and the text it speaks."""

    speaker: int
    text: str


@dataclass(frozen=True)
class MixtureSpec:
    """Everything needed to render one mixture, drawn once by :func:`plan`."""

    name: str
    split: str
    index: int
    utt1: Utterance
    utt2: Utterance
    sir_db: float
    peak: float


def _random_text(rng: np.random.Generator) -> str:
    kind = rng.integers(3)
    if kind == 0:
        return " ".join(DIGITS[i] for i in rng.integers(len(DIGITS), size=int(rng.integers(2, 5))))
    if kind == 1:
        return " ".join(WORDS[i] for i in rng.integers(len(WORDS), size=int(rng.integers(2, 4))))
    return " ".join(
        (SUBJECTS[rng.integers(len(SUBJECTS))], VERBS[rng.integers(len(VERBS))], OBJECTS[rng.integers(len(OBJECTS))])
    )


def plan(seed: int = SEED, splits: dict[str, int] = SPLITS) -> list[MixtureSpec]:
    """Draw every mixture's speakers, texts and gains; texts are unique, so splits share no utterance."""
    rng = np.random.default_rng(seed)
    used_texts: set[str] = set()
    specs: list[MixtureSpec] = []
    for split, count in splits.items():
        for index in range(count):
            spk1, spk2 = (int(s) for s in rng.choice(len(SPEAKERS), size=2, replace=False))
            texts = []
            while len(texts) < 2:
                text = _random_text(rng)
                if text not in used_texts:
                    used_texts.add(text)
                    texts.append(text)
            specs.append(
                MixtureSpec(
                    name=f"{split}_{index:04d}_spk{spk1}_spk{spk2}",
                    split=split,
                    index=index,
                    utt1=Utterance(spk1, texts[0]),
                    utt2=Utterance(spk2, texts[1]),
                    sir_db=float(rng.uniform(*SIR_RANGE_DB)),
                    peak=float(rng.uniform(*PEAK_RANGE)),
                )
            )
    return specs


def espeak_version() -> str:
    """The installed espeak-ng version line, or raise with the install command."""
    if shutil.which("espeak-ng") is None:
        raise RuntimeError("espeak-ng not found; install it with `apt-get install -y espeak-ng`")
    out = subprocess.run(["espeak-ng", "--version"], capture_output=True, text=True, check=True).stdout
    return out.split("Data at")[0].strip()


def _trim(x: np.ndarray, rate: int, floor_db: float = 40.0, margin_s: float = 0.05) -> np.ndarray:
    hop = rate // 100
    n = len(x) // hop
    energy = (x[: n * hop].reshape(n, hop) ** 2).mean(axis=1) + 1e-20
    level = 10 * np.log10(energy)
    active = np.flatnonzero(level > level.max() - floor_db)
    margin = int(margin_s * rate)
    start = max(active[0] * hop - margin, 0)
    stop = min((active[-1] + 1) * hop + margin, len(x))
    return x[start:stop]


def synthesize(utt: Utterance) -> np.ndarray:
    """Render ``utt`` with espeak-ng; returns float64 at 8 kHz, trimmed, peak 1."""
    from scipy.signal import resample_poly

    voice, pitch, speed = SPEAKERS[utt.speaker]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "u.wav"
        subprocess.run(
            ["espeak-ng", "-v", voice, "-p", str(pitch), "-s", str(speed), "-w", str(path), utt.text],
            check=True,
            capture_output=True,
        )
        with wave.open(str(path), "rb") as w:
            if w.getframerate() != ESPEAK_RATE or w.getsampwidth() != 2 or w.getnchannels() != 1:
                raise RuntimeError(f"unexpected espeak-ng output format in {path}")
            raw = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float64) / 32768.0
    x = resample_poly(raw, 160, 441)  # 22050 * 160 / 441 = 8000
    x = _trim(x, SAMPLE_RATE)
    return x / np.abs(x).max()


def mix(spec: MixtureSpec, src1: np.ndarray, src2: np.ndarray, seed: int = SEED) -> dict[str, np.ndarray]:
    """Mix two rendered sources as int16 streams ``mix_clean``, ``mix_noisy``, ``s1``, ``s2``."""
    rng = np.random.default_rng([seed, list(SPLITS).index(spec.split), spec.index])
    length = max(len(src1), len(src2))
    max_len = int(MAX_SECONDS * SAMPLE_RATE)
    if length > max_len:
        length = max_len
        src1, src2 = src1[:max_len], src2[:max_len]
    placed = []
    for src in (src1, src2):
        offset = int(rng.integers(0, length - len(src) + 1))
        buf = np.zeros(length)
        buf[offset : offset + len(src)] = src
        placed.append(buf / np.sqrt(np.mean(src**2)))
    s1 = placed[0] * 10 ** (spec.sir_db / 20)
    s2 = placed[1]
    scale = spec.peak / np.abs(s1 + s2).max()
    s1_i = np.round(s1 * scale * 32767).astype(np.int64)
    s2_i = np.round(s2 * scale * 32767).astype(np.int64)
    clean = s1_i + s2_i
    noise_rms = np.sqrt(np.mean(clean.astype(np.float64) ** 2)) / 10 ** (SNR_DB / 20)
    noisy = np.round(clean + rng.standard_normal(length) * noise_rms).astype(np.int64)
    out = {"mix_clean": clean, "mix_noisy": noisy, "s1": s1_i, "s2": s2_i}
    for key, x in out.items():
        if np.abs(x).max() > 32767:
            raise RuntimeError(f"{spec.name}/{key} would clip; lower PEAK_RANGE")
    return {key: x.astype("<i2") for key, x in out.items()}


def wav_bytes(x: np.ndarray, rate: int = SAMPLE_RATE) -> bytes:
    """16-bit mono PCM WAV file content for int16 samples ``x``."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(x.astype("<i2").tobytes())
    return buf.getvalue()


def render(spec: MixtureSpec) -> dict[str, bytes]:
    """WAV bytes of each stream of one mixture."""
    streams = mix(spec, synthesize(spec.utt1), synthesize(spec.utt2))
    return {key: wav_bytes(x) for key, x in streams.items()}


README = """# mtlab sample data

Small two-speaker speech separation corpus for mtlab's tests, notebooks and benchmarks.
Generated by `python scripts/make_data_samples.py` (deterministic: rerunning it gives identical bytes,
checked by `MANIFEST.sha256`; run `sha256sum -c MANIFEST.sha256` inside this folder).

## How it was made
- Speech: espeak-ng ({espeak}), {nspk} synthetic speakers (voice x pitch x speed, see `speakers.tsv`),
  speaking random digit strings, word lists and short sentences; resampled from 22.05 kHz to 8 kHz
  (scipy `resample_poly`), silence-trimmed.
- Mixtures: two different speakers; s1 is {sir0:g}-{sir1:g} dB louder than s2 (RMS over its active part), so s1 is
  the main speaker; the shorter source sits at a random offset; length is the longer source (cut at {maxsec} s).
  Sources are stored as they appear in the mixture: `mix_clean = s1 + s2` exactly (int16).
- Linked sets: `mix_clean` and `mix_noisy` (= `mix_clean` + white Gaussian noise at {snr:g} dB SNR relative to
  the clean mixture's mean power over the whole file), same names, same sources. Seed {seed}.
- Audio format: 8 kHz, mono, 16-bit PCM WAV.

## Layout
`<split>/<stream>.scp` for split in train/dev/test and stream in mix_clean/mix_noisy/s1/s2: Kaldi-style
lines `name path`, **paths relative to the directory of the list file** (absolute paths are also accepted by
mtlab). `<split>/spk.txt`: `name id1 id2` (speaker ids of s1 and s2; id1 is the main speaker).
`<split>/meta.tsv`: texts, SIR and peak of every mixture. Splits share no utterance (all texts are unique).

| split | mixtures | seconds | shortest (s) | longest (s) |
|---|---|---|---|---|
{table}

## License
The audio and lists were produced by this project's script and are released under CC0 1.0 (public domain
dedication). espeak-ng, the synthesizer used to make them, is GPL-3.0 software; it is not shipped here and
is not needed to use the data.
"""


def write_corpus(out: Path, seed: int = SEED) -> None:
    """Render every mixture and write audio, lists, README and manifest under ``out``."""
    version = espeak_version()
    if out.exists():
        shutil.rmtree(out)
    specs = plan(seed)
    durations: dict[str, list[float]] = {split: [] for split in SPLITS}
    for split in SPLITS:
        for stream in STREAMS:
            (out / split / stream).mkdir(parents=True)
    lists: dict[tuple[str, str], list[str]] = {}
    for n, spec in enumerate(specs):
        files = render(spec)
        for stream, data in files.items():
            (out / spec.split / stream / f"{spec.name}.wav").write_bytes(data)
            lists.setdefault((spec.split, stream), []).append(f"{spec.name} {stream}/{spec.name}.wav")
        durations[spec.split].append((len(files["s1"]) - 44) / 2 / SAMPLE_RATE)
        if n % 50 == 0:
            print(f"{n}/{len(specs)} {spec.name}", file=sys.stderr)
    for (split, stream), lines in lists.items():
        (out / split / f"{stream}.scp").write_text("\n".join(lines) + "\n")
    for split in SPLITS:
        rows = [s for s in specs if s.split == split]
        (out / split / "spk.txt").write_text("".join(f"{s.name} {s.utt1.speaker} {s.utt2.speaker}\n" for s in rows))
        meta = ["name\tspk1\tspk2\ttext1\ttext2\tsir_db\tpeak"]
        meta += [
            f"{s.name}\t{s.utt1.speaker}\t{s.utt2.speaker}\t{s.utt1.text}\t{s.utt2.text}\t{s.sir_db:.3f}\t{s.peak:.3f}"
            for s in rows
        ]
        (out / split / "meta.tsv").write_text("\n".join(meta) + "\n")
    (out / "speakers.tsv").write_text(
        "id\tvoice\tpitch\tspeed\n" + "".join(f"{i}\t{v}\t{p}\t{s}\n" for i, (v, p, s) in enumerate(SPEAKERS))
    )
    generation = {
        "seed": seed,
        "espeak_ng": version,
        "sample_rate": SAMPLE_RATE,
        "snr_db": SNR_DB,
        "sir_range_db": list(SIR_RANGE_DB),
        "splits": SPLITS,
        "num_speakers": len(SPEAKERS),
        "path_convention": "relative to the list file's directory",
    }
    (out / "generation.json").write_text(json.dumps(generation, indent=2) + "\n")
    table = "\n".join(
        f"| {s} | {SPLITS[s]} | {sum(d):.1f} | {min(d):.2f} | {max(d):.2f} |" for s, d in durations.items()
    )
    (out / "README.md").write_text(
        README.format(
            espeak=version, nspk=len(SPEAKERS), maxsec=MAX_SECONDS, sir0=SIR_RANGE_DB[0],
            sir1=SIR_RANGE_DB[1], snr=SNR_DB, seed=seed, table=table,
        )
    )
    write_manifest(out)


def write_manifest(out: Path) -> None:
    """``MANIFEST.sha256`` in ``sha256sum`` format over every other file under ``out``."""
    paths = sorted(p for p in out.rglob("*") if p.is_file() and p.name != "MANIFEST.sha256")
    lines = [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.relative_to(out).as_posix()}" for p in paths]
    (out / "MANIFEST.sha256").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "data_samples")
    args = parser.parse_args(argv)
    write_corpus(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
