"""Per-utterance vectors (i-vectors) read the way the original's ``matrix2vector_processor`` reads them.

A vector list has one line per utterance, ``name [audio] matrixfile``: the matrix file (the last field; a
relative path is taken from the list's folder) holds ``nrs`` rows of ``nrcol`` numbers, the rows separated
by commas and the numbers by spaces (``"0.1 -0.3 ...,0.7 0.2 ..."``, one row per speaker). The rows are
laid end to end into one vector of ``nrs * nrcol`` values. With ``mvn = "global"`` the vector is mean and
variance normalized with the mean and standard deviation (over utterances) of the vectors of
``stats_list`` (the training list), as the original does with its ``meanandvar_dir``.

Examples:
    >>> spec = VectorList("tr/utt_ivec10info.txt", nrcol=10, nrs=2, mvn="global")  # doctest: +SKIP
    >>> vectors = load_vectors(spec)          # {name: Tensor[20]}  # doctest: +SKIP
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from .errors import DataError
from .lists import ListEntry, read_list

MVN_TYPES = ("global", "none")
STD_FLOOR = 1e-5  # the original divides by a zero std (inf/nan); a constant dimension is left centred instead


@dataclass(frozen=True)
class VectorList:
    """Where a linked set's per-utterance vectors are and how to read them (``data.ivec`` of a recipe)."""

    list: str  # the list file: name [audio] matrixfile
    nrcol: int  # numbers per row (the i-vector dimension)
    nrs: int = 2  # rows per file (one i-vector per speaker)
    mvn: str = "none"  # "global": normalized with the mean/std of stats_list's vectors
    stats_list: str = ""  # the list the global mean/std come from ("": this list)

    def __post_init__(self) -> None:
        if not isinstance(self.list, str) or not self.list:
            raise DataError(f"VectorList list={self.list!r}: give the path of the vector list file")
        for key in ("nrcol", "nrs"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise DataError(f"VectorList {key}={value!r}: a positive integer")
        if self.mvn not in MVN_TYPES:
            raise DataError(f"VectorList mvn={self.mvn!r}; valid: {list(MVN_TYPES)}")

    @property
    def dim(self) -> int:
        """The vector size, ``nrs * nrcol``."""
        return self.nrs * self.nrcol

    def to_dict(self) -> dict[str, Any]:
        """Plain values (for a recipe or a checkpoint)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], origin: str = "ivec") -> VectorList:
        """The spec ``to_dict`` wrote."""
        valid = ("list", "nrcol", "nrs", "mvn", "stats_list")
        unknown = sorted(set(data) - set(valid))
        if unknown:
            raise DataError(f"{origin}: unknown keys {unknown}; valid: {', '.join(valid)}")
        if "list" not in data or "nrcol" not in data:
            raise DataError(f"{origin}: needs list = \"path/to/list\" and nrcol = <vector size per row>")
        return cls(**data)


def matrix_file(entry: ListEntry) -> Path:
    """The matrix file a vector-list line names: its last field, relative to the list's folder."""
    path = Path(entry.fields[-1])
    return path if path.is_absolute() else entry.path.parent / path


def read_vector(entry: ListEntry, nrcol: int, nrs: int) -> torch.Tensor:
    """The ``[nrs * nrcol]`` float32 vector of one list line (rows laid end to end, speaker by speaker)."""
    path = matrix_file(entry)
    if not path.is_file():
        raise DataError(f"{path} (listed at {entry.where}): matrix file not found; the last field of a vector "
                        "list line is the file with the utterance's vectors")
    rows = path.read_text().strip().split(",")
    if len(rows) != nrs:
        raise DataError(f"{path} (listed at {entry.where}): {len(rows)} comma-separated rows, but the processor's "
                        f"nrs = {nrs}; write one row of {nrcol} numbers per speaker, rows separated by ','")
    values: list[float] = []
    for i, row in enumerate(rows):
        numbers = row.split()
        if len(numbers) != nrcol:
            raise DataError(f"{path} (listed at {entry.where}): row {i + 1} has {len(numbers)} numbers, but the "
                            f"processor's nrcol = {nrcol}; give every row {nrcol} space-separated numbers")
        try:
            values.extend(float(x) for x in numbers)
        except ValueError:
            raise DataError(f"{path} (listed at {entry.where}): row {i + 1} is not all numbers: {row.strip()!r}") \
                from None
    return torch.tensor(values, dtype=torch.float64)


def vector_stats(spec: VectorList, base: Path | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, std) over the utterances of the stats list (the original's ``glob_mean``/``glob_std``)."""
    path = _path(spec.stats_list or spec.list, base)
    vectors = torch.stack([read_vector(e, spec.nrcol, spec.nrs) for e in read_list(path).values()])
    if vectors.shape[0] == 0:
        raise DataError(f"{path}: no vectors to compute the global mean and variance from")
    mean = vectors.mean(dim=0)
    std = (vectors - mean).square().mean(dim=0).sqrt()
    return mean, std


def load_vectors(spec: VectorList, names: list[str] | None = None, base: Path | None = None) -> dict[str, torch.Tensor]:
    """``{name: Tensor[dim]}`` (float32) for the list's utterances (``names``: only those), normalized as set."""
    entries = read_list(_path(spec.list, base))
    stats = vector_stats(spec, base) if spec.mvn == "global" else None
    out = {}
    for name in names if names is not None else list(entries):
        if name not in entries:
            raise DataError(f"{_path(spec.list, base)}: no vector for utterance {name!r}; add a line for it")
        out[name] = normalize(read_vector(entries[name], spec.nrcol, spec.nrs), stats)
    return out


def normalize(vector: torch.Tensor, stats: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """``(vector - mean) / std`` (std floored at ``STD_FLOOR``), as float32; unchanged without stats."""
    if stats is None:
        return vector.float()
    mean, std = stats
    return ((vector - mean) / std.clamp_min(STD_FLOOR)).float()


def _path(given: str, base: Path | None) -> Path:
    path = Path(given)
    return path if path.is_absolute() or base is None else base / path
