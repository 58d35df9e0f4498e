"""lhotse against mtlab's own streamed path: manifest memory, loader throughput, exact resume, padding.

    python bench/lhotse_compare.py [--hours 1 30] [--batches 40] [--batch-size 8] [--buckets 10]
                                   [--workdir /tmp/mtlab-lhotse]

Corpora: ``bench/scale.py``'s synthetic wsj0-2mix trees (hard links to the sample training split, so the files
are few and sit in the page cache: disk reads are not measured, only the work of each library). Every row runs
in a fresh process, one contender at a time, side by side in one run:

- manifest: time and memory (RSS growth after the imports, and peak) until the first batch's utterances are
  known, without audio. mtlab: ``load_split(stream=True)`` (header lengths read, or from their cache) and a
  ``BatchStream``. lhotse: a ``CutSet`` built from the same lists (``Recording.from_file`` on each mixture, the
  sources as custom ``Recording`` fields ``source_1``/``source_2``, the speakers as supervisions; lhotse ships
  no wsj0-2mix recipe and its WHAM! one lists recordings without pairing mixtures and sources), then read back
  from ``cuts.jsonl.gz`` eagerly (``CutSet.from_file(...).to_eager()``) and lazily (``CutSet.from_jsonl_lazy``),
  each with a ``DynamicBucketingSampler`` (its defaults: bins estimated from 10,000 cuts, a 20,000-cut buffer).
- loader: examples/s, batches/s and audio seconds/s of reading mixture + sources, collated, over ``--batches``
  batches after the first, with 0 and 2 DataLoader workers; each row runs twice (mtlab, lhotse, lhotse, mtlab) and
  the faster run counts, as other work on a shared machine only slows a run down. mtlab: ``BatchStream`` (its own DataLoader) with
  the features left out; lhotse: ``DynamicBucketingSampler`` (``max_duration`` = batch size x mean utterance
  duration, so the batches hold as much audio) over the lazy CutSet, a Dataset calling ``collate_audio``.
- resume: draw 10 batches, save the sampler state, draw 10 more (the reference); restore the state into a new
  sampler and loader and draw 10: exact when they equal the reference, else how many batches were lost.
- padding: padded / all samples of one epoch's batches, and the mean batch size.
"""
from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
RATE = 8000
RESUME_AT, RESUME_DRAW = 10, 10


# ----------------------------------------------------------------------------------------------- corpus
def read_pairs(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines() if line.strip()]


def build_cuts(lists: Path, out: Path):
    """A lhotse CutSet of the training mixtures listed under ``lists``: the mixture recording (header read by
    lhotse), the sources as custom Recording fields of the same length, one supervision per speaker; written
    to ``out`` (jsonl.gz) and returned (eager)."""
    from lhotse import AudioSource, CutSet, Recording, SupervisionSegment

    folder = lists / "train"
    sources = [dict(read_pairs(folder / f"s{k}.scp")) for k in (1, 2)]
    speakers = {row[0]: row[1:] for row in read_pairs(folder / "spk.txt")}
    cuts = []
    for name, path in read_pairs(folder / "mix_clean.scp"):
        rec = Recording.from_file(path, recording_id=name)
        cut = rec.to_cut()
        for k, src in enumerate(sources, start=1):
            setattr(cut, f"source_{k}", Recording(id=f"{name}-s{k}", sources=[AudioSource("file", [0], src[name])],
                                                   sampling_rate=rec.sampling_rate, num_samples=rec.num_samples,
                                                   duration=rec.duration))
        cut.supervisions = [SupervisionSegment(f"{name}-{k}", name, 0.0, rec.duration, speaker=spk)
                            for k, spk in enumerate(speakers[name])]
        cuts.append(cut)
    cutset = CutSet.from_cuts(cuts)
    cutset.to_file(out)
    return cutset


def fixed_stats():
    """Feature statistics given (not computed): the statistics pass is mtlab's own extra and is left out."""
    import torch

    from mtlab.data import NUM_BINS, FeatureStats

    return FeatureStats(torch.zeros(NUM_BINS), torch.ones(NUM_BINS), 1, "bench")


class AudioOnly:
    """A streamed split whose batches stay audio: BatchStream reads and collates, ``featurize`` passes through."""

    def __init__(self, split) -> None:
        self.source, self.lengths = split, split.lengths

    def __len__(self) -> int:
        return len(self.source)

    def audio(self, i: int):
        return self.source.audio(i)

    def featurize(self, batch, device=None):
        return batch


def mtlab_stream(lists: Path, args, workers: int):
    from mtlab.data import load_split
    from mtlab.tasks.sampling import BatchStream

    split = load_split(root=lists, split="train", linkedset="clean", stream=True, stats=fixed_stats(), progress=False)
    return split, BatchStream(AudioOnly(split), args.batch_size, args.buckets, seed=0, num_workers=workers)


class LhotseAudio:
    """lhotse's map-style dataset pattern: the sampler gives a CutSet, this loads mixture and sources."""

    def __getitem__(self, cuts):
        import torch
        from lhotse.dataset.collation import collate_audio

        mix, lengths = collate_audio(cuts)
        sources = [collate_audio(cuts, recording_field=f"source_{k}")[0] for k in (1, 2)]
        return {"mix_wav": mix, "src_wav": torch.stack(sources, dim=-1), "lengths": lengths, "ids": list(cuts.ids)}


def lhotse_sampler(cuts, args, mean_seconds: float):
    from lhotse.dataset import DynamicBucketingSampler

    return DynamicBucketingSampler(cuts, max_duration=args.batch_size * mean_seconds, num_buckets=args.buckets,
                                   shuffle=True, seed=0)


def lhotse_loader(sampler, workers: int):
    import torch

    return torch.utils.data.DataLoader(LhotseAudio(), sampler=sampler, batch_size=None, num_workers=workers)


def mean_seconds(lists: Path) -> float:
    info = json.loads((lists / "bench-mean.json").read_text())
    return info["mean_seconds"]


# ----------------------------------------------------------------------------------------------- rows
def manifest_row(contender: str, lists: Path, args) -> dict:
    from common import reset_peak_rss, rss

    if contender.startswith("lhotse"):
        import lhotse  # noqa: F401  (its import is not the manifest's memory)
    import mtlab.data  # noqa: F401
    import mtlab.tasks.sampling  # noqa: F401

    jsonl = lists / "cuts.jsonl.gz"
    if contender == "mtlab, headers read":
        for cache in lists.glob("train/*.samples.npz"):
            cache.unlink()
    gc.collect()
    base = reset_peak_rss()
    start = time.perf_counter()
    if contender.startswith("mtlab"):
        split, stream = mtlab_stream(lists, args, 0)
        first = stream.next_indices()
        count = len(split)
    else:
        from lhotse import CutSet

        if contender == "lhotse, built from lists":
            cuts = build_cuts(lists, jsonl)
        elif contender == "lhotse, jsonl.gz eager":
            cuts = CutSet.from_file(jsonl).to_eager()  # from_file alone reads a jsonl.gz lazily
        else:
            cuts = CutSet.from_jsonl_lazy(jsonl)
        sampler = lhotse_sampler(cuts, args, mean_seconds(lists))
        first = next(iter(sampler))
    seconds = time.perf_counter() - start
    if contender.startswith("lhotse"):  # a lazy CutSet has no length: counted after the clock stopped
        count = sum(1 for _ in CutSet.from_jsonl_lazy(jsonl)) if contender.endswith("lazy") else len(cuts)
    gc.collect()
    assert len(first) > 0
    return {"seconds": seconds, "rss_mb": (rss("VmRSS") - base) / 2**20, "peak_mb": (rss("VmHWM") - base) / 2**20,
            "utterances": count}


def loader_row(contender: str, lists: Path, args, workers: int) -> dict:
    from common import reset_peak_rss, rss

    import torch

    torch.set_num_threads(1)
    base = reset_peak_rss()
    start = time.perf_counter()
    if contender == "mtlab":
        _split, stream = mtlab_stream(lists, args, workers)
        batches = iter(stream)
        size = (lambda b: b[0]["mix_wav"].shape[0])
        audio = (lambda b: int(b[1]["mix_wav"].sum()))
    else:
        from lhotse import CutSet

        cuts = CutSet.from_jsonl_lazy(lists / "cuts.jsonl.gz")
        batches = iter(lhotse_loader(lhotse_sampler(cuts, args, mean_seconds(lists)), workers))
        size = (lambda b: b["mix_wav"].shape[0])
        audio = (lambda b: int(b["lengths"].sum()))
    next(batches)
    first = time.perf_counter() - start
    examples = samples = 0
    t = time.perf_counter()
    for _ in range(args.batches):
        b = next(batches)
        examples += size(b)
        samples += audio(b)
    elapsed = time.perf_counter() - t
    del batches
    if contender == "mtlab":
        stream._loader_iter = None  # ends its workers, so their peaks are counted below
        del stream
    gc.collect()
    return {"first_s": first, "examples_s": examples / elapsed, "batches_s": args.batches / elapsed,
            "audio_s": samples / RATE / elapsed, "peak_mb": (rss("VmHWM") - base) / 2**20,
            "worker_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024 if workers else 0.0}


def resume_row(contender: str, lists: Path, args, workers: int) -> dict:
    import torch

    torch.set_num_threads(1)
    if contender == "mtlab":
        _split, stream = mtlab_stream(lists, args, workers)
        for _ in range(RESUME_AT):
            next(stream)
        state = copy.deepcopy(stream.state_dict())
        reference = [next(stream)[0]["mix_wav"] for _ in range(RESUME_DRAW + 10)]
        stream._loader_iter = None
        t = time.perf_counter()
        _split, fresh = mtlab_stream(lists, args, workers)
        fresh.load_state_dict(state)
        got = [next(fresh)[0]["mix_wav"] for _ in range(RESUME_DRAW)]
        restore = time.perf_counter() - t
        fresh._loader_iter = None
        same = (lambda a, b: a.shape == b.shape and bool(torch.equal(a, b)))
    else:
        from lhotse import CutSet

        def loader():
            cuts = CutSet.from_jsonl_lazy(lists / "cuts.jsonl.gz")
            sampler = lhotse_sampler(cuts, args, mean_seconds(lists))
            return sampler, lhotse_loader(sampler, workers)

        sampler, dl = loader()
        batches = iter(dl)
        for _ in range(RESUME_AT):
            next(batches)
        state = copy.deepcopy(sampler.state_dict())  # lhotse's load_state_dict consumes the dict it is given
        reference = [next(batches)["ids"] for _ in range(RESUME_DRAW + 10)]
        del batches
        t = time.perf_counter()
        sampler, dl = loader()
        sampler.load_state_dict(state)
        batches = iter(dl)
        got = [next(batches)["ids"] for _ in range(RESUME_DRAW)]
        restore = time.perf_counter() - t
        del batches
        same = (lambda a, b: a == b)
    exact = all(same(a, b) for a, b in zip(got, reference[:RESUME_DRAW]))
    lost = next((k for k in range(len(reference)) if same(got[0], reference[k])), None)
    return {"exact": exact, "lost": lost, "restore_s": restore}


def padding_row(contender: str, lists: Path, args) -> dict:
    padded = total = batches = 0
    if contender == "mtlab":
        from mtlab.tasks.sampling import bucket_batches

        split, _stream = mtlab_stream(lists, args, 0)
        samples = split.samples
        for batch in bucket_batches(split.lengths, args.batch_size, args.buckets, 0, 0):
            n = [int(samples[i]) for i in batch]
            total += max(n) * len(n)
            padded += max(n) * len(n) - sum(n)
            batches += 1
        count = len(split)
    else:
        from lhotse import CutSet

        cuts = CutSet.from_jsonl_lazy(lists / "cuts.jsonl.gz")
        count = 0
        for batch in lhotse_sampler(cuts, args, mean_seconds(lists)):
            n = [c.num_samples for c in batch]
            total += max(n) * len(n)
            padded += max(n) * len(n) - sum(n)
            batches += 1
            count += len(n)
    return {"padding": padded / total, "batch_size": count / batches, "batches": batches}


# ----------------------------------------------------------------------------------------------- driver
def prepare_corpus(hours: float, workdir: Path) -> Path:
    """bench/scale.py's corpus of ``hours``, plus its mean utterance duration and its lhotse manifest."""
    import wave

    from scale import build_corpus

    lists = build_corpus(hours, workdir)
    if not (lists / "bench-mean.json").is_file():
        paths = [row[1] for row in read_pairs(lists / "train" / "mix_clean.scp")]
        frames = {}
        for p in paths:  # the pool is small: the files are links to a few hundred distinct ones
            inode = os.stat(p).st_ino
            if inode not in frames:
                with wave.open(p) as w:
                    frames[inode] = w.getnframes()
        seconds = sum(frames[os.stat(p).st_ino] for p in paths) / RATE / len(paths)
        (lists / "bench-mean.json").write_text(json.dumps({"mean_seconds": seconds}))
    return lists


def run(kind: str, contender: str, lists: Path, args, workers: int = 0) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, __file__, "--child", kind, contender, str(lists), str(workers),
           "--batches", str(args.batches), "--batch-size", str(args.batch_size), "--buckets", str(args.buckets)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise SystemExit(f"row failed: {' '.join(cmd)}\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


MANIFESTS = ("mtlab, headers read", "mtlab, headers cached", "lhotse, built from lists", "lhotse, jsonl.gz eager",
             "lhotse, jsonl.gz lazy")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hours", type=float, nargs="+", default=[1, 30])
    parser.add_argument("--batches", type=int, default=40, help="batches timed per loader row (after the first)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--buckets", type=int, default=10)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/mtlab-lhotse"))
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, contender, lists, workers = args.child
        rows = {"manifest": lambda: manifest_row(contender, Path(lists), args),
                "loader": lambda: loader_row(contender, Path(lists), args, int(workers)),
                "resume": lambda: resume_row(contender, Path(lists), args, int(workers)),
                "padding": lambda: padding_row(contender, Path(lists), args)}
        print(json.dumps(rows[kind]()))
        return
    import lhotse

    args.workdir.mkdir(parents=True, exist_ok=True)
    corpora = {h: prepare_corpus(h, args.workdir) for h in args.hours}
    largest = corpora[max(args.hours)]
    print(f"lhotse {lhotse.__version__}; batch size {args.batch_size} utterances (lhotse: the same audio per "
          f"batch), {args.buckets} buckets; fresh process per row\n")

    print("| corpus | manifest | utterances | seconds | RSS growth | peak | peak / mtlab's |\n|---|---|---|---|---|---|---|")
    for hours, lists in corpora.items():
        rows = {name: run("manifest", name, lists, args) for name in MANIFESTS}
        ref = rows["mtlab, headers read"]
        for name, r in rows.items():
            print(f"| {hours:g} h | {name} | {r['utterances']} | {r['seconds']:.1f} | {r['rss_mb']:.1f} MB | "
                  f"{r['peak_mb']:.1f} MB | {r['peak_mb'] / max(ref['peak_mb'], 0.1):.1f}x |", flush=True)

    print(f"\n| loader ({max(args.hours):g} h, {args.batches} batches) | workers | first batch | examples/s | "
          "batches/s | audio s/s | main peak | worker peak | examples/s lhotse/mtlab |\n|---|---|---|---|---|---|---|---|---|")
    for workers in (0, 2):
        runs = [(c, run("loader", c, largest, args, workers)) for c in ("mtlab", "lhotse", "lhotse", "mtlab")]
        rows = {c: max((r for name, r in runs if name == c), key=lambda r: r["examples_s"]) for c in ("mtlab", "lhotse")}
        for c, r in rows.items():
            ratio = r["examples_s"] / rows["mtlab"]["examples_s"]
            print(f"| {c} | {workers} | {r['first_s']:.2f} s | {r['examples_s']:.0f} | {r['batches_s']:.1f} | "
                  f"{r['audio_s']:.0f} | {r['peak_mb']:.0f} MB | {r['worker_mb']:.0f} MB | {ratio:.2f} |", flush=True)

    print(f"\n| resume ({max(args.hours):g} h) | workers | next {RESUME_DRAW} batches equal | batches lost | "
          "restore + 10 batches |\n|---|---|---|---|---|")
    for workers in (0, 2):
        for c in ("mtlab", "lhotse"):
            r = run("resume", c, largest, args, workers)
            print(f"| {c} | {workers} | {'yes' if r['exact'] else 'NO'} | "
                  f"{r['lost'] if r['lost'] is not None else 'not found'} | {r['restore_s']:.1f} s |", flush=True)

    print(f"\n| padding ({max(args.hours):g} h, one epoch) | padded / all samples | mean batch size | batches |"
          "\n|---|---|---|---|")
    for c in ("mtlab", "lhotse"):
        r = run("padding", c, largest, args)
        print(f"| {c} | {r['padding']:.3f} | {r['batch_size']:.2f} | {r['batches']} |", flush=True)


if __name__ == "__main__":
    main()
