"""Counts the cases a reliability test tried, per kind (read by scripts/reliability_report.py)."""

from __future__ import annotations

import os


def record(kind: str, held: bool = True) -> None:
    """Note one tried case of ``kind``; ``held`` is False only if the test is about to fail."""
    path = os.environ.get("MTLAB_CAMPAIGN_LOG")
    if path:
        with open(path, "a") as f:
            f.write(f"{kind}\t{int(held)}\n")
