"""What a run owns around each of its public calls: its random numbers, its lock, and the knob changes made
while a call runs.

- ``RunRandom``: the run's own generator state (CPU and, on a GPU, CUDA). Dropout and input noise draw from
  torch's one global generator; the run's state is swapped in when one of its calls begins and out when it
  ends, so runs stepped in turn never share random numbers and the user's own draws between calls change no
  run (JAX threads a key through every call for the same reason; this is the PyTorch way to the same
  property). Two runs stepping at the same moment in two threads take turns (``GENERATOR``).
- ``Scope``: one public call (``with trainer.scope("apply"): ...``). The outermost call of a thread takes the
  trainer's lock, swaps the generator in, writes the journal's entry and, when it ends, marks a failure,
  swaps the generator out and applies the knob changes that were waiting for it. A call inside another (a
  step's minibatches) only counts the depth.
- Knob changes are commands (``Trainer.command``): applied at once when no call runs, else queued and applied
  by the call at its next knob read (or when it ends), where the journal records them. What the journal says
  is what took effect, whatever thread made the change.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

GENERATOR = threading.RLock()  # torch's global generator: one run's state in it at a time
CPU = torch.default_generator  # what torch.get_rng_state / set_rng_state read and write, called directly per call


class RunRandom:
    """A run's generator state, swapped into torch's global generator around the run's calls (``Scope``)."""

    __slots__ = ("cpu", "cuda", "device", "saved", "saved_cuda")

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cpu = torch.get_rng_state()  # as the user's generator stands when the run is built
        self.cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
        self.saved: torch.Tensor | None = None  # the global state while the run's is swapped in
        self.saved_cuda: torch.Tensor | None = None

    def state_dict(self) -> dict[str, Any]:
        """``{"torch": ..., "cuda": ...}`` (copies), as trainer states have always kept the RNG."""
        out: dict[str, Any] = {"torch": self.cpu.clone()}
        if self.cuda is not None:
            out["cuda"] = self.cuda.clone()
        return out

    def load_state_dict(self, rng: dict[str, Any]) -> None:
        self.cpu = rng["torch"].clone()
        if self.cuda is not None and "cuda" in rng:
            self.cuda = rng["cuda"].clone()

    def take_global(self) -> None:
        """Continue from torch's global generator as it stands now (a copy trainer seeded by hand)."""
        self.cpu = torch.get_rng_state()
        if self.cuda is not None:
            self.cuda = torch.cuda.get_rng_state(self.device)


class RunLock:
    """The trainer's lock (reentrant): one call at a time, a UI thread reading between them. When its outermost
    holder lets go, the knob changes that waited for it (``journal.pending``) are applied, in order."""

    __slots__ = ("rlock", "count", "journal")

    def __init__(self, journal: Any) -> None:
        self.rlock, self.count, self.journal = threading.RLock(), 0, journal  # count: the holder's levels

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if not self.rlock.acquire(blocking, timeout):
            return False
        self.count += 1
        return True

    def release(self) -> None:
        try:
            if self.count == 1 and self.journal.pending:
                self.journal.run_pending()
        finally:
            self.count -= 1
            self.rlock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


class Scope:
    """One public call of a trainer; see the module docstring. Its lock and generator handling is written out
    here rather than called: this runs at every call of every step."""

    __slots__ = ("tr", "kind", "payload", "entry", "outer")

    def __init__(self, trainer: Any, kind: str, payload: dict[str, Any]) -> None:
        self.tr, self.kind, self.payload, self.entry = trainer, kind, payload, None

    def __enter__(self) -> None:
        tr = self.tr
        lock = tr.lock
        lock.rlock.acquire()
        lock.count += 1
        self.outer = tr.depth == 0
        tr.depth += 1
        if not self.outer:
            return
        rng = tr.rng
        GENERATOR.acquire()
        rng.saved = CPU.get_state()
        try:
            CPU.set_state(rng.cpu)
            if rng.cuda is not None:
                rng.saved_cuda = torch.cuda.get_rng_state(rng.device)
                torch.cuda.set_rng_state(rng.cuda, rng.device)
            self.entry = tr.journal.enter_call(tr, self.kind, self.payload)
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        tr = self.tr
        tr.depth -= 1
        lock = tr.lock
        try:
            if self.outer:
                journal = tr.journal
                try:
                    journal.exit_call(self.entry, self.kind, tr.step_count, None if typ is None else typ.__name__)
                finally:
                    rng = tr.rng
                    rng.cpu = CPU.get_state()
                    CPU.set_state(rng.saved)
                    if rng.cuda is not None:
                        rng.cuda = torch.cuda.get_rng_state(rng.device)
                        torch.cuda.set_rng_state(rng.saved_cuda, rng.device)
                    GENERATOR.release()
                if lock.count == 1 and journal.pending:  # changes made after the call's last knob read
                    journal.run_pending()
        finally:
            lock.count -= 1
            lock.rlock.release()
