"""Deletion vectors: the rows an upsert commit deletes in a format-v3 table, one vector
per data file, in ONE Puffin file per commit attempt (what Iceberg Java's
``BaseDVFileWriter`` writes; Spark 4.1 reads them).

A vector is a ``deletion-vector-v1`` blob (the Puffin spec): its length (4 bytes, big
endian), the magic ``D1 D3 39 64``, the positions as a portable 64-bit Roaring bitmap
(the number of 32-bit bitmaps, 8 bytes little endian, then per key from 0 up: the key,
4 bytes little endian, and the 32-bit Roaring bitmap, run-optimized as Java's
``RoaringPositionBitmap`` writes it), and a CRC-32 of magic and bitmap (4 bytes, big
endian). The Puffin file is ``PFA1``, the blobs, then the footer: ``PFA1``, the footer
JSON (each blob's type, ``fields`` [the row position's field id], ``snapshot-id`` and
``sequence-number`` -1 (inherited), offset, length, and the properties
``referenced-data-file`` and ``cardinality``), its length (4 bytes little endian), 4
flag bytes (0: not compressed), ``PFA1``.

Each vector's manifest entry is a position-delete file of format PUFFIN in the data
file's spec and partition, with ``referenced_data_file``, ``content_offset`` and
``content_size_in_bytes`` (the blob's offset and length), and the vector's cardinality
as its record count. A v3 data file has at most one vector: the caller merges the
file's earlier deletes into it and removes them in the same snapshot.

Blocking; the flush runs it in its thread.
"""

from __future__ import annotations

import contextlib
import json
import zlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import numpy as np
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.table import Table
from pyroaring import BitMap

from icespool.errors import CatalogError
from icespool.iceberg._upstream._v3_manifests import v3_value

if TYPE_CHECKING:
    from icespool.iceberg._live_rows import Located

__all__ = [
    "DELETION_VECTOR_MARK",
    "VectorBlob",
    "deserialize_vector",
    "encode_deletion_vectors",
    "puffin_file",
    "read_deletion_vector",
    "serialize_vector",
]

#: Callers name Puffin files ``{segment}-{incarnation}-dv{attempt}``: the files are
#: ``{file_prefix}-00000-00000.puffin``, the shape of a data file's name, so the orphan
#: sweep knows them as the daemon's.
DELETION_VECTOR_MARK: Final = "-dv"
_PUFFIN_MAGIC: Final = b"PFA1"
_VECTOR_MAGIC: Final = b"\xd1\xd3\x39\x64"
_BLOB_TYPE: Final = "deletion-vector-v1"
#: The row position's reserved field id (``_pos``): what a vector's positions are of.
_POSITION_FIELD_ID: Final = 2147483545
_CREATED_BY: Final = "icespool"
_LOW_BITS: Final = np.uint64(0xFFFFFFFF)


def serialize_vector(positions: np.ndarray) -> bytes:
    """The ``deletion-vector-v1`` blob of ``positions`` (sorted, distinct, >= 0)."""
    values = np.asarray(positions, dtype=np.uint64)
    keys = values >> np.uint64(32)
    count = int(keys[-1]) + 1 if len(values) else 0
    bounds = np.searchsorted(keys, np.arange(count + 1, dtype=np.uint64))
    parts = [count.to_bytes(8, "little")]
    for key in range(count):
        low = (values[bounds[key] : bounds[key + 1]] & _LOW_BITS).astype(np.uint32)
        bitmap = BitMap(array("I", low.tobytes()))
        bitmap.run_optimize()
        parts += [key.to_bytes(4, "little"), bitmap.serialize()]
    body = _VECTOR_MAGIC + b"".join(parts)
    return len(body).to_bytes(4, "big") + body + zlib.crc32(body).to_bytes(4, "big")


def deserialize_vector(blob: bytes) -> np.ndarray:
    """The positions (sorted int64) of a ``deletion-vector-v1`` blob; ValueError when
    its length, magic or checksum is wrong."""
    if len(blob) < 12:
        raise ValueError(f"deletion vector of {len(blob)} bytes: too short")
    length = int.from_bytes(blob[:4], "big")
    if length + 8 != len(blob):
        raise ValueError(f"deletion vector says {length} bytes of vector, has {len(blob) - 8}")
    body = blob[4 : 4 + length]
    if body[:4] != _VECTOR_MAGIC:
        raise ValueError(f"deletion vector magic {body[:4].hex()}, not {_VECTOR_MAGIC.hex()}")
    if zlib.crc32(body) != int.from_bytes(blob[4 + length :], "big"):
        raise ValueError("deletion vector checksum does not match")
    data = memoryview(body)[4:]
    count = int.from_bytes(data[:8], "little")
    offset = 8
    parts: list[np.ndarray] = []
    for index in range(count):
        key = int.from_bytes(data[offset : offset + 4], "little")
        offset += 4
        bitmap = BitMap.deserialize(bytes(data[offset:]))
        # A bitmap's serialized size is what reading it consumed: the portable format
        # keeps container kinds, so writing it again gives the same bytes.
        offset += len(bitmap.serialize()) if index < count - 1 else len(data) - offset
        low = np.frombuffer(bitmap.to_array(), dtype=np.uint32).astype(np.int64)
        parts.append(low + (key << 32))
    if not parts:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate(parts)


@dataclass(frozen=True)
class VectorBlob:
    """A vector as the Puffin file holds it: the data file it deletes rows of, its blob
    and how many rows it deletes."""

    referenced_data_file: str
    blob: bytes
    cardinality: int


def puffin_file(vectors: Sequence[VectorBlob]) -> tuple[bytes, list[int]]:
    """A Puffin file holding ``vectors``, and the offset of each one's blob."""
    content = bytearray(_PUFFIN_MAGIC)
    offsets: list[int] = []
    blobs: list[dict[str, object]] = []
    for vector in vectors:
        offsets.append(len(content))
        content += vector.blob
        blobs.append(
            {
                "type": _BLOB_TYPE,
                "fields": [_POSITION_FIELD_ID],
                "snapshot-id": -1,
                "sequence-number": -1,
                "offset": offsets[-1],
                "length": len(vector.blob),
                "properties": {
                    "referenced-data-file": vector.referenced_data_file,
                    "cardinality": str(vector.cardinality),
                },
            }
        )
    footer = json.dumps(
        {"blobs": blobs, "properties": {"created-by": _CREATED_BY}}, separators=(",", ":")
    ).encode()
    content += _PUFFIN_MAGIC + footer + len(footer).to_bytes(4, "little") + bytes(4)
    content += _PUFFIN_MAGIC
    return bytes(content), offsets


def encode_deletion_vectors(
    table: Table, located: Located, *, file_prefix: str
) -> dict[str, DataFile]:
    """One Puffin file deleting the rows ``located`` names, with a vector per data file
    (``located.positions``: each file's full set of deleted positions, sorted); its
    entries by the data file each deletes rows of. Written through ``table.io`` as
    ``{file_prefix}-00000-00000.puffin``."""
    paths = sorted(p for p, positions in located.positions.items() if len(positions))
    if not paths:
        return {}
    vectors = [
        VectorBlob(path, serialize_vector(located.positions[path]), len(located.positions[path]))
        for path in paths
    ]
    content, offsets = puffin_file(vectors)
    location = table.location_provider().new_data_location(
        data_file_name=f"{file_prefix}-00000-00000.puffin"
    )
    try:
        with table.io.new_output(location).create(overwrite=True) as stream:
            stream.write(content)
    except OSError as exc:
        with contextlib.suppress(Exception):  # best effort: the write's error matters
            table.io.delete(location)
        raise CatalogError(
            f"cannot write deletion vectors for table {'.'.join(table.name())}: {exc}; "
            "check the warehouse storage (the spool still holds the records)"
        ) from exc
    written: dict[str, DataFile] = {}
    for vector, offset in zip(vectors, offsets, strict=True):
        data = located.files[vector.referenced_data_file]
        entry = DataFile.from_args(
            _table_format_version=3,
            content=DataFileContent.POSITION_DELETES,
            file_path=location,
            file_format=FileFormat.PUFFIN,
            partition=data.file.partition,
            record_count=vector.cardinality,
            file_size_in_bytes=len(content),
            referenced_data_file=vector.referenced_data_file,
            content_offset=offset,
            content_size_in_bytes=len(vector.blob),
        )
        entry.spec_id = data.spec_id  # from_args drops it; the commit groups by it
        written[vector.referenced_data_file] = entry
    return written


def read_deletion_vector(io: FileIO, delete_file: DataFile) -> np.ndarray:
    """The positions the deletion vector ``delete_file`` (an entry read with its v3
    fields) deletes in its ``referenced_data_file``: its blob read alone."""
    offset = v3_value(delete_file, "content_offset")
    size = v3_value(delete_file, "content_size_in_bytes")
    if offset is None or size is None:
        raise ValueError(f"deletion vector {delete_file.file_path} has no content offset or size")
    with io.new_input(delete_file.file_path).open() as stream:
        stream.seek(offset)
        blob = stream.read(size)
    return deserialize_vector(blob)
