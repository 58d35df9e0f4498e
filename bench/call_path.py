"""How much of mtlab one stepwise cycle passes through, counted rather than timed: the distinct mtlab functions
(and the files they live in) entered by one cycle of calls by hand, and by ``normalize()`` before its one
division. Counts do not depend on how busy the machine is.

    python bench/call_path.py            # the cycle: process_minibatch on each linked set of two tasks,
                                         # normalize, clip, apply (a cycle run before, so nothing is first-use)
    python bench/call_path.py --list     # also every function, file by file
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

import mtlab

ROOT = Path(mtlab.__file__).resolve().parent
# comprehensions and generator expressions are expressions of the function around them, not functions a reader
# follows (Python 3.12 inlines comprehensions): not counted
EXPRESSIONS = ("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>")


def tiny_trainer() -> mtlab.Trainer:
    """Two tasks (a frame tagger with two linked sets, an utterance classifier) sharing an encoder."""
    g = torch.Generator().manual_seed(0)

    def examples(n: int) -> list[dict[str, torch.Tensor]]:
        out = []
        for _ in range(n):
            t = int(torch.randint(3, 9, (1,), generator=g))
            out.append({"x": torch.randn(t, 4, generator=g), "y": torch.randint(0, 5, (t,), generator=g),
                        "spk": torch.randint(0, 3, (), generator=g)})
        return out

    class Pool(nn.Module):
        def forward(self, h: torch.Tensor) -> torch.Tensor:
            return h.mean(1)

    torch.manual_seed(0)
    models = {"enc": nn.Linear(4, 8), "head_a": nn.Linear(8, 5), "pool": Pool(), "head_b": nn.Linear(8, 3)}
    a = mtlab.Task("a", nodes=[mtlab.Node("h", model="enc", inputs=["x"]),
                               mtlab.Node("logits", model="head_a", inputs=["h"])],
                   inputs=["x"], targets=["y"], outputs=["logits"],
                   loss=mtlab.losses.CrossEntropy(output="logits", target="y"),
                   linkedsets={"clean": mtlab.LinkedSet(examples(12)), "noisy": mtlab.LinkedSet(examples(12), 0.5)},
                   batch_size=3)
    b = mtlab.Task("b", nodes=[mtlab.Node("h", model="enc", inputs=["x"]), mtlab.Node("p", model="pool", inputs=["h"]),
                               mtlab.Node("logits", model="head_b", inputs=["p"])],
                   inputs=["x"], targets=["spk"], outputs=["logits"],
                   loss=mtlab.losses.CrossEntropy(output="logits", target="spk"),
                   linkedsets={"clean": mtlab.LinkedSet(examples(12))}, batch_size=3)
    return mtlab.Trainer(models, [a, b], lr=1e-2, clip_grad_value=1.0, device="cpu")


def cycle(tr: mtlab.Trainer) -> None:
    for task, sets in (("a", ("clean", "noisy")), ("b", ("clean",))):
        for s in sets:
            tr.process_minibatch(task, s)
    tr.normalize()
    tr.clip()
    tr.apply()


def trace(fn: Callable[[], None], stop_at: str | None = None) -> list[tuple[str, str]]:
    """(file, function) of every distinct mtlab function ``fn`` enters, in first-entry order; with ``stop_at``
    (a torch builtin's name), only those entered before the first call of it."""
    seen: dict[tuple[str, str], None] = {}
    stopped = False

    def profile(frame, event, arg):  # noqa: ANN001, ANN202
        nonlocal stopped
        if stopped:
            return
        if event == "c_call" and stop_at is not None and getattr(arg, "__name__", "") == stop_at:
            stopped = True
            return
        if event != "call":
            return
        path, name = Path(frame.f_code.co_filename), frame.f_code.co_qualname
        if path.is_relative_to(ROOT) and not name.endswith(EXPRESSIONS):
            seen[(path.relative_to(ROOT).as_posix(), name)] = None

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return list(seen)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--list", action="store_true", help="print every function, file by file")
    args = ap.parse_args()
    tr = tiny_trainer()
    cycle(tr)  # first use builds streams, optimizer state and caches: not part of a cycle's path
    whole = trace(lambda: cycle(tr))
    for task, sets in (("a", ("clean", "noisy")), ("b", ("clean",))):
        for s in sets:
            tr.process_minibatch(task, s)
    before_division = trace(tr.normalize, stop_at="_foreach_div_")
    tr.clip()
    tr.apply()
    files = sorted({f for f, _ in whole})
    print(f"one cycle: {len(whole)} distinct mtlab functions in {len(files)} files")
    print(f"normalize() before its division: {len(before_division)} functions")
    if args.list:
        for f in files:
            print(f"  {f}: " + ", ".join(q for g, q in whole if g == f))
        print("  normalize(): " + " -> ".join(q for _, q in before_division))


if __name__ == "__main__":
    main()
