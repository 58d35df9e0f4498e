"""The job's side of attaching: a ``Steering`` takes commands from one client and applies them at the job's next
minibatch boundary, on every rank alike, journaled there with the source ``attached``.

``mtlab train`` (and ``demo``, ``resume``) makes every job attachable unless ``--no-attach``: rank 0 listens on
127.0.0.1 (``--attach-ip`` for another address) in a thread of its own, and publishes how to reach it in
``EXPDIR/attach.json`` (``mtlab.remote.wire``). The job never waits for a client: a command is read between two
minibatches or two steps, and a client that vanishes changes nothing.

Where a change takes effect:

- one process: the command is a ``Trainer.set`` from the server's thread, which the trainer queues and applies at
  its next knob read (the next minibatch, normalize, clip or apply) and journals there;
- several ranks (torchrun): rank 0's server queues the commands; after every minibatch and before every step the
  ranks take them together (one broadcast of a length over a CPU group, a second of the commands when there are
  any), and each rank makes the same ``Trainer.set`` at the same minibatch.

A pause or a stop takes effect before the next step (a stop ends the run as the schedule's end does: ``final.pt``,
the tables and the summary are written). An ``lr`` set from a client moves the schedule with it: its decay goes on
from the value set (``schedule.lr_scale``), rather than the schedule setting its own value again at the next step.
"""

from __future__ import annotations

import argparse
import getpass
import json
import threading
import time
from pathlib import Path
from typing import Any

import torch

from ..base.errors import ConfigError, MtlabError
from ..base.report import say
from ..core.events import Event, Payload
from ..core.knobs import KNOBS
from .wire import CONNECTION_FILE, AttachError, Verifier, connection, encode, need_zmq, new_key, write_private

LEASE_S = 20.0  # s: a steering client not heard from for this long loses the job to the next one
POLL_MS = 100
BAD_SIGNATURE = ("refused: the message's signature does not match this job's key; attach with the connection file "
                 f"the job wrote ({CONNECTION_FILE} in its experiment folder), not an older copy")
STEERING = ("set", "pause", "resume", "stop")


def _plain_row(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (v if isinstance(v, (int, float, str, bool)) or v is None else str(v)) for k, v in row.items()}


class Steering:
    """Commands from an attached client, applied at the job's minibatch boundaries; see the module docstring.

    ``between()`` goes to the loop as ``between_steps`` (pause, stop, lr follow-up); ``close(reason)`` when the
    run has ended. Build it with :func:`attachable`."""

    def __init__(self, exp: Any, expdir: Path, ip: str = "127.0.0.1", progress: bool = True) -> None:
        self.exp, self.trainer, self.expdir = exp, exp.trainer, Path(expdir)
        self.rank, self.world = self.trainer.parallel.rank, self.trainer.parallel.world_size
        self.progress = progress
        self.paused = threading.Event()
        self.stopping = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self.inbox: list[dict[str, Any]] = []  # several ranks: commands for the next agreement (rank 0)
        self.commands: dict[str, dict[str, Any]] = {}  # command id -> where its journal entry will be
        self.state = "running"
        self.ended: dict[str, Any] | None = None
        self.steerer: dict[str, Any] | None = None
        self.agreements = 0  # how often the ranks took the commands together (bench/attach.py)
        self._scanned = len(self.trainer.journal.entries)
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        self.sock: Any = None
        self.key = ""
        self.address = ""
        self.group: Any = None
        if self.world > 1:
            import torch.distributed as dist

            # commands travel on the CPU: a group of gloo beside NCCL, so that no step waits for the device
            self.group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
            self.trainer.add_callback(self._after_minibatch)

    # ------------------------------------------------------------------ serving (rank 0, its own thread)
    def serve(self, ip: str) -> None:
        """Listen on ``ip`` (a free port) and publish ``attach.json``; the thread answers until ``close``."""
        zmq = need_zmq()
        self._zmq = zmq
        self.context = zmq.Context()
        self.sock = self.context.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        try:
            port = self.sock.bind_to_random_port(f"tcp://{ip}")
        except zmq.ZMQError as exc:
            self.sock.close()
            self.context.term()
            raise ConfigError(f"--attach-ip {ip}: cannot listen there ({exc}); give an address of this machine "
                              "(127.0.0.1, the default, keeps the job reachable from here and SSH tunnels only), "
                              "or --no-attach") from None
        self.key = new_key()
        self.verifier = Verifier(self.key)
        self.address = f"{ip}:{port}"
        self.expdir.mkdir(parents=True, exist_ok=True)
        write_private(self.expdir / CONNECTION_FILE,
                      connection(ip, port, self.key, self.expdir, self.world))
        self._thread = threading.Thread(target=self._serve, name="mtlab-attach", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        zmq = self._zmq
        while not self._closing.is_set():
            try:
                if not self.sock.poll(POLL_MS):
                    continue
                frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.ZMQError:
                return
            if len(frames) != 3:
                continue
            ident, signature, body = frames
            message = self.verifier.decode(signature, body)
            if message is None:
                self._send(ident, [b"", json.dumps({"ok": False, "error": BAD_SIGNATURE}).encode()])
                continue
            try:
                reply = {"ok": True, "result": self._handle(message)}
            except ConfigError as exc:  # a bad knob or value: the client raises a ConfigError too
                reply = {"ok": False, "error": str(exc), "kind": "ConfigError"}
            except MtlabError as exc:
                reply = {"ok": False, "error": str(exc)}
            except Exception as exc:  # noqa: BLE001 (a broken command must not end the thread, nor the job)
                reply = {"ok": False, "error": f"the job could not answer {message.get('command')!r}: "
                                               f"{type(exc).__name__}: {exc}"}
            reply["id"] = message.get("id")
            self._send(ident, encode(self.key, reply))

    def _send(self, ident: bytes, frames: list[bytes]) -> None:
        try:
            self.sock.send_multipart([ident, *frames], self._zmq.NOBLOCK)
        except self._zmq.ZMQError:
            pass  # the client went away: nothing to tell

    # ------------------------------------------------------------------ the commands
    def _handle(self, message: dict[str, Any]) -> Any:
        command, args = message.get("command"), message.get("args") or {}
        session = str(message.get("session", ""))
        if not isinstance(args, dict):
            raise AttachError("a command's args must be a JSON object")
        holder = self._holder()
        if holder is not None and holder["session"] == session:
            holder["last"] = time.monotonic()
        if command == "hello":
            if args.get("steer", True):
                self._claim(session, str(args.get("who", "a client")))
            return self.describe()
        if command in ("status", "ping"):
            return self.status()
        if command == "history":
            return self._history(int(args.get("since", 0)), args.get("last"))
        if command == "journal":
            since = int(args.get("since", 0))
            with self.trainer.journal.lock:
                entries = [dict(e) for e in self.trainer.journal.entries[since:]]
                total = len(self.trainer.journal.entries)
            return {"entries": [e for e in entries if e.get("type") == "change"], "total": total}
        if command == "where":
            return self._where(str(args.get("id")))
        if command == "detach":
            if holder is not None and holder["session"] == session:
                self.steerer = None
            return {"detached": True}
        if command in STEERING:
            if self.ended is not None:
                raise AttachError(f"the job has ended ({self.ended['reason']} at step {self.ended['step']}); "
                                  f"nothing to {command}")
            if holder is None or holder["session"] != session:
                raise AttachError(f"{command} refused: this client does not steer the job "
                                  + (f"({holder['who']} does)" if holder else "(it attached with steer=False)")
                                  + "; attach with mtlab.attach(expdir) once the other client has detached")
            return self._set(args) if command == "set" else self._control(command)
        raise AttachError(f"unknown command {command!r}")

    def _holder(self) -> dict[str, Any] | None:
        holder = self.steerer
        if holder is not None and time.monotonic() - holder["last"] > LEASE_S:
            self.steerer = holder = None  # its client vanished: the job is free to be steered again
        return holder

    def _claim(self, session: str, who: str) -> None:
        holder = self._holder()
        if holder is not None and holder["session"] != session:
            since = time.strftime("%H:%M:%S", time.localtime(holder["since"]))
            raise AttachError(f"another client steers this job: {holder['who']}, since {since}; one client steers at "
                              "a time. Detach it there (job.detach()), or attach here with steer=False to watch; a "
                              f"client not heard from for {LEASE_S:.0f} s loses the job by itself")
        self.steerer = {"session": session, "who": who, "since": time.time(), "last": time.monotonic()}

    def describe(self) -> dict[str, Any]:
        """What a client learns when it attaches: the job, its tasks, its knobs and where it stands."""
        tr = self.trainer
        rows = [{"name": k.name, "scope": k.scope, "when": k.when, "doc": k.doc, "label": k.label,
                 "control": list(k.control) if k.control else None} for k in KNOBS.values()]
        return {**self.status(), "tasks": {n: list(t.linkedsets) for n, t in tr.tasks.items()},
                "knobs": tr.knobs(), "knob_table": rows, "name": str((self.exp.recipe or {}).get("name", "")),
                "expdir": str(self.expdir.resolve()), "world_size": self.world, "address": self.address}

    def status(self) -> dict[str, Any]:
        """Where the job stands (step, state, who steers it, how it ended)."""
        holder = self._holder()
        schedule = getattr(self.exp, "schedule", None)
        return {"step": self.trainer.step_count, "num_steps": getattr(schedule, "num_steps", None),
                "state": self.state if self.ended is None else "ended", "ended": self.ended,
                "steered_by": holder["who"] if holder else None, "minibatch": self.trainer.journal.minibatch,
                "pending": self.trainer.pending_changes() + [c.get("words", "") for c in list(self.inbox)]}

    def _history(self, since: int, last: Any) -> dict[str, Any]:
        rows = self.trainer.log.rows()
        reset = since > len(rows) or (since > 0 and last is not None
                                      and json.loads(json.dumps(_plain_row(rows[since - 1]))) != last)
        start = 0 if reset else since
        return {"rows": [_plain_row(r) for r in rows[start:]], "reset": reset, "total": len(rows),
                **self.status()}

    def _set(self, args: dict[str, Any]) -> dict[str, Any]:
        tr = self.trainer
        name, task, linkedset = args.get("name"), args.get("task"), args.get("linkedset")
        try:
            value = tr.check_knob(str(name), args.get("value"), task, linkedset)
        except ConfigError as exc:
            raise ConfigError(f"refused, the job goes on unchanged: {exc}") from None
        knob = KNOBS.get_knob(str(name))
        words = knob.words(value, task, linkedset)
        command_id = f"c{len(self.commands) + 1}"
        unchanged = tr.get(str(name), task, linkedset) == value
        with tr.journal.lock:
            self.commands[command_id] = {"n": len(tr.journal.entries), "name": name, "task": task,
                                         "linkedset": linkedset, "words": words, "sent": time.time(),
                                         "unchanged": unchanged}
        if not unchanged:
            if self.world == 1:
                with tr.journal.source("attached"):
                    tr.set(str(name), value, task, linkedset)
            else:
                with self._lock:
                    self.inbox.append({"op": "set", "id": command_id, "name": name, "value": value, "task": task,
                                       "linkedset": linkedset, "words": words})
        return {"id": command_id, "words": words, "when": knob.when, "unchanged": unchanged,
                "step": tr.step_count}

    def _where(self, command_id: str) -> dict[str, Any]:
        """Where a set took effect: its journal entry (step, minibatch, tick, time), once the job has applied it."""
        c = self.commands.get(command_id)
        if c is None:
            raise AttachError(f"no command {command_id!r} was made through this job")
        if c["unchanged"]:
            return {"in_force": True, "unchanged": True, "words": c["words"], "step": self.trainer.step_count}
        journal = self.trainer.journal
        with journal.lock:
            for e in journal.entries[c["n"]:]:
                if e.get("type") == "change" and e.get("kind") == c["name"] and e.get("source") == "attached" \
                        and e.get("task") == c["task"] and e.get("linkedset") == c["linkedset"]:
                    return {"in_force": True, "words": c["words"], "entry": dict(e), "sent": c["sent"]}
        return {"in_force": False, "words": c["words"], **self.status()}

    def _control(self, command: str) -> dict[str, Any]:
        if self.world > 1:
            with self._lock:
                self.inbox.append({"op": command, "words": command})
        else:
            self._do({"op": command})
        if command == "pause" and self.state == "running":
            self.state = "pausing"
        elif command == "resume" and self.state in ("pausing", "paused"):
            self.state = "running"
        elif command == "stop":
            self.state = "stopping"
        return self.status()

    # ------------------------------------------------------------------ in the training thread
    def _do(self, op: dict[str, Any]) -> None:
        kind = op["op"]
        if kind == "set":
            with self.trainer.journal.source("attached"):
                try:
                    self.trainer.set(op["name"], op["value"], op.get("task"), op.get("linkedset"))
                except ConfigError as exc:  # checked on rank 0 already: every rank refuses alike
                    say(f"attached change {op.get('words')} refused: {exc}", self.progress)
        elif kind == "pause":
            self.paused.set()
        elif kind == "resume":
            self.paused.clear()
            self._wake.set()
        elif kind == "stop":
            self.stopping.set()
            self._wake.set()

    def agree(self) -> None:
        """Several ranks: take rank 0's commands together, at the same point of the run on every rank (a
        broadcast of their length; of the commands themselves when there are any)."""
        import torch.distributed as dist

        data = b""
        if self.rank == 0:
            with self._lock:
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
            self._do(op)

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
            say(f"paused by the attached client at step {self.trainer.step_count}", self.progress)
            while self.paused.is_set() and not self.stopping.is_set():
                if self.world > 1:
                    time.sleep(0.2)
                    self.agree()
                else:
                    self._wake.wait(0.2)
                    self._wake.clear()
            self._follow_lr()
            if not self.stopping.is_set():
                say(f"resumed by the attached client at step {self.trainer.step_count}", self.progress)
        if self.stopping.is_set():
            self.state = "stopping"
            say(f"stopped by the attached client at step {self.trainer.step_count}", self.progress)
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
        """The run ended (``reason``: done, stopped, interrupted, error): say so in ``attach.json`` (its key
        removed) and to a client asking now, then stop listening."""
        if self.ended is not None:
            return
        self.ended = {"reason": reason or "error", "step": self.trainer.step_count if step is None else step,
                      "time": round(time.time(), 3)}
        self.state = "ended"
        if self.world > 1 and self._after_minibatch in self.trainer.callbacks:
            self.trainer.remove_callback(self._after_minibatch)
        if self.sock is None:
            return
        time.sleep(min(0.3, POLL_MS / 1000 * 3) if self._holder() is not None else 0.0)  # a polling client hears it
        self._closing.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        self.sock.close(linger=0)
        self.context.term()
        try:
            write_private(self.expdir / CONNECTION_FILE, {"ended": self.ended, "pid": None,
                                                         "expdir": str(self.expdir.resolve())})
        except OSError:
            pass


def add_attach_flags(p: argparse.ArgumentParser) -> None:
    """``--no-attach`` and ``--attach-ip`` of the commands that train (``mtlab train``, ``demo``, ``resume``)."""
    p.add_argument("--no-attach", action="store_true",
                   help="not attachable: no connection file, no listening port (default: mtlab.attach(EXPDIR) can "
                        "steer the job from a notebook; see docs/guides/attach.md)")
    p.add_argument("--attach-ip", default="127.0.0.1", metavar="IP",
                   help="the address the job listens on for mtlab.attach (default: 127.0.0.1, this machine only; "
                        "reach it from elsewhere through an SSH tunnel)")


def attachable(exp: Any, expdir: Path, args: argparse.Namespace | None = None, progress: bool = True) -> Steering | None:
    """The ``Steering`` of a job (None with ``--no-attach``, or one process without pyzmq: said so). Rank 0
    listens (on ``--attach-ip``, default 127.0.0.1) and writes ``EXPDIR/attach.json``; every rank takes the
    commands with it."""
    if getattr(args, "no_attach", False):
        return None
    ip = str(getattr(args, "attach_ip", "127.0.0.1"))
    steering = Steering(exp, expdir, ip, progress)
    if steering.rank != 0:
        return steering
    try:
        steering.serve(ip)
    except ImportError as exc:
        say(f"not attachable: {exc}", progress)
        return steering if steering.world > 1 else None
    user = getpass.getuser()
    say(f"attach from a notebook: job = mtlab.attach({str(expdir)!r}) (listening on {steering.address}, "
        f"key in {Path(expdir) / CONNECTION_FILE}, readable by {user} only; --no-attach to turn it off)", progress)
    return steering
