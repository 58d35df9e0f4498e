"""The job's side of attaching, in the training thread: a ``Steering`` applies the commands of an attached client
at the job's next minibatch boundary, on every rank alike, journaled there with the source ``attached``.

Where a change takes effect:

- one process: the command is a ``Trainer.set`` from the server's thread (``mtlab.remote.server``), which the
  trainer queues and applies at its next knob read (the next minibatch, normalize, clip or apply) and journals there;
- several ranks (torchrun): rank 0's server queues the commands; after every minibatch and before every step the
  ranks take them together (one broadcast of a length over a CPU group, a second of the commands when there are
  any), and each rank makes the same ``Trainer.set`` at the same minibatch.

A pause or a stop takes effect before the next step (a stop ends the run as the schedule's end does: ``final.pt``,
the tables and the summary are written). An ``lr`` set from a client moves the schedule with it: its decay goes on
from the value set (``schedule.lr_scale``), rather than the schedule setting its own value again at the next step.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import torch

from ..base.errors import ConfigError
from ..base.report import say
from ..core.events import Event, Payload


class Steering:
    """Commands from an attached client, applied at the job's minibatch boundaries; see the module docstring.

    ``between()`` goes to the loop as ``between_steps`` (pause, stop, lr follow-up); ``close(reason)`` when the
    run has ended. ``server`` (rank 0) answers the client. Build it with ``mtlab.remote.server.attachable``."""

    def __init__(self, exp: Any, expdir: Path, progress: bool = True) -> None:
        self.exp, self.trainer, self.expdir = exp, exp.trainer, Path(expdir)
        self.rank, self.world = self.trainer.parallel.rank, self.trainer.parallel.world_size
        self.progress = progress
        self.paused = threading.Event()
        self.stopping = threading.Event()
        self.wake = threading.Event()
        self.lock = threading.Lock()
        self.inbox: list[dict[str, Any]] = []  # several ranks: commands for the next agreement (rank 0)
        self.state = "running"
        self.ended: dict[str, Any] | None = None
        self.server: Any = None  # rank 0: the Server answering the client
        self.agreements = 0  # how often the ranks took the commands together (bench/attach.py)
        self._scanned = len(self.trainer.journal.entries)
        self.group: Any = None
        if self.world > 1:
            import torch.distributed as dist

            # commands travel on the CPU: a group of gloo beside NCCL, so that no step waits for the device
            self.group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
            self.trainer.add_callback(self._after_minibatch)

    def _say(self, message: str) -> None:
        if self.rank == 0:
            say(message, self.progress)

    def submit(self, op: dict[str, Any]) -> None:
        """A command from the server's thread: several ranks, for the next agreement; one process, at once (a
        ``set`` is queued by the trainer for its next knob read)."""
        if self.world > 1:
            with self.lock:
                self.inbox.append(op)
        else:
            self.do(op)

    # ------------------------------------------------------------------ in the training thread
    def do(self, op: dict[str, Any]) -> None:
        kind = op["op"]
        if kind == "set":
            with self.trainer.journal.source("attached"):
                try:
                    self.trainer.set(op["name"], op["value"], op.get("task"), op.get("linkedset"))
                except ConfigError as exc:  # checked on rank 0 already: every rank refuses alike
                    self._say(f"attached change {op.get('words')} refused: {exc}")
        elif kind == "pause":
            self.paused.set()
        elif kind == "resume":
            self.paused.clear()
            self.wake.set()
        elif kind == "stop":
            self.stopping.set()
            self.wake.set()

    def agree(self) -> None:
        """Several ranks: take rank 0's commands together, at the same point of the run on every rank (a
        broadcast of their length; of the commands themselves when there are any)."""
        import torch.distributed as dist

        data = b""
        if self.rank == 0:
            with self.lock:
                ops, self.inbox = self.inbox, []
            data = json.dumps(ops).encode() if ops else b""
        size = torch.tensor([len(data)], dtype=torch.int64)
        dist.broadcast(size, 0, group=self.group)
        self.agreements += 1
        n = int(size.item())
        if not n:
            return
        buf = torch.frombuffer(bytearray(data), dtype=torch.uint8) if self.rank == 0 else torch.empty(n, dtype=torch.uint8)
        dist.broadcast(buf, 0, group=self.group)
        for op in json.loads(buf.numpy().tobytes()):
            self.do(op)

    def _after_minibatch(self, event: Event, info: Payload) -> None:
        if event == Event.MINIBATCH:
            self.agree()

    def between(self) -> bool:
        """Before each step, in the loop's thread (``run(between_steps=...)``): the commands, a pause, the
        schedule following an attached lr; True stops the run."""
        if self.world > 1:
            self.agree()
        self._follow_lr()
        if self.paused.is_set() and not self.stopping.is_set():
            self.state = "paused"
            self._say(f"paused by the attached client at step {self.trainer.step_count}")
            while self.paused.is_set() and not self.stopping.is_set():
                if self.world > 1:
                    time.sleep(0.2)
                    self.agree()
                else:
                    self.wake.wait(0.2)
                    self.wake.clear()
            self._follow_lr()
            if not self.stopping.is_set():
                self._say(f"resumed by the attached client at step {self.trainer.step_count}")
        if self.stopping.is_set():
            self.state = "stopping"
            self._say(f"stopped by the attached client at step {self.trainer.step_count}")
            return True
        self.state = "running"
        return False

    def _follow_lr(self) -> None:
        """An lr set from the client since the last step: the schedule's decay goes on from it."""
        schedule = getattr(self.exp, "schedule", None)
        journal = self.trainer.journal
        with journal.lock:
            entries = journal.entries
            if self._scanned > len(entries):
                self._scanned = 0
            new, self._scanned = entries[self._scanned:], len(entries)
        for e in new:
            if schedule is not None and e.get("type") == "change" and e.get("kind") == "lr" \
                    and e.get("source") == "attached":
                planned = schedule.lr_at(int(e["step"]))
                if planned > 0:
                    schedule.lr_scale *= float(e["value"]) / planned

    # ------------------------------------------------------------------ the end
    def close(self, reason: str | None, step: int | None = None) -> None:
        """The run ended (``reason``: done, stopped, interrupted, error): the server says so to a client asking
        now and in ``attach.json`` (its key removed), then stops listening."""
        if self.ended is not None:
            return
        self.ended = {"reason": reason or "error", "step": self.trainer.step_count if step is None else step,
                      "time": round(time.time(), 3)}
        self.state = "ended"
        if self.world > 1 and self._after_minibatch in self.trainer.callbacks:
            self.trainer.remove_callback(self._after_minibatch)
        if self.server is not None:
            self.server.close(self.ended)
