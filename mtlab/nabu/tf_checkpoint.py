"""Read a TensorFlow checkpoint without TensorFlow.

A TensorFlow (1.x saver ``V2`` or 2.x) checkpoint ``PREFIX`` is ``PREFIX.index``, a sorted key/value table
in LevelDB's format (data blocks of prefix-compressed entries, an index block, a 48-byte footer), whose
values are ``BundleEntryProto`` messages (dtype, shape, shard, offset, size, masked CRC32C), plus
``PREFIX.data-SSSSS-of-NNNNN`` shards holding each tensor's raw little-endian bytes at its offset. This
module reads both with the standard library and numpy, checking every block's and tensor's CRC32C::

    ckpt = TFCheckpoint("model/network.ckpt")
    ckpt.shapes()            # {"main/layer0/.../kernel": (137, 32), ...}
    kernel = ckpt.read("main/layer0/.../kernel")   # a numpy array
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..base.errors import ConfigError

_MAGIC = 0xDB4775248B80FB57  # LevelDB's table magic number, which TensorFlow's table keeps
_FOOTER = 48  # two block handles padded to 20 bytes each, then the 8-byte magic
_TRAILER = 5  # after each block: its compression type (1 byte) and masked CRC32C (4 bytes)
# TensorFlow's DataType enum values (types.proto) that a model's weights can have
_DTYPES = {1: np.float32, 2: np.float64, 3: np.int32, 4: np.uint8, 5: np.int16, 6: np.int8, 9: np.int64,
           10: np.bool_, 17: np.uint16, 19: np.float16, 22: np.uint32, 23: np.uint64}


class CheckpointFormatError(ConfigError):
    """A file that is not a readable TensorFlow checkpoint (or a corrupted one)."""


# ------------------------------------------------------------------ CRC32C (Castagnoli), as TensorFlow checks it
def _crc_tables() -> list[list[int]]:
    first = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        first.append(c)
    tables = [first]
    for _ in range(7):  # slicing-by-8: table k advances a byte through k more zero bytes
        prev = tables[-1]
        tables.append([(prev[n] >> 8) ^ first[prev[n] & 0xFF] for n in range(256)])
    return tables


_T = _crc_tables()


def crc32c(data: bytes | memoryview) -> int:
    """CRC32C of ``data``, in pure Python (slicing-by-8: eight bytes per step)."""
    t0, t1, t2, t3, t4, t5, t6, t7 = _T
    crc = 0xFFFFFFFF
    view = memoryview(data).cast("B")
    n8 = len(view) // 8 * 8
    for lo, hi in struct.iter_unpack("<II", view[:n8]):
        lo ^= crc
        crc = (t7[lo & 0xFF] ^ t6[(lo >> 8) & 0xFF] ^ t5[(lo >> 16) & 0xFF] ^ t4[lo >> 24]
               ^ t3[hi & 0xFF] ^ t2[(hi >> 8) & 0xFF] ^ t1[(hi >> 16) & 0xFF] ^ t0[hi >> 24])
    for b in view[n8:]:
        crc = (crc >> 8) ^ t0[(crc ^ b) & 0xFF]
    return crc ^ 0xFFFFFFFF


def unmask(masked: int) -> int:
    """LevelDB's CRC masking undone (stored CRCs are rotated and offset so a CRC of CRCs stays strong)."""
    rot = (masked - 0xA282EAD8) & 0xFFFFFFFF
    return ((rot >> 17) | (rot << 15)) & 0xFFFFFFFF


# ------------------------------------------------------------------ protobuf and table primitives
def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise CheckpointFormatError("a varint runs past its buffer")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, value) of a protobuf message: ints for varint and fixed fields, bytes for the others."""
    out: list[tuple[int, int | bytes]] = []
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = struct.unpack_from("<Q", buf, pos)[0], pos + 8
        elif wire == 5:
            value, pos = struct.unpack_from("<I", buf, pos)[0], pos + 4
        elif wire == 2:
            size, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + size], pos + size
        else:
            raise CheckpointFormatError(f"protobuf wire type {wire} in an index entry")
        out.append((number, value))
    return out


def _message(value: int | bytes) -> bytes:
    """A length-delimited field's bytes (a nested message such as a shape)."""
    if isinstance(value, int):
        raise CheckpointFormatError("a number where a nested message belongs (a shape) in an index entry")
    return value


@dataclass(frozen=True)
class Entry:
    """Where one tensor lies: the fields of TensorFlow's ``BundleEntryProto``."""

    dtype: int
    shape: tuple[int, ...]
    shard: int
    offset: int
    size: int
    crc: int  # masked, as stored
    sliced: bool  # a partitioned variable: its data lies in slice entries mtlab does not read


def _entry(value: bytes) -> Entry:
    dtype = shard = offset = size = crc = 0
    shape: list[int] = []
    sliced = False
    for number, v in _fields(value):
        if number == 1:
            dtype = int(v)
        elif number == 2:
            for dim_number, dim in _fields(_message(v)):
                if dim_number == 2:
                    shape.append(next((int(s) for n, s in _fields(_message(dim)) if n == 1), 0))
        elif number == 3:
            shard = int(v)
        elif number == 4:
            offset = int(v)
        elif number == 5:
            size = int(v)
        elif number == 6:
            crc = int(v)
        elif number == 7:
            sliced = True
    return Entry(dtype, tuple(shape), shard, offset, size, crc, sliced)


class TFCheckpoint:
    """The tensors of a TensorFlow checkpoint ``prefix`` (the path without ``.index``), read lazily."""

    def __init__(self, prefix: str | Path) -> None:
        prefix = Path(prefix)
        if prefix.name.endswith(".index") or ".data-" in prefix.name:  # a file of the checkpoint given
            prefix = prefix.with_name(prefix.name.removesuffix(".index").split(".data-")[0])
        if prefix.is_dir():  # a model folder: its checkpoint file names the latest prefix
            prefix = _latest(prefix)
        self.prefix = prefix
        index = Path(f"{prefix}.index")
        if not index.is_file():
            raise CheckpointFormatError(f"{index} not found: give the checkpoint prefix (e.g. model/network.ckpt "
                                        "for model/network.ckpt.index and .data-00000-of-00001)")
        self.entries, self.num_shards = self._read_index(index.read_bytes(), index)

    # -------------------------------------------------------------- the index table
    @staticmethod
    def _block(data: bytes, offset: int, size: int, where: Path) -> bytes:
        if offset + size + _TRAILER > len(data):
            raise CheckpointFormatError(f"{where}: a block runs past the end of the file (truncated?)")
        block = data[offset:offset + size]
        kind, masked = data[offset + size], struct.unpack_from("<I", data, offset + size + 1)[0]
        if crc32c(data[offset:offset + size + 1]) != unmask(masked):
            raise CheckpointFormatError(f"{where}: a block's CRC32C does not match (the file is corrupted)")
        if kind != 0:
            raise CheckpointFormatError(f"{where}: a block is compressed (type {kind}); TensorFlow writes checkpoint "
                                        "indexes uncompressed, so this is not one")
        return block

    @staticmethod
    def _items(block: bytes) -> list[tuple[bytes, bytes]]:
        restarts = struct.unpack_from("<I", block, len(block) - 4)[0]
        end = len(block) - 4 * (1 + restarts)
        items, key, pos = [], b"", 0
        while pos < end:
            shared, pos = _varint(block, pos)
            fresh, pos = _varint(block, pos)
            size, pos = _varint(block, pos)
            key = key[:shared] + block[pos:pos + fresh]
            pos += fresh
            items.append((key, block[pos:pos + size]))
            pos += size
        return items

    def _read_index(self, data: bytes, where: Path) -> tuple[dict[str, Entry], int]:
        if len(data) < _FOOTER or struct.unpack_from("<Q", data, len(data) - 8)[0] != _MAGIC:
            raise CheckpointFormatError(f"{where} is not a TensorFlow checkpoint index (no table magic number)")
        footer = data[len(data) - _FOOTER:]
        _, pos = _varint(footer, 0)  # the metaindex block: empty in checkpoints
        _, pos = _varint(footer, pos)
        index_offset, pos = _varint(footer, pos)
        index_size, _ = _varint(footer, pos)
        entries: dict[str, Entry] = {}
        num_shards = 1
        for _, handle in self._items(self._block(data, index_offset, index_size, where)):
            offset, pos = _varint(handle, 0)
            size, _ = _varint(handle, pos)
            for key, value in self._items(self._block(data, offset, size, where)):
                if key == b"":  # the header: number of shards, endianness
                    header = dict(_fields(value))
                    num_shards = int(header.get(1, 1))
                    if int(header.get(2, 0)):
                        raise CheckpointFormatError(f"{where}: a big-endian checkpoint; mtlab reads little-endian")
                else:
                    entries[key.decode()] = _entry(value)
        return entries, num_shards

    # -------------------------------------------------------------- tensors
    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every variable's shape, by name."""
        return {name: e.shape for name, e in self.entries.items()}

    def read(self, name: str) -> np.ndarray:
        """The tensor ``name`` as a numpy array, its CRC32C checked."""
        if name not in self.entries:
            raise CheckpointFormatError(f"{self.prefix}: no variable {name!r}")
        e = self.entries[name]
        if e.sliced:
            raise CheckpointFormatError(f"{self.prefix}: {name!r} is a partitioned variable; mtlab reads whole ones")
        if e.dtype not in _DTYPES:
            raise CheckpointFormatError(f"{self.prefix}: {name!r} has TensorFlow dtype {e.dtype}, not a numeric one "
                                        "mtlab reads")
        shard = Path(f"{self.prefix}.data-{e.shard:05d}-of-{self.num_shards:05d}")
        if not shard.is_file():
            raise CheckpointFormatError(f"{shard} not found: the checkpoint's data shard for {name!r}")
        with shard.open("rb") as f:
            f.seek(e.offset)
            raw = f.read(e.size)
        if len(raw) != e.size:
            raise CheckpointFormatError(f"{shard}: {name!r} runs past the end of the shard (truncated?)")
        if crc32c(raw) != unmask(e.crc):
            raise CheckpointFormatError(f"{shard}: {name!r} fails its CRC32C check (the file is corrupted)")
        dtype = np.dtype(_DTYPES[e.dtype]).newbyteorder("<")
        count = int(np.prod(e.shape)) if e.shape else 1
        if count * dtype.itemsize != e.size:
            raise CheckpointFormatError(f"{shard}: {name!r} holds {e.size} bytes, not {count} values of {dtype}")
        return np.frombuffer(raw, dtype=dtype).reshape(e.shape).astype(dtype.newbyteorder("="))


def _latest(folder: Path) -> Path:
    """The prefix a TensorFlow ``checkpoint`` state file names (``model_checkpoint_path: "..."``)."""
    state = folder / "checkpoint"
    if state.is_file():
        for line in state.read_text().splitlines():
            if line.startswith("model_checkpoint_path:"):
                path = Path(line.split(":", 1)[1].strip().strip('"'))
                return path if path.is_absolute() else folder / path
    indexes = sorted(folder.glob("*.index"))
    if len(indexes) == 1:
        return indexes[0].with_suffix("")
    raise CheckpointFormatError(f"{folder}: no 'checkpoint' file naming the latest checkpoint and "
                                f"{len(indexes)} .index files; give the checkpoint prefix")
