"""LeakyBLSTM (the original's leaky_dblstm, _iznotrec, _notrec) and BRNN (dbrnn) against mtlab's plain
BLSTM, forward + backward, side by side.

    python bench/leaky_lstm.py [--batch 8] [--frames 400] [--features 129] [--hidden 600] [--device cpu]
                               [--threads 1]

All models have ``--layers`` layers of ``--hidden`` units per direction; the batch has lengths from
``frames / 2`` to ``frames``. Prints ms per forward+backward pass of each and the ratio to BLSTM's
(cuDNN/oneDNN kernels). LeakyBLSTM projects the inputs of every frame in one matmul per layer and loops
over frames in Python for the recurrent part, both directions batched; BRNN is ``nn.RNN``.
"""
from __future__ import annotations


import torch

from mtlab.models import BLSTM, BRNN, LeakyBLSTM

from reset_lstm import ms_per_pass, setup  # noqa: E402  (bench/ is the script's folder)


def main() -> None:
    args, dev, x, lengths = setup(__doc__)
    size = dict(input_dim=args.features, hidden=args.hidden, num_layers=args.layers)
    base = ms_per_pass(BLSTM(args.features, args.hidden, num_layers=args.layers).to(dev), x, lengths, args.repeats)
    print(f"{args.batch} x {args.frames} frames x {args.features} features, {args.layers} layers x {args.hidden} "
          f"units, {args.device}, torch threads {torch.get_num_threads()}")
    print(f"{'BLSTM':<36}{base:9.1f} ms   1.00x")
    models = {f"LeakyBLSTM recurrent {r}": LeakyBLSTM(**size, leak=0.5, recurrent=r)
              for r in ("all", "forget_output", "none")}
    models["BRNN (nn.RNN)"] = BRNN(**size)
    for name, model in models.items():
        ms = ms_per_pass(model.to(dev), x, lengths, args.repeats)
        print(f"{name:<36}{ms:9.1f} ms   {ms / base:5.2f}x")


if __name__ == "__main__":
    main()
