"""mtlab's data layer: list files, WAV reading, features and targets, and the sample corpus.

Example::

    from mtlab.data import load_split
    train = load_split(split="train", linkedset="clean")
    dev = load_split(split="dev", linkedset="clean", stats=train.stats)
    train[0]["features"].shape  # [T, 129]
    big = load_split(root="lists/wsj0-2mix", split="train", linkedset="clean", stream=True)  # read per batch
"""
from .audio import SAMPLE_RATE, read_wav
from .corpus import (
    ENV_VAR,
    FIXED_KEYS,
    SEQUENCE_KEYS,
    TARGET_KEYS,
    SeparationDataset,
    cached_stats,
    check_frame_lengths,
    compute_stats,
    data_samples_dir,
    linked_sets,
    load_split,
)
from .errors import DataError, DataWarning
from .fromlhotse import from_lhotse
from .features import (
    FRAME_CLASSES,
    HOP_LENGTH,
    N_FFT,
    NUM_BINS,
    WIN_LENGTH,
    FeatureStats,
    binary_targets,
    dominance,
    frame_target,
    log_magnitude,
    magnitude,
    num_frames,
    used_bins,
)
from .lists import JoinReport, ListEntry, join_lists, read_list
from .manifest import Manifest, read_manifest
from .ondevice import Featurizer
from .streamed import StreamedSplit
from .vectors import VectorList, load_vectors

from ..tasks.sampling import BatchStream, bucket_batches  # the streams are a core concept; reachable here too

__all__ = [
    "BatchStream",
    "bucket_batches",
    "ENV_VAR",
    "FIXED_KEYS",
    "FRAME_CLASSES",
    "HOP_LENGTH",
    "N_FFT",
    "NUM_BINS",
    "SAMPLE_RATE",
    "SEQUENCE_KEYS",
    "TARGET_KEYS",
    "WIN_LENGTH",
    "DataError",
    "DataWarning",
    "FeatureStats",
    "JoinReport",
    "ListEntry",
    "SeparationDataset",
    "StreamedSplit",
    "Featurizer",
    "Manifest",
    "read_manifest",
    "cached_stats",
    "VectorList",
    "binary_targets",
    "check_frame_lengths",
    "compute_stats",
    "data_samples_dir",
    "dominance",
    "frame_target",
    "join_lists",
    "linked_sets",
    "load_vectors",
    "load_split",
    "log_magnitude",
    "magnitude",
    "num_frames",
    "read_list",
    "read_wav",
    "used_bins",
    "from_lhotse",
]
