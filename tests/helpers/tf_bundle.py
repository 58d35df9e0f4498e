"""Write a TensorFlow checkpoint (tensor bundle, saver V2) without TensorFlow, for test fixtures.

The inverse of ``mtlab.nabu.tf_checkpoint``: ``PREFIX.data-00000-of-00001`` holds each tensor's little-endian
bytes one after another; ``PREFIX.index`` is a LevelDB table (one data block, every entry a restart point, an
empty metaindex block, an index block and the 48-byte footer) mapping ``""`` to the ``BundleHeaderProto`` and
each name, in byte order, to its ``BundleEntryProto`` (dtype, shape, offset, size, masked CRC32C). TensorFlow's
``tf.train.load_checkpoint`` reads what this writes (checked by ``tests/nabu/test_tf_checkpoint.py`` where TensorFlow
is installed)."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from mtlab.nabu.tf_checkpoint import _MAGIC, crc32c

DTYPES = {np.dtype(np.float32): 1, np.dtype(np.float64): 2, np.dtype(np.int32): 3, np.dtype(np.int64): 9}


def mask(crc: int) -> int:
    """LevelDB's CRC masking (what ``tf_checkpoint.unmask`` undoes)."""
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def field(number: int, value: int | bytes) -> bytes:
    """One protobuf field: a varint, or length-delimited bytes."""
    if isinstance(value, bytes):
        return varint(number << 3 | 2) + varint(len(value)) + value
    return varint(number << 3) + varint(value)


def entry_proto(array: np.ndarray, offset: int, raw: bytes) -> bytes:
    shape = b"".join(field(2, field(1, int(d))) for d in array.shape)
    out = field(1, DTYPES[array.dtype]) + field(2, shape)
    if offset:
        out += field(4, offset)
    out += field(5, len(raw))
    return out + varint(6 << 3 | 5) + struct.pack("<I", mask(crc32c(raw)))


def block(items: list[tuple[bytes, bytes]]) -> bytes:
    """A table block with a restart point at every entry (keys stored whole)."""
    body, restarts = bytearray(), []
    for key, value in items:
        restarts.append(len(body))
        body += varint(0) + varint(len(key)) + varint(len(value)) + key + value
    if not restarts:
        restarts = [0]
    body += b"".join(struct.pack("<I", r) for r in restarts) + struct.pack("<I", len(restarts))
    return bytes(body)


def write_bundle(prefix: str | Path, values: dict[str, np.ndarray]) -> Path:
    """Write ``values`` (name -> array of float32/float64/int32/int64) as the checkpoint ``prefix``."""
    prefix = Path(prefix)
    data, items = bytearray(), []
    for name, value in values.items():  # the data in the order given, as tf.raw_ops.SaveV2 writes it
        array = np.asarray(value, order="C")
        raw = array.astype(array.dtype.newbyteorder("<")).tobytes()
        items.append((name.encode(), entry_proto(array, len(data), raw)))
        data += raw
    items.sort()  # the index in byte order of the names
    header = field(1, 1) + field(3, field(1, 1))  # num_shards 1, little endian, version {producer: 1}
    items.insert(0, (b"", header))
    Path(f"{prefix}.data-00000-of-00001").write_bytes(bytes(data))
    table = bytearray()

    def put(contents: bytes) -> bytes:
        handle = varint(len(table)) + varint(len(contents))
        trailer = b"\x00"
        table.extend(contents + trailer + struct.pack("<I", mask(crc32c(contents + trailer))))
        return handle

    data_handle = put(block(items))
    meta_handle = put(block([]))
    index_handle = put(block([(items[-1][0], data_handle)]))
    footer = (meta_handle + index_handle).ljust(40, b"\x00") + struct.pack("<Q", _MAGIC)
    Path(f"{prefix}.index").write_bytes(bytes(table + footer))
    return prefix
