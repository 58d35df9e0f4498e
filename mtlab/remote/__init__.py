"""Attach a notebook to a running job: steer ``mtlab train`` (one process or torchrun) from another process.

``job = mtlab.attach(expdir)`` (``client``) reaches the job's ``Steering`` (``server``) through the connection
file the job writes in its experiment folder (``wire``). Knob changes take effect at the job's next minibatch
boundary, on every rank alike, and are journaled there with the source ``attached``: ``mtlab replay EXPDIR``
reproduces the run, attached changes included. See docs/guides/attach.md.
"""

from __future__ import annotations

from .client import Applied, Job, attach
from .wire import CONNECTION_FILE, AttachError, JobEnded

__all__ = ["Applied", "AttachError", "CONNECTION_FILE", "Job", "JobEnded", "attach"]
