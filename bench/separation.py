"""Dev SI-SDR improvement of separators trained from scratch on the sample corpus, per budget.

    python bench/separation.py [--minutes 10] [--steps N] [--remix 5000] [--usedbins-db clean=40 noisy=20]
                               [--threads 1] [--losses deepclustering pit] [--linkedsets clean noisy]
                               [--mixing static remix dynamic] [--dynamic-gain-db -2.5 2.5]

Each (loss, linked set) run trains a fresh BLSTM separator (mtlab.separation.train_separator, seed 0)
until its per-run budget is spent (``--minutes`` of wall clock and/or ``--steps``), then separates every
dev utterance (k-means masks for deep clustering, mask-head masks for PIT), reconstructs with the
mixture phase and prints the mean SI-SDR improvement over the (clean or noisy) mixture, in dB, as a
table: rows = losses, columns = linked sets. ``--remix N`` adds N training mixtures made from pairs of
the training split's own sources (mtlab.separation.remix); ``--remix 0`` trains on the 120 corpus
mixtures only, which a BLSTM memorizes (dev SI-SDRi stays near 2 dB while train SI-SDRi climbs).
``--mixing static remix dynamic`` trains three rows per loss on the same budget: ``static`` the 120
corpus mixtures only (as ``--remix 0``), ``remix`` the corpus plus ``--remix`` pre-remixed ones, and
``dynamic`` dynamic mixing instead; ``dynamic`` adds a row per loss trained with dynamic mixing instead (mtlab.data.dynamic: a
new mixture of two training speakers per example and epoch, gains uniform in ``--dynamic-gain-db``, no noise
files, so on the noisy set its mixtures are clean sources: compare it on ``clean``).
``--usedbins-db noisy=20``: deep clustering on the noisy set learns and clusters only bins within 20 dB
of the loudest. At the corpus' 40 dB, ~90% of the noisy bins count, most of them noise, and the
embeddings do not separate the speakers (dev SI-SDRi +0.6 dB at 40, +3.6 at 30, +5.7 at 20; 10 min each).
Runs go one after another: the whole table takes about 4 × the per-run budget plus evaluation.

``--cpu-minutes 1 3 10 30 shipped`` measures quality against CPU time instead: one run per (loss, linked set)
trains until this process has spent each budget of CPU time in training (``time.process_time``, so a busy
machine makes the run take longer but does not change where it stops; ``shipped`` is the CPU time the shipped
separator's file records), and at each budget scores dev and test (SI-SDR only; the scoring's CPU time is not
counted), then prints a markdown table of dev / test SI-SDR improvement per budget, with the shipped
separator's own figures beside it. ``--mixing dynamic`` trains on dynamic mixing (the shipped recipe's data).
``--threads 1`` is much faster than 2 on a CPU shared with other work (OpenMP threads spin while they
wait for a core).
"""
from __future__ import annotations

import argparse
import time

import torch

from mtlab.separation import build_separator, load_data


def run(loss: str, linkedset: str, data, minutes: float | None, steps: int | None, args,
        mixing: str = "remix") -> dict[str, float]:
    """Train one separator within the budget and score it on dev (``mixing``: static, remix or dynamic)."""
    dynamic = {"gain_db": list(args.dynamic_gain_db)} if mixing == "dynamic" else None
    remix = args.remix if mixing == "remix" else 0
    sep = build_separator(loss, linkedset, data=data, hidden=args.hidden, layers=args.layers, lr=args.lr,
                          batch_size=args.batch_size, seed=args.seed, device=args.device, remix=remix,
                          usedbins_db=args.thresholds[linkedset], dynamic_mix=dynamic)
    every = max(1, args.log_every)
    t0 = time.perf_counter()

    def log(s) -> None:
        if s.trainer.step_count % every == 0:
            loss_value = float(s.trainer.state("separation").normalized_loss)  # host read, log steps only
            print(f"  {loss}/{linkedset} step {s.trainer.step_count:5d}  {time.perf_counter() - t0:6.0f} s  "
                  f"train loss {loss_value:.4f}", flush=True)

    sep.step(steps if steps is not None else 10**9, max_seconds=None if minutes is None else 60 * minutes,
             on_step=log)
    train_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    df = sep.evaluate("dev")
    return {"si_sdri": float(df["si_sdri"].mean()), "sdri": float(df["sdri"].mean()),
            "si_sdr_mix": float(df["si_sdr_mix"].mean()), "steps": sep.trainer.step_count,
            "train_s": train_s, "eval_s": time.perf_counter() - t1}


def curve(loss: str, linkedset: str, data, budgets: list[float], args, mixing: str) -> list[dict[str, float]]:
    """Train one separator, scoring dev and test each time its training CPU time reaches a budget (seconds)."""
    dynamic = {"gain_db": list(args.dynamic_gain_db)} if mixing == "dynamic" else None
    sep = build_separator(loss, linkedset, data=data, hidden=args.hidden, layers=args.layers, lr=args.lr,
                          batch_size=args.batch_size, seed=args.seed, device=args.device,
                          remix=args.remix if mixing == "remix" else 0, usedbins_db=args.thresholds[linkedset],
                          dynamic_mix=dynamic)
    spent, points = 0.0, []
    for budget in sorted(budgets):
        c0 = time.process_time()
        sep.step(10**9, max_cpu_seconds=budget - spent)
        spent += time.process_time() - c0  # the step that crosses the budget counts: at most one step over
        row = {"budget_s": budget, "cpu_s": spent, "steps": sep.trainer.step_count}
        for split in ("dev", "test"):
            row[split] = float(sep.evaluate(split, metrics=("si_sdr",))["si_sdri"].mean())
        points.append(row)
        print(f"  {loss}+{mixing}/{linkedset}: {spent / 60:6.1f} CPU min, {row['steps']:6d} steps: SI-SDRi dev "
              f"{row['dev']:+.2f} dB, test {row['test']:+.2f} dB", flush=True)
    return points


def cpu_table(args) -> None:
    """``--cpu-minutes``: SI-SDRi against training CPU time, a markdown table."""
    from mtlab.separation.pretrained import pretrained_info

    shipped = pretrained_info()
    budgets = [float(shipped["train_cpu_seconds"]) if b == "shipped" else 60 * float(b)
               for b in args.cpu_minutes]
    print(f"CPU budgets {[round(b / 60, 1) for b in budgets]} min; BLSTM {args.layers}x{args.hidden}, batch "
          f"{args.batch_size}, lr {args.lr}, mixing {args.mixing}, {args.threads} thread(s)", flush=True)
    rows = {}
    for linkedset in args.linkedsets:
        data = load_data(linkedset, usedbins_db=args.thresholds[linkedset])
        for loss in args.losses:
            for mixing in args.mixing:
                rows[f"{loss} ({mixing}, {linkedset})"] = curve(loss, linkedset, data, budgets, args, mixing)
    cols = sorted(budgets)
    print("\nSI-SDR improvement over the mixture, dev / test, dB, after a budget of training CPU time "
          "(one thread; steps done in brackets)\n")
    print("| | " + " | ".join(f"{b / 60:.3g} CPU min" for b in cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for name, points in rows.items():
        print(f"| {name} | " + " | ".join(f"{p['dev']:+.2f} / {p['test']:+.2f} ({p['steps']})" for p in points) + " |")
    print(f"\nshipped separator ({shipped.get('recipe', 'PIT')}): {float(shipped['train_cpu_seconds']) / 60:.0f} "
          f"CPU min, {shipped['steps']} steps: SI-SDRi dev {shipped['dev_si_sdri']:+.2f} dB, test "
          f"{shipped['test_si_sdri']:+.2f} dB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0, help="wall-clock training budget per run")
    ap.add_argument("--cpu-minutes", nargs="+", default=None,
                    help="SI-SDRi against training CPU time at these budgets (minutes, or 'shipped')")
    ap.add_argument("--steps", type=int, default=None, help="step budget per run (with --minutes: first reached)")
    ap.add_argument("--losses", nargs="+", default=["deepclustering", "pit"])
    ap.add_argument("--linkedsets", nargs="+", default=["clean", "noisy"])
    ap.add_argument("--remix", type=int, default=5000, help="extra training mixtures from training sources")
    ap.add_argument("--mixing", nargs="+", default=["remix"], choices=["static", "remix", "dynamic"],
                    help="training mixtures, a row per choice and loss: the 120 corpus mixtures only, the corpus "
                         "plus --remix pre-remixed ones, and/or dynamic mixing")
    ap.add_argument("--dynamic-gain-db", nargs=2, type=float, default=[-2.5, 2.5],
                    help="dynamic mixing: range of each source's gain, dB")
    ap.add_argument("--usedbins-db", nargs="+", default=["clean=40", "noisy=20"],
                    help="used-bins threshold (dB below the loudest bin) per linked set, as set=dB")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--log-every", type=int, default=100)
    args = ap.parse_args()
    minutes = args.minutes if args.minutes > 0 else None
    args.thresholds = {ls: 40.0 for ls in args.linkedsets}
    for item in args.usedbins_db:
        name, _, value = item.partition("=")
        args.thresholds[name] = float(value)
    torch.set_num_threads(args.threads)
    if args.cpu_minutes is not None:
        cpu_table(args)
        return
    print(f"per-run budget: {minutes} min, {args.steps} steps; BLSTM {args.layers}x{args.hidden}, batch "
          f"{args.batch_size}, lr {args.lr}, remix {args.remix}, usedbins dB {args.thresholds}, {args.threads} "
          f"thread(s), device {args.device}",
          flush=True)
    results: dict[tuple[str, str], dict[str, float]] = {}
    rows = [loss if mixing == "remix" else f"{loss}+{mixing}" for loss in args.losses for mixing in args.mixing]
    for linkedset in args.linkedsets:
        data = load_data(linkedset, usedbins_db=args.thresholds[linkedset])
        for row in rows:
            loss, _, mixing = row.partition("+")
            r = results[(row, linkedset)] = run(loss, linkedset, data, minutes, args.steps, args,
                                                mixing or "remix")
            print(f"{row}/{linkedset}: SI-SDRi {r['si_sdri']:+.2f} dB, SDRi {r['sdri']:+.2f} dB after "
                  f"{r['steps']} steps, {r['train_s']:.0f} s training + {r['eval_s']:.0f} s dev", flush=True)
    print("\nDev SI-SDR improvement over the mixture, dB (steps, training seconds)")
    print(f"{'':24s}" + "".join(f"{ls:>26s}" for ls in args.linkedsets))
    for row in rows:
        cells = [results[(row, ls)] for ls in args.linkedsets]
        print(f"{row:24s}" + "".join(f"{c['si_sdri']:+8.2f} ({c['steps']:5d}, {c['train_s']:5.0f} s)" for c in cells))
    print("mixture SI-SDR:  " + "  ".join(f"{ls} {results[(rows[0], ls)]['si_sdr_mix']:+.2f} dB"
                                          for ls in args.linkedsets))


if __name__ == "__main__":
    main()
