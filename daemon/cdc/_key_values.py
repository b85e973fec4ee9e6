"""One comparable value per row for an upsert table's key: what the key index stores.

Rows of the same key must give the same value whatever file or batch they come from
(a data file another engine wrote, a change batch, an int column since widened to
long), and rows of different keys different values. A key of one integer-like column
(int, long, date, time, timestamps) is its 64-bit integer; any other key is bytes:
each column's value in a canonical binary form, several columns joined with their
lengths so no two keys run together.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["KeyValue", "key_array", "key_values"]

KeyValue = int | bytes

_LENGTH = struct.Struct(">I")


def key_values(columns: Sequence[pa.Array | pa.ChunkedArray]) -> list[KeyValue]:
    """The key value of each row of the key ``columns`` (in key order, no nulls: key
    columns are required)."""
    return key_array(columns).to_pylist()  # type: ignore[no-any-return]


def key_array(columns: Sequence[pa.Array | pa.ChunkedArray]) -> pa.Array:
    """`key_values` as one Arrow array (int64 or binary), for whole-array set kernels;
    built without a Python object per row for a one-column key."""
    arrays = [_combined(column) for column in columns]
    if len(arrays) == 1:
        only = arrays[0]
        if _integer_like(only.type):
            return pa.array(_integers(only), pa.int64())
        return _bytes(only)
    parts = [
        _fixed8(array) if _integer_like(array.type) else _bytes(array).to_pylist()
        for array in arrays
    ]
    joined = [b"".join(_LENGTH.pack(len(p)) + p for p in row) for row in zip(*parts, strict=True)]
    return pa.array(joined, pa.binary())


def _fixed8(array: pa.Array) -> list[bytes]:
    """Each integer as its 8 big-endian bytes."""
    raw = _integers(array).astype(">i8").tobytes()
    return [raw[i : i + 8] for i in range(0, len(raw), 8)]


def _combined(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if isinstance(array.type, pa.BaseExtensionType):  # uuid: its 16 bytes compare the same
        array = array.storage
    if array.null_count:
        raise ValueError("a key column holds nulls; key columns are required")
    return array


def _integer_like(data_type: pa.DataType) -> bool:
    return bool(
        pa.types.is_integer(data_type)
        or pa.types.is_date32(data_type)
        or pa.types.is_time(data_type)
        or pa.types.is_timestamp(data_type)
    )


def _integers(array: pa.Array) -> np.ndarray:
    # Temporal values as their stored integers (days, or the column's unit: a column's
    # timestamps are all micro- or all nanoseconds, by its type).
    if not pa.types.is_integer(array.type):
        array = array.view(pa.int32() if array.type.bit_width == 32 else pa.int64())
    return np.asarray(array.cast(pa.int64()).to_numpy(zero_copy_only=False), dtype=np.int64)


def _bytes(array: pa.Array) -> pa.Array:
    data_type = array.type
    if pa.types.is_boolean(data_type):
        return pc.if_else(array, pa.scalar(b"\x01"), pa.scalar(b"\x00"))
    if pa.types.is_decimal(data_type):
        # Same scale for every value of a column: the text is canonical.
        return array.cast(pa.string()).cast(pa.binary())
    if pa.types.is_string(data_type) or pa.types.is_large_string(data_type):
        return array.cast(pa.binary())
    if (
        pa.types.is_binary(data_type)
        or pa.types.is_large_binary(data_type)
        or pa.types.is_fixed_size_binary(data_type)
    ):
        return array.cast(pa.binary())
    raise TypeError(f"{data_type} cannot be an upsert table's key column")
