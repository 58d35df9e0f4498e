"""ResetBLSTM (the original's dbresetlstm) against mtlab's plain BLSTM, forward + backward, side by side.

    python bench/reset_lstm.py [--batch 8] [--frames 400] [--features 129] [--hidden 600] [--device cpu]
                               [--threads 1]

Both models have ``--layers`` layers of ``--hidden`` units per direction; the batch has lengths from
``frames / 2`` to ``frames``. Prints ms per forward+backward pass of each and their ratio, for each
(t_reset, group_size) of the recipes. ResetBLSTM runs every reset window of every state replica as one
batch of ``t_reset``-frame sequences, so it does ``t_reset / group_size`` times the LSTM arithmetic of
the BLSTM in sequences ``t_reset`` frames deep instead of ``frames``.
"""
from __future__ import annotations

import argparse
import time

import torch

from mtlab.models import BLSTM, ResetBLSTM


def ms_per_pass(model: torch.nn.Module, x: torch.Tensor, lengths: torch.Tensor, repeats: int) -> float:
    """Median milliseconds of one forward + backward pass (after one warm-up pass)."""
    times = []
    for i in range(repeats + 1):
        if x.device.type == "cuda":
            torch.cuda.synchronize()  # a CPU-GPU sync point: time the GPU work, not the launches
        start = time.perf_counter()
        model(x, lengths).square().mean().backward()
        if x.device.type == "cuda":
            torch.cuda.synchronize()
        if i:
            times.append(1000 * (time.perf_counter() - start))
    return sorted(times)[len(times) // 2]


def setup(doc: str) -> tuple[argparse.Namespace, torch.device, torch.Tensor, torch.Tensor]:
    """The shared command line of the model benches, and their input: ``(args, device, x, lengths)``."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--frames", type=int, default=400)
    ap.add_argument("--features", type=int, default=129)
    ap.add_argument("--hidden", type=int, default=600)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dev = torch.device(args.device)
    x = torch.randn(args.batch, args.frames, args.features, device=dev)
    lengths = torch.linspace(args.frames // 2, args.frames, args.batch).long()
    return args, dev, x, lengths


def main() -> None:
    args, dev, x, lengths = setup(__doc__)
    plain = BLSTM(args.features, args.hidden, num_layers=args.layers).to(dev)
    base = ms_per_pass(plain, x, lengths, args.repeats)
    print(f"{args.batch} x {args.frames} frames x {args.features} features, {args.layers} layers x {args.hidden} "
          f"units, {args.device}, torch threads {torch.get_num_threads()}")
    print(f"BLSTM                          {base:9.1f} ms   1.00x")
    for t_reset, group in ((10, 1), (10, 2), (15, 1), (5, 1)):
        model = ResetBLSTM(args.features, args.hidden, num_layers=args.layers, t_reset=t_reset,
                           group_size=group).to(dev)
        ms = ms_per_pass(model, x, lengths, args.repeats)
        print(f"ResetBLSTM t_reset {t_reset:2d} group {group}    {ms:9.1f} ms   {ms / base:5.2f}x")


if __name__ == "__main__":
    main()
