"""Training at corpus scale: peak memory, time to the first step and steps/s against the corpus size.

    python bench/scale.py [--hours 1 10 30] [--steps 20] [--workers 2] [--workdir /tmp/mtlab-scale]

Builds synthetic corpora in the wsj0-2mix layout (``wav8k/min/tr/{mix,s1,s2}/<utt1>_<g>_<utt2>_<g>.wav``) of the
given hours, whose files are hard links to the sample corpus's training mixtures and sources (written once,
reused by name, so the disk holds 15 MB whatever the hours; the utterances, and so the work of a step, are the
sample corpus's). ``mtlab.data.layouts.prepare`` writes their lists. Then, in a fresh process per row, it builds
the demo recipe's model and its two tasks on the ``clean`` linked set and trains ``--steps`` steps:

- ``memory``: the in-memory path (every example precomputed) on the sample corpus -- the reference;
- ``stream``: the streamed path (audio read per batch by ``--workers`` DataLoader workers, features on the
  device) on the sample corpus and on each synthetic corpus; the largest corpus runs twice, the second time
  with its feature statistics, header lengths and parsed lists cached (the first run of each corpus computes
  them: the statistics and lengths beside the lists, the parsed lists in ``WORKDIR/cache``).

It prints per row: peak RSS of the training process and the largest peak of its data workers (getrusage of
the reaped workers), seconds from process start to the end of the first step, steps/s over the remaining
steps, and their ratios to the in-memory row.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "data_samples"


def build_corpus(hours: float, workdir: Path) -> Path:
    """The lists of a wsj0-2mix tree of ``hours`` of audio made of hard links to the sample training split."""
    import wave

    lists = workdir / f"lists-{hours:g}h"
    if (lists / "layout.json").is_file():
        return lists
    tree = workdir / f"wsj0-2mix-{hours:g}h" / "wav8k" / "min" / "tr"
    pool = []
    for line in (SAMPLES / "train" / "spk.txt").read_text().splitlines():
        name, a, b = line.split()
        files = [SAMPLES / "train" / d / f"{name}.wav" for d in ("mix_clean", "s1", "s2")]
        with wave.open(str(files[0])) as w:
            seconds = w.getnframes() / w.getframerate()
        pool.append((int(a), int(b), files, seconds))
    mean = sum(p[3] for p in pool) / len(pool)
    count = int(round(hours * 3600 / mean))
    for d in ("mix", "s1", "s2"):
        (tree / d).mkdir(parents=True, exist_ok=True)
    for i in range(count):
        a, b, files, _ = pool[i % len(pool)]
        name = f"{a:03d}c{i:05x}_0.5_{b:03d}d{i:05x}_-0.5"  # wsj0 utterance ids start with the speaker
        for d, src in zip(("mix", "s1", "s2"), files):
            target = tree / d / f"{name}.wav"
            if not target.exists():
                os.link(src, target)
    from mtlab.data.layouts import prepare

    prepare("wsj0-2mix", tree.parents[2], lists)
    return lists


def recipe(root: Path, stream: bool, workers: int, steps: int) -> dict:
    """The demo recipe, trained on the ``clean`` linked set of ``root`` only, without validation."""
    r = tomllib.loads((REPO / "recipes" / "demo.toml").read_text())
    r["trainer"].update(num_steps=steps, valid_frequency=0, device="cpu", go_back=False, valid_adapt=False)
    r["trainer"].pop("num_epochs", None)
    for task in r["tasks"].values():
        data = {"root": str(root), "split": "train", "linkedset": "clean", "stream": stream}
        if stream:
            data["num_workers"] = workers
        task["linkedsets"] = {"clean": {"data": data}}
    return copy.deepcopy(r)


def child(root: Path, stream: bool, workers: int, steps: int, start: float) -> dict:
    """Train ``steps`` steps in this process; the figures of one row."""
    import gc

    import torch

    from mtlab.apps.recipe import from_recipe

    imported = time.time() - start  # interpreter, torch and mtlab: the same for every row
    torch.set_num_threads(1)
    t = time.perf_counter()
    exp = from_recipe(recipe(root, stream, workers, steps))
    built = time.perf_counter() - t  # lists or manifest, lengths, statistics, models, optimizer
    exp.trainer.step()
    first = time.time() - start
    t = time.perf_counter()
    for _ in range(steps - 1):
        exp.trainer.step()
    rate = (steps - 1) / (time.perf_counter() - t)
    utterances = len(exp.trainer.tasks["spk"].linkedsets["clean"].examples)
    exp.trainer.streams.clear()  # ends the DataLoader workers, so their peaks are counted below
    gc.collect()
    kib = 1024  # ru_maxrss is in KiB on Linux
    return {"rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / kib,
            "worker_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / kib,
            "first_step_s": first, "import_s": imported, "build_s": built, "steps_per_s": rate, "utterances": utterances}


def run_row(root: Path, stream: bool, workers: int, steps: int, cache: Path | None = None) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    if cache is not None:  # the user cache folder (parsed manifests) of this run, emptied for a cold row
        env["MTLAB_CACHE"] = str(cache)
    cmd = [sys.executable, __file__, "--child", str(root), "--stream", str(int(stream)), "--workers", str(workers),
           "--steps", str(steps), "--start", repr(time.time())]  # the clock starts before the interpreter does
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise SystemExit(f"row failed: {' '.join(cmd)}\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hours", type=float, nargs="+", default=[1, 10, 30])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/mtlab-scale"))
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--stream", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--start", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, bool(args.stream), args.workers, args.steps, args.start)))
        return
    args.workdir.mkdir(parents=True, exist_ok=True)
    samples = SAMPLES  # the sample corpus's own lists, read where they lie
    rows = [("sample corpus, in memory", run_row(samples, False, 0, args.steps)),
            (f"sample corpus, streamed ({args.workers} workers)", run_row(samples, True, args.workers, args.steps))]
    for hours in args.hours:
        t = time.perf_counter()
        lists = build_corpus(hours, args.workdir)
        print(f"[{hours:g} h corpus ready in {time.perf_counter() - t:.1f} s: {lists}]", flush=True)
        for stale in [*lists.glob("*/*.stats.json"), *lists.glob("*/*.samples.npz")]:
            stale.unlink()  # the first run computes the statistics, reads every header and parses the lists
        cache = args.workdir / "cache"
        shutil.rmtree(cache, ignore_errors=True)
        rows.append((f"{hours:g} h, streamed", run_row(lists, True, args.workers, args.steps, cache)))
        if hours == max(args.hours):
            rows.append((f"{hours:g} h, streamed, cached", run_row(lists, True, args.workers, args.steps, cache)))
    ref = rows[0][1]
    print(f"\n{args.steps} steps of the demo model (2 tasks, batch 8, 1 CPU thread), fresh process per row")
    print("1st step: seconds from process start to the end of the first step (imports: of which starting Python and "
          "importing torch and mtlab; build: of which from_recipe, i.e. data, statistics, models and optimizer)")
    print(f"{'data':38s} {'utts':>7s} {'peak RSS':>9s} {'worker':>7s} {'1st step':>9s} {'imports':>8s} {'build':>6s} "
          f"{'steps/s':>8s} {'RSS/mem':>8s} {'speed/mem':>9s}")
    for label, r in rows:
        print(f"{label:38s} {r['utterances']:7d} {r['rss_mb']:7.0f}MB {r['worker_mb']:5.0f}MB {r['first_step_s']:8.1f}s "
              f"{r['import_s']:7.1f}s {r['build_s']:5.1f}s {r['steps_per_s']:8.2f} {r['rss_mb'] / ref['rss_mb']:8.2f} "
              f"{r['steps_per_s'] / ref['steps_per_s']:9.2f}")


if __name__ == "__main__":
    main()
