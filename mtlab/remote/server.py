"""The job's side of attaching, in a thread of its own on rank 0: a ``Server`` answers one steering client (and any
watching ones) over ZeroMQ, checks every message's signature, and hands the commands to the job's ``Steering``
(``mtlab.remote.steering``), which applies them at the next minibatch boundary.

``mtlab train`` (and ``demo``, ``resume``) makes every job attachable unless ``--no-attach``: rank 0 listens on
127.0.0.1 (``--attach-ip`` for another address) and publishes how to reach it in ``EXPDIR/attach.json``
(``mtlab.remote.wire``). The job never waits for a client, and a client that vanishes changes nothing: one not
heard from for ``LEASE_S`` seconds no longer steers it.
"""

from __future__ import annotations

import argparse
import getpass
import json
import threading
import time
from pathlib import Path
from typing import Any

from ..base.errors import ConfigError, MtlabError
from ..base.report import say
from ..core.knobs import KNOBS
from .steering import Steering
from .wire import CONNECTION_FILE, AttachError, Verifier, connection, encode, need_zmq, new_key, write_private

LEASE_S = 20.0  # s: a steering client not heard from for this long loses the job to the next one
POLL_MS = 100
BAD_SIGNATURE = ("refused: the message's signature does not match this job's key; attach with the connection file "
                 f"the job wrote ({CONNECTION_FILE} in its experiment folder), not an older copy")
STEERING = ("set", "pause", "resume", "stop")


def _plain_row(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (v if isinstance(v, (int, float, str, bool)) or v is None else str(v)) for k, v in row.items()}


class Server:
    """Rank 0's answers to attached clients, for ``steering``; see the module docstring."""

    def __init__(self, steering: Steering) -> None:
        self.steering = steering
        self.exp, self.trainer, self.expdir = steering.exp, steering.trainer, steering.expdir
        self.commands: dict[str, dict[str, Any]] = {}  # command id -> where its journal entry will be
        self.steerer: dict[str, Any] | None = None
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        self.sock: Any = None
        self.key = ""
        self.address = ""
        steering.server = self

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
                      connection(ip, port, self.key, self.expdir, self.steering.world))
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
            ended = self.steering.ended
            if ended is not None:
                raise AttachError(f"the job has ended ({ended['reason']} at step {ended['step']}); "
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
                "expdir": str(self.expdir.resolve()), "world_size": self.steering.world, "address": self.address}

    def status(self) -> dict[str, Any]:
        """Where the job stands (step, state, who steers it, how it ended)."""
        holder = self._holder()
        schedule = getattr(self.exp, "schedule", None)
        return {"step": self.trainer.step_count, "num_steps": getattr(schedule, "num_steps", None),
                "state": self.steering.state, "ended": self.steering.ended,
                "steered_by": holder["who"] if holder else None, "minibatch": self.trainer.journal.minibatch,
                "pending": self.trainer.pending_changes() + [c.get("words", "") for c in list(self.steering.inbox)]}

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
            self.steering.submit({"op": "set", "id": command_id, "name": name, "value": value, "task": task,
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
        s = self.steering
        s.submit({"op": command, "words": command})
        if command == "pause" and s.state == "running":
            s.state = "pausing"
        elif command == "resume" and s.state in ("pausing", "paused"):
            s.state = "running"
        elif command == "stop":
            s.state = "stopping"
        return self.status()

    # ------------------------------------------------------------------ the end
    def close(self, ended: dict[str, Any]) -> None:
        """Stop listening (a client polling now hears the end first) and leave ``ended`` in ``attach.json``, its
        key removed."""
        time.sleep(min(0.3, POLL_MS / 1000 * 3) if self._holder() is not None else 0.0)
        self._closing.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        if self.sock is not None:
            self.sock.close(linger=0)
            self.context.term()
        try:
            write_private(self.expdir / CONNECTION_FILE, {"ended": ended, "pid": None,
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
    steering = Steering(exp, expdir, progress)
    if steering.rank != 0:
        return steering
    server = Server(steering)
    try:
        server.serve(ip)
    except ImportError as exc:
        steering.server = None
        say(f"not attachable: {exc}", progress)
        return steering if steering.world > 1 else None
    user = getpass.getuser()
    say(f"attach from a notebook: job = mtlab.attach({str(expdir)!r}) (listening on {server.address}, "
        f"key in {Path(expdir) / CONNECTION_FILE}, readable by {user} only; --no-attach to turn it off)", progress)
    return steering
