"""The client's side of attaching: ``job = mtlab.attach(expdir)`` from a notebook or a script.

>>> job = mtlab.attach("exp/run1", timeout=60)           # waits for the job to come up  # doctest: +SKIP
>>> job.history.tail()                                    # the steps so far, refreshed at each read  # doctest: +SKIP
>>> job.set("weight", 0.8, task="frames", linkedset="noisy")  # doctest: +SKIP
Applied(task frames/noisy weight -> 0.8: in force from step 41, minibatch 2)
>>> job.pause(); job.resume(); job.stop()                 # stop: final.pt and the tables, then the job ends  # doctest: +SKIP
>>> job.dashboard()                                       # the dashboard, bound to the job  # doctest: +SKIP

One client steers a job at a time (``steer=False`` watches only). A job that ends or dies is reported as such
(``JobEnded``, ``job.state``), never as a history that stops growing without a word.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..base.errors import ConfigError
from .wire import CONNECTION_FILE, AttachError, JobEnded, encode, need_zmq, process_gone, read_connection, sign

HEARTBEAT_S = 5.0  # s: a steering client says it is still there (the job frees it after LEASE_S of silence)


@dataclass(frozen=True)
class Applied:
    """Where a ``job.set`` took effect: the journal's place (``step``, ``minibatch``) and how long after the
    call it was in force (``delay_s``, the job's clock against this one's: the same machine's)."""

    words: str
    in_force: bool
    step: int | None = None
    minibatch: int | None = None
    delay_s: float | None = None
    entry: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __str__(self) -> str:
        if not self.in_force:
            return f"{self.words}: sent, not in force yet (the job takes it at its next minibatch)"
        if not self.entry:
            return f"{self.words}: already in force (unchanged)"
        where = f"step {self.step}" + (f", minibatch {self.minibatch}" if self.minibatch else "")
        return f"{self.words}: in force from {where}"

    def __repr__(self) -> str:
        return f"Applied({self})"


def _describe_gone(info: dict[str, Any] | None, path: Path | None) -> JobEnded | None:
    """The end a connection file tells of (ended, or a process of this machine gone), else None."""
    if info is None:
        return None
    ended = info.get("ended")
    if isinstance(ended, dict):
        where = info.get("expdir") or (path.parent if path else "")
        return JobEnded(f"the job ended at step {ended.get('step')} ({ended.get('reason')}); its history and "
                        f"journal are in {where}; `mtlab replay {where}` reruns it",
                        str(ended.get("reason")), ended.get("step"))
    if process_gone(info):
        return JobEnded(f"the job died: its process {info.get('pid')} no longer runs and it did not say it ended "
                        "(killed, or out of memory); `mtlab resume` continues it from its last checkpoint", "died")
    return None


class Job:
    """A running job seen from another process; build it with :func:`attach`."""

    def __init__(self, info: dict[str, Any], path: Path | None, steer: bool = True, request_timeout: float = 10.0) -> None:
        zmq = need_zmq()
        self._zmq = zmq
        self.connection = info
        self.path = path
        self.steering = steer
        self.request_timeout = request_timeout
        self.session = uuid.uuid4().hex
        self._lock = threading.RLock()
        self._context = zmq.Context.instance()  # one per process, never terminated: a Job only closes its socket
        self._sock = self._socket()
        self._rows: list[dict[str, Any]] = []
        self._changes: list[dict[str, Any]] = []
        self._seen_entries = 0
        self._ended: JobEnded | None = None
        self._status: dict[str, Any] = {}
        self._detached = False
        self._beat: threading.Thread | None = None
        who = f"{getpass.getuser()}@{socket.gethostname()} (pid {os.getpid()})"
        try:
            self.info = self._request("hello", {"steer": steer, "who": who})
        except BaseException:
            self._sock.close(linger=0)
            raise
        self._status = dict(self.info)
        if steer:
            self._beat = threading.Thread(target=self._heartbeat, name="mtlab-attach-heartbeat", daemon=True)
            self._beat.start()

    def _socket(self) -> Any:
        zmq = self._zmq
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(f"tcp://{self.connection['ip']}:{self.connection['port']}")
        return sock

    # ------------------------------------------------------------------ talking to the job
    def _request(self, command: str, args: dict[str, Any] | None = None, timeout: float | None = None) -> Any:
        if self._detached:
            raise AttachError("this client has detached; mtlab.attach(expdir) attaches again")
        if self._ended is not None:
            raise self._ended
        message = {"id": uuid.uuid4().hex, "session": self.session, "command": command, "args": args or {},
                   "time": round(time.time(), 3)}
        wait = self.request_timeout if timeout is None else timeout
        with self._lock:
            if self._ended is not None or self._detached:  # another thread saw the end meanwhile
                raise self._ended or AttachError("this client has detached; mtlab.attach(expdir) attaches again")
            self._sock.send_multipart(encode(self.connection["key"], message))
            deadline = time.monotonic() + wait
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not self._sock.poll(int(left * 1000)):
                    # no answer: a new socket (the old one may hold a late reply), and why, if the file says
                    self._sock.close(linger=0)
                    self._sock = self._socket()
                    raise self._silence(wait)
                signature, body = self._sock.recv_multipart()[-2:]
                reply = json.loads(body)
                if not signature:
                    raise AttachError(f"the job refused the command: {reply.get('error')}")
                if sign(self.connection["key"], body) != signature:
                    raise AttachError("a reply with a wrong signature: this is not the job of the connection file")
                if reply.get("id") == message["id"]:
                    break  # else a late reply to an earlier request that timed out: skip it
        if not reply.get("ok"):
            if reply.get("kind") == "ConfigError":
                raise ConfigError(str(reply.get("error")))
            raise AttachError(str(reply.get("error")))
        result = reply.get("result")
        if isinstance(result, dict) and "state" in result:
            self._status.update({k: v for k, v in result.items() if k not in ("rows", "entries")})
            if result.get("state") == "ended" and isinstance(result.get("ended"), dict):
                self._ended_with(result["ended"])
                self._sock.close(linger=0)
        return result

    def _ended_with(self, ended: dict[str, Any]) -> None:
        where = self.connection.get("expdir", "")
        self._ended = JobEnded(f"the job ended at step {ended.get('step')} ({ended.get('reason')}); its history "
                               f"and journal are in {where}", str(ended.get("reason")), ended.get("step"))

    def _silence(self, waited: float) -> AttachError:
        """Why the job did not answer: ended or died (from its connection file), or not known."""
        if self.path is not None:
            info, _ = read_connection(self.path)
            gone = _describe_gone(info, self.path)
            if gone is not None:
                self._ended = gone
                self._sock.close(linger=0)
                return gone
        return AttachError(f"the job at {self.connection['ip']}:{self.connection['port']} did not answer in "
                           f"{waited:.0f} s: it may have ended or died, or the network (an SSH tunnel?) is down; "
                           "job.state asks again")

    def _heartbeat(self) -> None:
        while not self._detached and self._ended is None:
            time.sleep(HEARTBEAT_S)
            if self._detached or self._ended is not None:
                return
            try:
                self._request("ping")
            except AttachError:
                pass

    # ------------------------------------------------------------------ what the job is doing
    @property
    def state(self) -> str:
        """``running``, ``pausing``, ``paused``, ``stopping``, ``ended`` or ``died`` (asked now)."""
        if self._ended is None:
            try:
                self._request("status")
            except JobEnded:
                pass
            except AttachError:
                return "unreachable"
        if self._ended is not None:
            return "died" if self._ended.reason == "died" else "ended"
        return str(self._status.get("state"))

    @property
    def ended(self) -> JobEnded | None:
        """How the job ended (None while it runs)."""
        return self._ended

    @property
    def step(self) -> int:
        """The job's step count, as last heard."""
        return int(self._status.get("step", 0))

    def status(self) -> dict[str, Any]:
        """Where the job stands now: step, num_steps, state, who steers it, changes waiting, how it ended."""
        if self._ended is None:
            try:
                self._request("status")
            except JobEnded:
                pass
        return dict(self._status)

    def rows(self) -> list[dict[str, Any]]:
        """The history rows so far (new ones fetched; a go-back's rewound history replaces them)."""
        if self._ended is None and not self._detached:
            try:
                out = self._request("history", {"since": len(self._rows), "last": self._rows[-1] if self._rows else None})
            except JobEnded:
                return list(self._rows)
            if out["reset"]:
                self._rows = []
            self._rows.extend(out["rows"])
        return list(self._rows)

    @property
    def history(self) -> Any:
        """The steps so far as a pandas DataFrame (one row per step, as ``trainer.history``), fetched now."""
        import pandas as pd

        return pd.DataFrame(self.rows())

    def changes(self) -> list[dict[str, Any]]:
        """The journal's change entries so far (knob changes with their step, minibatch and source)."""
        if self._ended is None and not self._detached:
            try:
                out = self._request("journal", {"since": self._seen_entries})
            except JobEnded:
                return list(self._changes)
            if out["total"] < self._seen_entries:
                self._changes, self._seen_entries = [], 0
                out = self._request("journal", {"since": 0})
            self._changes.extend(out["entries"])
            self._seen_entries = out["total"]
        return list(self._changes)

    def knobs(self) -> list[dict[str, Any]]:
        """Every knob of the job's trainer with its value now (``trainer.knobs()``)."""
        return list(self._request("hello", {"steer": False})["knobs"])

    # ------------------------------------------------------------------ steering
    def set(self, name: str, value: Any, task: str | None = None, linkedset: str | None = None,
            wait: bool = True, timeout: float = 60.0) -> Applied:
        """Set a knob of the job (the names and checks of ``Trainer.set``): refused at once with the trainer's
        message when bad (the job goes on unchanged); else applied at the job's next minibatch and journaled
        there (source ``attached``). With ``wait`` (default), returns once it is in force, saying where."""
        sent = time.time()
        out = self._request("set", {"name": name, "value": value, "task": task, "linkedset": linkedset})
        if out.get("unchanged"):
            return Applied(out["words"], True, out.get("step"))
        deadline = time.monotonic() + timeout
        while True:
            where = self._request("where", {"id": out["id"]})
            if where.get("in_force"):
                e = where["entry"]
                return Applied(out["words"], True, int(e["step"]), int(e["minibatch"]),
                               max(0.0, float(e.get("time", sent)) - sent), e)
            if not wait or time.monotonic() > deadline:
                return Applied(out["words"], False)
            time.sleep(0.02)

    def pause(self, wait: bool = True, timeout: float = 120.0) -> str:
        """Pause the job before its next step (with ``wait``, until it has paused); returns its state."""
        self._request("pause")
        return self._until(("paused",), wait, timeout)

    def resume(self) -> str:
        """Let a paused job go on; returns its state."""
        return str(self._request("resume")["state"])

    def stop(self, wait: bool = True, timeout: float | None = 600.0) -> str:
        """Stop the job before its next step: it saves ``final.pt``, the tables and the summary, and ends
        (``mtlab resume`` continues it). With ``wait``, until it has ended; returns its state."""
        self._request("stop")
        return self.wait(timeout) if wait else self.state

    def wait(self, timeout: float | None = None) -> str:
        """Block until the job ends (or ``timeout`` s); returns its state (``ended``, ``died``, or the state it
        is in at the timeout)."""
        return self._until(("ended", "died"), True, timeout)

    def _until(self, states: tuple[str, ...], wait: bool, timeout: float | None) -> str:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            state = self.state
            if state in states or state in ("ended", "died") or not wait:
                return state
            if deadline is not None and time.monotonic() > deadline:
                return state
            time.sleep(0.1)

    def detach(self) -> None:
        """Let go of the job (it goes on as it was); another client may steer it now."""
        if self._detached:
            return
        if self._ended is None:
            try:
                self._request("detach", timeout=2.0)
            except AttachError:
                pass
        self._detached = True
        with self._lock:
            self._sock.close(linger=0)

    def dashboard(self, **kwargs: Any) -> Any:
        """The dashboard of a local trainer, bound to this job: live plots, sliders, run controls, events."""
        import importlib

        return importlib.import_module("mtlab.ui.remote").dashboard(self, **kwargs)

    def __repr__(self) -> str:
        s = self._status
        where = self.connection.get("expdir", "")
        state = "detached" if self._detached else ("ended" if self._ended else s.get("state"))
        return f"Job({where}, {state}, step {s.get('step')}/{s.get('num_steps')})"


def attach(expdir: str | Path | dict[str, Any], timeout: float = 30.0, steer: bool = True) -> Job:
    """Attach to the job training into ``expdir`` (or given by its connection file, or that file's contents:
    a copy on a laptop, with an SSH tunnel to the port it names). Waits up to ``timeout`` s for the job to come
    up; ``steer=False`` watches without steering (several may watch, one steers).

    Refuses, saying why: a job that has ended or died, a folder where no job is attachable after ``timeout``,
    a wrong key, another client steering."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        info, path = read_connection(expdir)
        gone = _describe_gone(info, path)
        if gone is not None:
            raise gone
        if info is not None and "key" in info:
            try:
                return Job(info, path, steer=steer, request_timeout=max(1.0, min(10.0, deadline - time.monotonic())))
            except JobEnded:
                raise
            except AttachError as exc:
                if "did not answer" not in str(exc):
                    raise
                last = exc
        if time.monotonic() > deadline:
            where = path if path is not None else "the connection given"
            if info is None:
                raise AttachError(f"no job to attach to in {timeout:.0f} s: {where} does not exist; start one with "
                                  "`mtlab train RECIPE --expdir DIR` (attachable unless --no-attach), or give a longer "
                                  "timeout while it loads its data") from None
            raise AttachError(f"{where}: the job did not answer in {timeout:.0f} s ({last})") from None
        time.sleep(0.2)


__all__ = ["Applied", "AttachError", "Job", "JobEnded", "attach", "CONNECTION_FILE"]
