"""Converters: what pyarrow.json parsed (``_Column.parse_type``) -> the column's type.

A converter is vectorized; on a failure it finds the first bad value (per value, on
the failure path only) and raises `_RowError` with its record index, or -1 inside a
nested value, whose record `icespool.decode._locate` finds by bisection.
"""

from __future__ import annotations

import base64
import binascii
import decimal
import json
import uuid
from collections.abc import Callable
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc

_SHOWN_VALUE_CHARS: Final = 60
_UNIX_DAY: Final = "1970-01-01T"

Converter = Callable[[pa.ChunkedArray], pa.Array | pa.ChunkedArray]


class _RowError(Exception):
    """A converted column failed at ``row`` (0-based record index; -1: inside a nested
    value, record unknown). ``problem`` replaces the generic "expected ..." message."""

    def __init__(
        self, row: int, value: object, problem: str | None = None, column: str | None = None
    ) -> None:
        self.row = row
        self.value = value
        self.problem = problem
        self.column = column  # nested path at fault, when deeper than the column
        super().__init__(row, value)


class _Raw(str):
    """A value shown as it is (a decimal's digits), not as a JSON string."""


def _show(value: object) -> str:
    text = str(value) if isinstance(value, _Raw) else json.dumps(value, ensure_ascii=True)
    if len(text) > _SHOWN_VALUE_CHARS:
        text = text[: _SHOWN_VALUE_CHARS - 3] + "..."
    return text


def _combined(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def _struct_converter(t: pa.StructType, converts: list[Converter | None]) -> Converter:
    def convert(values: pa.Array | pa.ChunkedArray) -> pa.Array:
        array = _combined(values)
        children = []
        for index, child_convert in enumerate(converts):
            child = array.field(index)
            children.append(_combined(child_convert(child)) if child_convert else child)
        names = [f.name for f in t.fields]
        mask = array.is_null() if array.null_count else None
        return pa.StructArray.from_arrays(children, names=names, mask=mask)

    return _nested(convert)


def _list_converter(t: pa.DataType, element: Converter) -> Converter:
    def convert(values: pa.Array | pa.ChunkedArray) -> pa.Array:
        array = _combined(values)
        mask = array.is_null() if array.null_count else None
        return pa.ListArray.from_arrays(array.offsets, _combined(element(array.values)), mask=mask)

    return _nested(convert)


def _map_converter(path: str, key: Converter | None, item: Converter | None) -> Converter:
    def convert(values: pa.Array | pa.ChunkedArray) -> pa.Array:
        array = _combined(values)
        entries = array.values
        keys = entries.field(0)
        if keys.null_count:
            raise _RowError(-1, None, "a map key is missing or null", f"{path}.key")
        keys = _combined(key(keys)) if key else keys
        items = entries.field(1)
        items = _combined(item(items)) if item else items
        mask = array.is_null() if array.null_count else None
        return pa.MapArray.from_arrays(array.offsets, keys, items, mask=mask)

    return _nested(convert)


def _nested(convert: Callable[[pa.Array | pa.ChunkedArray], pa.Array]) -> Converter:
    # Rows of a nested value's children are not records: a failure inside is
    # reported with row -1, and the caller finds the record by bisection.
    def run(values: pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
        try:
            return convert(values)
        except _RowError as exc:
            raise _RowError(-1, exc.value, exc.problem, exc.column) from None

    return run


def _decimal_range(t: pa.Decimal128Type) -> Converter:
    # pyarrow 26 checks the precision of the text as written, then rescales: 1234.5
    # passes as decimal(5,2) and becomes 1234.50, six digits. Check the magnitude,
    # at every precision: "1e28" into decimal(38,10) becomes 10^38 unscaled, 39
    # digits, which decimal128 still holds (up to ~1.7e38) but the column cannot.
    # decimal256 holds every such value and the limit 10^(P-S) itself.
    wide = pa.decimal256(76, t.scale)
    limit = pa.scalar(decimal.Decimal(10) ** (t.precision - t.scale), wide)

    def convert(values: pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
        too_big = pc.greater_equal(pc.abs(pc.cast(values, wide)), limit)
        if pc.any(too_big).as_py():
            row = pc.index(too_big, True).as_py()
            raise _RowError(row, _Raw(values[row].as_py()))
        return values

    return convert


def _epoch(target: pa.TimestampType, unit: str) -> Converter:
    per_second = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}
    source, wanted = per_second[unit], per_second[target.unit]

    def to_stamp(values: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
        if wanted >= source:
            scaled = pc.multiply_checked(values, wanted // source)
        else:
            divisor = source // wanted
            scaled = pc.divide(values, divisor)
            exact = pc.all(pc.equal(pc.multiply(scaled, divisor), values)).as_py()
            if exact is False:
                raise pa.ArrowInvalid(
                    f"the column stores {target.unit}; finer digits would be lost"
                )
        return pc.cast(scaled, target)

    def convert(values: pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
        try:
            return to_stamp(values)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise _first_failure(values, lambda v: to_stamp(pa.array([v], pa.int64()))) from exc

    return convert


def _cast_text(target: pa.DataType) -> Converter:
    def convert(values: pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
        try:
            return pc.cast(values, target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise _first_failure(values, lambda v: pc.cast(pa.array([v]), target)) from exc

    return convert


def _time_of_day(target: pa.DataType) -> Converter:
    # Arrow has no string -> time cast; a time is the time of day of a naive
    # timestamp on 1970-01-01, and that cast refuses offsets for free.
    stamp = pa.timestamp(target.unit)

    def to_time(values: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
        text = pc.binary_join_element_wise(_UNIX_DAY, values, "")
        return pc.cast(pc.cast(text, stamp), target)

    def convert(values: pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
        try:
            return to_time(values)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise _first_failure(values, lambda v: to_time(pa.array([v], pa.string()))) from exc

    return convert


def _per_value(target: pa.DataType, one: Callable[[str], bytes]) -> Converter:
    storage = target.storage_type if isinstance(target, pa.BaseExtensionType) else target

    def convert(values: pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
        out: list[bytes | None] = []
        for row, value in enumerate(values.to_pylist()):
            if value is None:
                out.append(None)
                continue
            try:
                out.append(one(value))
            except ValueError as exc:
                raise _RowError(row, value) from exc
        array = pa.array(out, storage)
        if isinstance(target, pa.BaseExtensionType):
            return pa.ExtensionArray.from_storage(target, array)
        return array

    return convert


def _uuid_bytes(text: str) -> bytes:
    return uuid.UUID(text).bytes


def _base64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except binascii.Error as exc:
        raise ValueError(str(exc)) from exc


def _base64_fixed(width: int, text: str) -> bytes:
    data = _base64(text)
    if len(data) != width:
        raise ValueError(f"{len(data)} bytes, not {width}")
    return data


def _first_failure(values: pa.ChunkedArray, attempt: Callable[[Any], object]) -> _RowError:
    """The first row whose value fails ``attempt`` (failure path only: per value)."""
    for row, value in enumerate(values.to_pylist()):
        if value is None:
            continue
        try:
            attempt(value)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
            return _RowError(row, value)
    return _RowError(-1, None)


# ------------------------------------------------------------------ after the parse
