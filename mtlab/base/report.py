"""Messages for the person running training: the ``mtlab`` logger (above a progress bar when one is shown), and
tables of values in HTML."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger("mtlab")


def say(message: str, progress: bool = False) -> None:
    """Log ``message`` (logger ``mtlab``); with a progress bar also print it above the bar."""
    logger.info(message)
    if progress:
        from tqdm.auto import tqdm

        tqdm.write(message)


def values_html(values: Mapping[str, Any], caption: str) -> str:
    """A two-column HTML table of names and values (floats to 6 significant digits, None empty)."""
    rows = "".join(f"<tr><td>{k}</td><td>{'' if v is None else (f'{v:.6g}' if isinstance(v, float) else v)}</td></tr>"
                   for k, v in values.items())
    return f"<table><caption>{caption}</caption>{rows}</table>"
