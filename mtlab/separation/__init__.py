"""Source separation: masks from network outputs, reconstruction with the mixture phase, scoring,
and a one-task separation recipe on the shipped samples.

Examples:
    >>> from mtlab.separation import train_separator  # doctest: +SKIP
    >>> sep = train_separator(loss="deepclustering", linkedset="noisy", steps=300)  # doctest: +SKIP
    >>> sep.evaluate()["si_sdri"].mean()  # doctest: +SKIP
"""

from .masks import attractor_masks, head_masks, kmeans, kmeans_masks
from .metrics import (
    DEFAULT_METRICS,
    Evaluation,
    SeparationScores,
    best_permutation,
    evaluate_lists,
    evaluate_table,
    pesq,
    score,
    sdr,
    si_sdr,
    snr,
    stoi,
)
from .remix import RemixedSet
from .runner import (
    METHODS,
    Separator,
    SeparatorConfig,
    audio_players,
    build_separator,
    load_data,
    train_separator,
)
from .spectral import apply_masks, covered_length, istft, stft

__all__ = [
    "DEFAULT_METRICS", "Evaluation", "METHODS", "RemixedSet", "SeparationScores", "Separator", "SeparatorConfig",
    "apply_masks", "attractor_masks", "audio_players", "best_permutation", "build_separator", "covered_length",
    "evaluate_lists", "evaluate_table", "head_masks", "istft", "kmeans", "kmeans_masks", "load_data", "pesq",
    "score", "sdr", "si_sdr", "snr", "stft", "stoi", "train_separator",
]
