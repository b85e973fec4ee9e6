"""Iceberg partition transforms on Arrow arrays, vectorized (pyarrow.compute).

They return the partition values in Iceberg's physical representation (days, hours,
micros, bytes), which is what manifests store; tests check them against pyiceberg's
scalar reference implementation.

Why not pyiceberg's own vectorized transforms: they need the optional native
``pyiceberg-core`` package, which computes the same values bit for bit (0.11.0, on
1,000,000 rows: tests/bench/bench_transforms.py) but is not faster where it matters:
2-5x slower for year, month and day of a timestamp (the usual partitioning of events)
and for truncating strings, faster for bucket, hour and integer truncation by 5-50 ms
per million rows, a small part of encoding them. One implementation, no native
dependency.
"""

from __future__ import annotations

from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    YearTransform,
)
from pyiceberg.types import (
    DateType,
    IcebergType,
    IntegerType,
    LongType,
    TimestampNanoType,
    TimestampType,
    TimestamptzNanoType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

__all__ = ["partition_transform"]


_U32: Final = pa.uint32()
_UNITS_PER_SECOND: Final = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


def _floor_div(values: pa.Array, divisor: int) -> pa.Array:
    """Floor division of an int64 array; Arrow's integer divide truncates toward zero."""
    quotient = pc.divide(values, divisor)
    remainder = pc.subtract(values, pc.multiply(quotient, divisor))
    return pc.if_else(pc.less(remainder, 0), pc.subtract(quotient, 1), quotient)


def _u32(value: int) -> pa.Scalar:
    # Scalars must be uint32 too, or Arrow widens to int64 and the multiplications stop
    # wrapping modulo 2**32 as MurmurHash3 requires.
    return pa.scalar(value, _U32)


def _rotl32(values: pa.Array, bits: int) -> pa.Array:
    return pc.bit_wise_or(
        pc.shift_left(values, _u32(bits)), pc.shift_right(values, _u32(32 - bits))
    )


def _murmur3_block(h: pa.Array | pa.Scalar, k: pa.Array) -> pa.Array:
    k = pc.multiply(k, _u32(0xCC9E2D51))
    k = _rotl32(k, 15)
    k = pc.multiply(k, _u32(0x1B873593))
    h = _rotl32(pc.bit_wise_xor(h, k), 13)
    return pc.add(pc.multiply(h, _u32(5)), _u32(0xE6546B64))


def _murmur3_long(values: pa.Array) -> pa.Array:
    """MurmurHash3 x86 32-bit (seed 0) of each int64 as 8 little-endian bytes."""
    low = pc.bit_wise_and(values, 0xFFFFFFFF).cast(_U32)
    high = pc.bit_wise_and(pc.shift_right(values, 32), 0xFFFFFFFF).cast(_U32)
    h = _murmur3_block(_u32(0), low)
    h = _murmur3_block(h, high)
    h = pc.bit_wise_xor(h, _u32(8))
    h = pc.bit_wise_xor(h, pc.shift_right(h, _u32(16)))
    h = pc.multiply(h, _u32(0x85EBCA6B))
    h = pc.bit_wise_xor(h, pc.shift_right(h, _u32(13)))
    h = pc.multiply(h, _u32(0xC2B2AE35))
    return pc.bit_wise_xor(h, pc.shift_right(h, _u32(16)))


def _as_long(source: IcebergType, values: pa.Array) -> pa.Array:
    """The int64 that Iceberg hashes for integer-like types (micros for timestamps)."""
    if isinstance(source, (TimestampNanoType, TimestamptzNanoType)):
        return _floor_div(values.cast(pa.int64()), 1_000)
    if isinstance(source, DateType):
        # Arrow casts date32 only to its own storage width.
        return values.cast(pa.int32()).cast(pa.int64())
    return values.cast(pa.int64())


def _by_distinct_values(
    transform: Transform[Any, Any], source: IcebergType, values: pa.Array, result: pa.DataType
) -> pa.Array:
    """Apply pyiceberg's scalar transform once per distinct value, then scatter.

    Used for the variable-width hashes (bucket of string/binary/uuid/decimal) and
    decimal truncation, which pyarrow.compute cannot express; the Python work is per
    distinct value of the flush, not per row.
    """
    if isinstance(values, pa.ExtensionArray):
        # uuid: hash its 16 bytes (what pyiceberg's transform does with a UUID), and
        # extension arrays have no dictionary_encode kernel.
        values = values.storage
    encoded = values.dictionary_encode()
    function = transform.transform(source)
    mapped = pa.array([function(v) for v in encoded.dictionary.to_pylist()], type=result)
    return mapped.take(encoded.indices)


def _bucket(transform: BucketTransform[Any], source: IcebergType, values: pa.Array) -> pa.Array:
    if isinstance(
        source,
        (
            IntegerType,
            LongType,
            DateType,
            TimeType,
            TimestampType,
            TimestamptzType,
            TimestampNanoType,
            TimestamptzNanoType,
        ),
    ):
        hashed = pc.bit_wise_and(
            _murmur3_long(_as_long(source, values)).cast(pa.int64()), 0x7FFFFFFF
        )
        buckets = transform.num_buckets
        bucket = pc.subtract(hashed, pc.multiply(pc.divide(hashed, buckets), buckets))
        return bucket.cast(pa.int32())
    return _by_distinct_values(transform, source, values, pa.int32())


def _truncate(transform: TruncateTransform[Any], source: IcebergType, values: pa.Array) -> pa.Array:
    width = transform.width
    if isinstance(source, (IntegerType, LongType)):
        floored = pc.multiply(_floor_div(values.cast(pa.int64()), width), width)
        # Java computes this in the column's own width, so int overflow wraps there too.
        return floored.cast(values.type, safe=False)
    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        # Iceberg truncates strings to W code points; Arrow's "codeunits" here are code points.
        return pc.utf8_slice_codeunits(values, 0, width)
    if pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type):
        return pc.binary_slice(values, 0, width)
    return _by_distinct_values(transform, source, values, values.type)


def _time(transform: Transform[Any, Any], source: IcebergType, values: pa.Array) -> pa.Array:
    if isinstance(source, DateType):
        raw_days = values.cast(pa.int32()).cast(pa.int64())
        calendar = values
        per_day, per_hour = 1, None
    else:
        unit = values.type.unit
        raw = values.cast(pa.int64())
        # Drop the zone: Iceberg timestamptz values are UTC instants, and Arrow would
        # otherwise extract year/month in the column's zone.
        calendar = raw.cast(pa.timestamp(unit))
        per_second = _UNITS_PER_SECOND[unit]
        raw_days, per_day, per_hour = raw, per_second * 86_400, per_second * 3_600
    if isinstance(transform, YearTransform):
        result = pc.subtract(pc.year(calendar), 1970)
    elif isinstance(transform, MonthTransform):
        years = pc.subtract(pc.year(calendar), 1970)
        result = pc.add(pc.multiply(years, 12), pc.subtract(pc.month(calendar), 1))
    elif isinstance(transform, DayTransform):
        result = _floor_div(raw_days, per_day)
    else:
        assert per_hour is not None  # hour(date) is rejected by can_transform
        result = _floor_div(raw_days, per_hour)
    return result.cast(pa.int32())


def _identity(source: IcebergType, values: pa.Array) -> pa.Array:
    if isinstance(source, DateType):
        return values.cast(pa.int32())
    if isinstance(
        source, (TimeType, TimestampType, TimestamptzType, TimestampNanoType, TimestamptzNanoType)
    ):
        return values.cast(pa.int64())
    if isinstance(source, UUIDType) and isinstance(values, pa.ExtensionArray):
        return values.storage
    return values


def partition_transform(
    transform: Transform[Any, Any], source: IcebergType, values: pa.Array
) -> pa.Array:
    """Apply an Iceberg partition transform to an Arrow array, vectorized.

    Returns partition values in Iceberg's physical representation (int days/hours/
    months/years since epoch, int micros for identity timestamps, bytes for uuid), the
    form manifests store and pyiceberg's ``PartitionKey`` expects.
    """
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(transform, IdentityTransform):
        return _identity(source, values)
    if isinstance(transform, (YearTransform, MonthTransform, DayTransform, HourTransform)):
        return _time(transform, source, values)
    if isinstance(transform, BucketTransform):
        return _bucket(transform, source, values)
    if isinstance(transform, TruncateTransform):
        return _truncate(transform, source, values)
    raise ValueError(f"partition transform {transform} is not supported by the encoder")
