"""Messages for the person running training: the ``mtlab`` logger, and above a progress bar when one is shown."""

from __future__ import annotations

import logging

logger = logging.getLogger("mtlab")


def say(message: str, progress: bool = False) -> None:
    """Log ``message`` (logger ``mtlab``); with a progress bar also print it above the bar."""
    logger.info(message)
    if progress:
        from tqdm.auto import tqdm

        tqdm.write(message)
