"""Train the small separator mtlab ships (mtlab/separation/weights/pit_blstm_clean.pt), resumably, and print
its dev and test SI-SDR / SDR improvement (measured on the weights as stored: float16, loaded back) beside the
ideal binary and ratio masks on the same splits.

    python scripts/train_pretrained_separator.py                 # train (or resume) the shipped recipe
    python scripts/train_pretrained_separator.py --evaluate      # only score the shipped file
    python scripts/train_pretrained_separator.py --steps 20 --run /tmp/r --out /tmp/x.pt   # a quick try
    python scripts/train_pretrained_separator.py --init-from A.pt --steps 4000 --lr 3e-4 --out B.pt  # a second stage
    python scripts/train_pretrained_separator.py --average B.pt C.pt --init-from A.pt --out D.pt   # their mean
    python scripts/train_pretrained_separator.py --average B.pt --init-from A.pt --mask-power auto --out D.pt

The run keeps its checkpoint in ``--run`` (``checkpoint.pt``: models, optimizer, accumulators, data-stream
positions, RNG, step, learning rate, the recipe and the CPU seconds spent so far; written atomically every
``--save-every`` steps) and a log of its dev figures (``progress.tsv``). Run the same command again and it
resumes where the checkpoint stands, so a budget of hours of CPU can be spread over several runs; a recipe
setting that differs from the checkpoint's is refused. The step budget, not the clock, decides where training
stops, so a rerun gives the same file on the same torch version; the CPU seconds it reports are the process's
(summed over the runs), which do not depend on what else runs on the machine. ``--minutes`` stops this run
early (at a checkpoint), for a later run to resume.

The recipe (defaults): PIT with a sigmoid mask head on a BLSTM (the original's MERL_PIT_2spk recipe, smaller),
dynamic mixing of the clean training sources (a new mixture per example and epoch), batch 8, Adam from lr 1e-3
decaying exponentially to lr x ``--lr-decay`` at the last step, seed 0, one thread.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

from mtlab.core.state import load_safe, save_atomic
from mtlab.separation import build_separator
from mtlab.separation.pretrained import WEIGHTS, ideal_mask_scores, load_pretrained, pretrained_info, save_pretrained

RUN = Path(__file__).resolve().parent / "separator_run"
# Settings that decide the result: stored in the checkpoint, a resume with other values is refused.
RECIPE_KEYS = ("loss", "hidden", "layers", "mixing", "gain_db", "remix", "batch_size", "lr", "lr_decay", "steps",
               "save_every", "input_noise", "seed", "init_from")


def recipe(args: argparse.Namespace) -> dict[str, Any]:
    out = {k: getattr(args, k) for k in RECIPE_KEYS}
    out["gain_db"] = [float(g) for g in out["gain_db"]]
    out["init_from"] = str(out["init_from"]) if out["init_from"] is not None else None
    return out


def build(rec: dict[str, Any]):  # -> Separator
    dynamic = {"gain_db": rec["gain_db"]} if rec["mixing"] == "dynamic" else None
    return build_separator(rec["loss"], "clean", hidden=rec["hidden"], layers=rec["layers"], lr=rec["lr"],
                           batch_size=rec["batch_size"], seed=rec["seed"], device="cpu", input_noise=rec["input_noise"],
                           remix=rec["remix"] if rec["mixing"] == "remix" else 0, dynamic_mix=dynamic)


def lr_at(rec: dict[str, Any], step: int) -> float:
    """The learning rate of the steps from ``step`` on (constant within a chunk of ``save_every`` steps)."""
    return float(rec["lr"] * rec["lr_decay"] ** (step / rec["steps"]))


def figures(path: Path) -> dict[str, Any]:
    """What the file at ``path`` gets measured on its stored (float16) weights, loaded back as a notebook loads
    them: mean SI-SDRi and SDRi (dB) on dev and test, each test utterance's SI-SDRi (for a quick check of the
    file), and the ideal binary and ratio masks' figures on the same splits."""
    sep = load_pretrained(path=path)
    out: dict[str, Any] = {}
    for split in ("dev", "test"):
        df = sep.evaluate(split)
        out[f"{split}_si_sdri"] = round(float(df["si_sdri"].mean()), 2)
        out[f"{split}_sdri"] = round(float(df["sdri"].mean()), 2)
    out["test_names"] = list(df["name"])
    out["test_each_si_sdri"] = [round(float(v), 3) for v in df["si_sdri"]]
    if sep.cfg.mask_power is not None:  # and through the head's masks as they are, for comparison
        sep.cfg.mask_power = None
        for split in ("dev", "test"):
            out[f"{split}_si_sdri_head_masks"] = round(float(sep.evaluate(split, metrics=("si_sdr",))["si_sdri"].mean()), 2)
    out.update(ideal_mask_scores(sep, ("dev", "test")))
    return out


def average(paths: list[Path], base: Path | None, out: Path, mask_power: str | None = None) -> dict[str, Any]:
    """Write the mean of the weights of ``paths`` (files of one architecture, e.g. second stages from one
    ``base`` with other seeds) to ``out`` and measure it. The file counts the work of all of them: ``base``'s
    steps and CPU once, each file's own beyond it."""
    blobs = [torch.load(p, map_location="cpu", weights_only=True) for p in paths]
    shapes = {(b["config"]["loss"], b["config"]["hidden"], b["config"]["layers"]) for b in blobs}
    if len(shapes) != 1:
        sys.exit(f"--average: the files hold different architectures {sorted(shapes)}; average files of one")
    sep = load_pretrained(path=paths[0])
    for name, model in sep.trainer.models.items():
        model.load_state_dict({k: (sum(b["models"][name][k].float() for b in blobs) / len(blobs))
                               if v.is_floating_point() else v for k, v in blobs[0]["models"][name].items()})
    if mask_power is not None:
        sep.cfg.mask_power = choose_mask_power(sep) if mask_power == "auto" else \
            (None if mask_power == "none" else float(mask_power))
    infos = [b["info"] for b in blobs]
    prior = pretrained_info(base) if base is not None else {"steps": 0, "train_cpu_seconds": 0.0}
    info = {"steps": prior["steps"] + sum(i["steps"] - prior["steps"] for i in infos),
            "train_cpu_seconds": round(prior["train_cpu_seconds"] + sum(i["train_cpu_seconds"]
                                                                       - prior["train_cpu_seconds"] for i in infos), 1),
            "threads": infos[0]["threads"] if base is None or prior.get("threads") == infos[0]["threads"]
            else f"{prior.get('threads')}, then {infos[0]['threads']}", "torch": str(torch.__version__),
            "recipe": infos[0]["recipe"] if len(paths) == 1 else
            "the mean of the weights of: " + " | ".join(f"{p.name}: {i['recipe']}" for p, i in zip(paths, infos))}
    if mask_power is not None:
        info["recipe"] += f"; estimates through mask power {sep.cfg.mask_power} ({'chosen on dev' if mask_power == 'auto' else 'set'})"
    save_pretrained(sep, out, {**info, "dev_si_sdri": math.nan, "test_si_sdri": math.nan})
    info.update(figures(out))
    save_pretrained(sep, out, info)
    print(f"{'the weights' if len(paths) == 1 else f'the mean of {len(paths)} files weights'} of {', '.join(map(str, paths))}; "
          f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB)")
    report(info)
    return info


MASK_POWERS = (None, 1.5, 2.0, 3.0)  # what --mask-power auto tries on dev


def choose_mask_power(sep) -> float | None:
    """The mask power (``SeparatorConfig.mask_power``) of ``MASK_POWERS`` with the best dev SI-SDRi: chosen on
    dev, never on test."""
    scores = {}
    for p in MASK_POWERS:
        sep.cfg.mask_power = p
        scores[p] = float(sep.evaluate("dev", metrics=("si_sdr",))["si_sdri"].mean())
        print(f"  mask power {'none' if p is None else p}: dev SI-SDRi {scores[p]:+.2f} dB", flush=True)
    best = max(scores, key=lambda p: scores[p])
    sep.cfg.mask_power = best
    print(f"chosen on dev: mask power {best}")
    return best


def report(info: dict[str, Any]) -> None:
    for split in ("dev", "test"):
        head = info.get(f"{split}_si_sdri_head_masks")
        print(f"{split}: SI-SDRi {info[f'{split}_si_sdri']:+.2f} dB, SDRi {info[f'{split}_sdri']:+.2f} dB"
              + ("" if head is None else f" (the head's masks as they are: SI-SDRi {head:+.2f} dB)")
              + f"; ideal binary mask {info[f'{split}_ibm_si_sdri']:+.2f} / {info[f'{split}_ibm_sdri']:+.2f} dB, "
              f"ideal ratio mask {info[f'{split}_irm_si_sdri']:+.2f} / {info[f'{split}_irm_sdri']:+.2f} dB")


def dev_si_sdri(sep) -> float:
    """Dev SI-SDRi of the separator as it trains (float32 weights)."""
    return float(sep.evaluate("dev")["si_sdri"].mean())


def small_state(tr) -> dict[str, Any]:
    """The trainer's state between two steps, without what a resume does not need: the history and journal
    (they grow with every step; progress.tsv is the run's log, and a resume records a restore in the new
    journal) and the applied step's gradients (the next step starts from empty accumulators): with Adam's two
    moments the models' size three times over, not four."""
    state = {k: v for k, v in tr.state_dict().items() if k not in ("history", "journal")}
    for name, task in state["tasks"].items():
        if task["phase"] != "applied":
            raise RuntimeError(f"task {name!r} is {task['phase']!r} between steps; a checkpoint would lose its "
                               "gradients")
        task["grads"] = {}
    return state


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loss", default="pit", choices=["pit", "deepclustering"])
    ap.add_argument("--hidden", type=int, default=192, help="BLSTM units per direction")
    ap.add_argument("--layers", type=int, default=2, help="BLSTM layers")
    ap.add_argument("--mixing", default="dynamic", choices=["dynamic", "remix"],
                    help="dynamic mixing of the training sources, or the corpus plus --remix pre-remixed mixtures")
    ap.add_argument("--gain-db", nargs=2, type=float, default=[-2.5, 2.5], help="dynamic mixing: gain range, dB")
    ap.add_argument("--remix", type=int, default=5000, help="pre-remixed mixtures (--mixing remix)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3, help="learning rate at step 0")
    ap.add_argument("--lr-decay", type=float, default=0.1, help="lr factor reached at the last step")
    ap.add_argument("--input-noise", type=float, default=0.0, help="std of noise on the features, training only")
    ap.add_argument("--steps", type=int, default=12000, help="step budget of the whole run (all resumes together)")
    ap.add_argument("--save-every", type=int, default=100, help="checkpoint every this many steps")
    ap.add_argument("--eval-every", type=int, default=500, help="log dev SI-SDRi every this many steps (0: never)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--init-from", type=Path, default=None,
                    help="start from the weights of this shipped file (a second schedule: a fresh optimizer, "
                         "--lr and --lr-decay over --steps more steps)")
    ap.add_argument("--minutes", type=float, default=None, help="stop this run (at a checkpoint) after this much wall time")
    ap.add_argument("--stop-at", type=int, default=None, help="stop this run at the first checkpoint at or after this step")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: the machine is shared)")
    ap.add_argument("--run", type=Path, default=RUN, help="folder of the resumable checkpoint and the progress log")
    ap.add_argument("--out", type=Path, default=WEIGHTS, help="the shipped file, written when the budget is done")
    ap.add_argument("--average", type=Path, nargs="+", default=None,
                    help="write the mean of these shipped files' weights to --out (with --init-from: their common "
                         "start, counted once) and score it")
    ap.add_argument("--mask-power", default=None,
                    help="with --average: the estimates' mask power stored in the file (auto: the best of "
                         f"{['none' if p is None else p for p in MASK_POWERS]} on dev; none: the head's masks)")
    ap.add_argument("--evaluate", action="store_true", help="only print the scores of --out")
    ap.add_argument("--write", action="store_true", help="with --evaluate: store the measured figures in --out")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.average:
        average(args.average, args.init_from, args.out, args.mask_power)
        return
    if args.evaluate:
        info = pretrained_info(args.out)
        print(f"{args.out}: {info['steps']} steps, {info['train_cpu_seconds']:.0f} s CPU; stored: dev "
              f"{info['dev_si_sdri']:+.2f} dB, test {info['test_si_sdri']:+.2f} dB SI-SDRi")
        now = figures(args.out)
        print("measured now:")
        report(now)
        if args.write:
            sep = load_pretrained(path=args.out)
            save_pretrained(sep, args.out, {**{k: v for k, v in info.items() if k != "config"}, **now})
            print(f"wrote the figures into {args.out}")
        return
    rec = recipe(args)
    ckpt = args.run / "checkpoint.pt"
    prior = pretrained_info(args.init_from) if args.init_from is not None else None
    sep = build(rec)
    tr = sep.trainer
    cpu_before = 0.0
    if ckpt.exists():
        state = load_safe(ckpt)
        saved = state["recipe"]
        diff = {k: (saved.get(k), rec[k]) for k in RECIPE_KEYS if saved.get(k) != rec[k]}
        if diff:
            sys.exit(f"{ckpt} was made with other settings (saved, asked): {diff}; pass the saved ones to resume, "
                     f"or --run another folder to start a new run")
        tr.load_state_dict(state, history=False)
        cpu_before = float(state["cpu_seconds"])
        print(f"resumed {ckpt} at step {tr.step_count} ({cpu_before:.0f} s CPU so far)", flush=True)
    elif args.init_from is not None:
        start = load_pretrained(path=args.init_from)
        if {k: getattr(start.cfg, k) for k in ("loss", "hidden", "layers")} != \
                {"loss": rec["loss"], "hidden": rec["hidden"], "layers": rec["layers"]}:
            sys.exit(f"{args.init_from} holds another architecture ({start.cfg.loss}, hidden {start.cfg.hidden}, "
                     f"layers {start.cfg.layers}); pass its --loss, --hidden and --layers")
        for name, model in tr.models.items():
            model.load_state_dict(start.trainer.models[name].state_dict())
        print(f"starting from the weights of {args.init_from}", flush=True)
    args.run.mkdir(parents=True, exist_ok=True)
    log = args.run / "progress.tsv"
    if not log.exists():
        log.write_text("step\tcpu_seconds\tlr\ttrain_loss\tdev_si_sdri\n")
    t0, c0 = time.perf_counter(), time.process_time()
    print(f"recipe {rec}; {sum(p.numel() for m in tr.models.values() for p in m.parameters())} parameters",
          flush=True)
    while tr.step_count < rec["steps"]:
        if args.minutes is not None and time.perf_counter() - t0 >= 60 * args.minutes:
            print(f"stopped at step {tr.step_count} after {args.minutes} min; run the same command to resume")
            return
        if args.stop_at is not None and tr.step_count >= args.stop_at:
            print(f"stopped at step {tr.step_count} (--stop-at); run the command without it to resume")
            return
        tr.lr = lr_at(rec, tr.step_count)
        chunk = min(rec["save_every"] - tr.step_count % rec["save_every"], rec["steps"] - tr.step_count)
        sep.step(chunk)
        loss = float(tr.state("separation").normalized_loss)
        cpu = cpu_before + time.process_time() - c0
        dev = (dev_si_sdri(sep) if args.eval_every and tr.step_count % args.eval_every == 0 else math.nan)
        cpu_all = cpu_before + time.process_time() - c0  # the dev evaluation counts: it is part of the run
        state = small_state(tr)
        save_atomic({**state, "recipe": rec, "cpu_seconds": cpu_all}, ckpt)
        with log.open("a") as f:
            f.write(f"{tr.step_count}\t{cpu:.0f}\t{tr.lr:.3g}\t{loss:.5f}\t{dev:.2f}\n")
        print(f"step {tr.step_count:6d}  {cpu:7.0f} s CPU  lr {tr.lr:.2e}  train loss {loss:.5f}"
              + ("" if math.isnan(dev) else f"  dev SI-SDRi {dev:+.2f} dB"), flush=True)
    cpu = cpu_before + time.process_time() - c0
    info = {"steps": tr.step_count, "train_cpu_seconds": round(cpu, 1), "threads": args.threads,
            "torch": str(torch.__version__), "recipe": repr(rec)}
    if prior is not None:  # a second schedule: the file counts both, and says what the first was
        info.update(steps=prior["steps"] + tr.step_count, train_cpu_seconds=round(prior["train_cpu_seconds"] + cpu, 1),
                    recipe=f"{prior['recipe']}, then {rec!r}")
        if prior.get("threads") != args.threads:
            info["threads"] = f"{prior.get('threads')}, then {args.threads}"
    save_pretrained(sep, args.out, {**info, "dev_si_sdri": math.nan, "test_si_sdri": math.nan})
    info.update(figures(args.out))
    save_pretrained(sep, args.out, info)
    print(f"{tr.step_count} steps, {cpu:.0f} s CPU in all; wrote {args.out} ({args.out.stat().st_size / 1e6:.2f} MB)")
    report(info)

if __name__ == "__main__":
    main()
