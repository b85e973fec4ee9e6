"""The decode plan: per column, what pyarrow.json is asked to parse and how that is
converted to the table's type (cached per schema and `JsonOptions`)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa

from icespool.decode._convert import (
    Converter,
    _base64,
    _base64_fixed,
    _cast_text,
    _decimal_range,
    _epoch,
    _list_converter,
    _map_converter,
    _per_value,
    _RowError,
    _show,
    _struct_converter,
    _time_of_day,
    _uuid_bytes,
)
from icespool.decode._nesting import DEFAULT_MAX_DEPTH


@dataclass(frozen=True, slots=True)
class _Column:
    name: str
    target: pa.DataType
    parse_type: pa.DataType  # what pyarrow.json is asked to produce
    convert: Converter | None  # parse_type -> target; None when they are equal
    required: bool
    expected: str  # for error messages: "expected <this>"
    nested: bool  # struct, list or map: converted arrays are cast to the target at the end


@dataclass(frozen=True, slots=True)
class _Plan:
    columns: tuple[_Column, ...]
    parse_schema: pa.Schema
    by_name: dict[str, _Column]
    duals: frozenset[str]  # timestamp paths that take epoch numbers or ISO text
    numbers: frozenset[str]  # ... of which this plan parses these as numbers


# ------------------------------------------------------------------ public API

_UNITS: Final = ("s", "ms", "us", "ns")


@dataclass(frozen=True, slots=True)
class JsonOptions:
    """How JSON values map to a table's columns beyond the fixed rules.

    ``timestamp_unit`` (``s``, ``ms``, ``us``, ``ns``) lets timestamp columns take
    epoch numbers in that unit besides ISO-8601 text; ``column_units`` overrides it
    per top-level column (and the timestamps nested in that column).
    ``max_depth`` bounds how deeply a record may nest (``max_nesting_depth``).
    ``ignore_unknown``: fields the schema lacks are skipped instead of failing the
    record (an envelope such as Debezium's carries fields no table wants).
    Hashable, so decode plans are cached per (schema, options).
    """

    timestamp_unit: str | None = None
    column_units: tuple[tuple[str, str], ...] = ()
    max_depth: int = DEFAULT_MAX_DEPTH
    ignore_unknown: bool = False

    def __post_init__(self) -> None:
        if self.max_depth < 1:
            raise ValueError(f"max_depth {self.max_depth}: use 1 or more")
        for unit in (self.timestamp_unit, *(u for _, u in self.column_units)):
            if unit is not None and unit not in _UNITS:
                raise ValueError(f"timestamp unit {unit!r}: use one of {', '.join(_UNITS)}")

    def unit_for(self, column: str) -> str | None:
        for name, unit in self.column_units:
            if name == column:
                return unit
        return self.timestamp_unit

    @classmethod
    def for_table(cls, table: Any, max_depth: int = DEFAULT_MAX_DEPTH) -> JsonOptions:
        """Options from a ``TableConfig`` (its ``timestamp_unit`` and its columns')
        and its effective ``max_nesting_depth``."""
        columns = getattr(table, "columns", None) or ()
        return cls(
            getattr(table, "timestamp_unit", None),
            tuple(
                (c.name, c.timestamp_unit)
                for c in columns
                if getattr(c, "timestamp_unit", None) is not None
            ),
            max_depth,
        )


_DEFAULT_OPTIONS: Final = JsonOptions()


@functools.lru_cache(maxsize=64)
def _plan(schema: pa.Schema, options: JsonOptions, numbers: frozenset[str] | None) -> _Plan:
    duals: set[str] = set()
    columns = tuple(
        _column(field, options.unit_for(field.name), numbers, duals) for field in schema
    )
    parse_schema = pa.schema([pa.field(c.name, c.parse_type) for c in columns])
    chosen = frozenset(duals) if numbers is None else numbers & frozenset(duals)
    if numbers is None and duals:
        # First sight: a unit was configured, so numbers are the likely spelling.
        return _plan(schema, options, chosen)
    return _Plan(columns, parse_schema, {c.name: c for c in columns}, frozenset(duals), chosen)


def _column(
    field: pa.Field, unit: str | None, numbers: frozenset[str] | None, duals: set[str]
) -> _Column:
    node = _node(field.type, f"/{field.name}", unit, numbers, duals)
    return _Column(
        field.name,
        field.type,
        node.parse_type,
        node.convert,
        not field.nullable,
        node.expected,
        pa.types.is_nested(field.type),
    )


@dataclass(frozen=True, slots=True)
class _Node:
    parse_type: pa.DataType
    convert: Converter | None
    expected: str


def _node(
    t: pa.DataType,
    path: str,
    unit: str | None,
    numbers: frozenset[str] | None,
    duals: set[str],
    dotted: str = "",
) -> _Node:
    """How pyarrow.json reads one (possibly nested) type and converts it to ``t``.

    ``path`` is pyarrow's spelling of the JSON location (``/col/field/[]``), which its
    kind-mismatch errors quote; ``dotted`` is the Iceberg column path for messages.
    """
    dotted = dotted or path.strip("/")
    if pa.types.is_struct(t):
        children = [
            _node(f.type, f"{path}/{f.name}", unit, numbers, duals, f"{dotted}.{f.name}")
            for f in t.fields
        ]
        parse = pa.struct(
            [pa.field(f.name, c.parse_type) for f, c in zip(t.fields, children, strict=True)]
        )
        convert = None
        if any(c.convert is not None for c in children):
            convert = _struct_converter(t, [c.convert for c in children])
        return _Node(parse, convert, f"a JSON object {_render(t)}")
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        element = _node(t.value_type, f"{path}/[]", unit, numbers, duals, f"{dotted}.element")
        convert = None if element.convert is None else _list_converter(t, element.convert)
        return _Node(pa.list_(element.parse_type), convert, f"a JSON array {_render(t)}")
    if pa.types.is_map(t):
        key = _node(t.key_type, f"{path}/[]/key", unit, numbers, duals, f"{dotted}.key")
        item = _node(t.item_type, f"{path}/[]/value", unit, numbers, duals, f"{dotted}.value")
        parse = pa.list_(pa.struct([("key", key.parse_type), ("value", item.parse_type)]))
        return _Node(
            parse,
            _map_converter(dotted, key.convert, item.convert),
            f'a JSON array of {{"key": ..., "value": ...}} objects {_render(t)}',
        )
    leaf = _leaf(t)
    if pa.types.is_timestamp(t) and unit is not None:
        duals.add(path)
        if numbers is None or path in numbers:
            leaf = _Node(
                pa.int64(),
                _epoch(t, unit),
                f"an integer epoch in {unit} or an ISO-8601 timestamp string",
            )
    if path.count("/") > 1 and leaf.convert is not None:
        leaf = _Node(leaf.parse_type, _inner(dotted, leaf), leaf.expected)
    return leaf


def _inner(column: str, leaf: _Node) -> Converter:
    assert leaf.convert is not None
    convert = leaf.convert

    def run(values: pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
        try:
            return convert(values)
        except _RowError as exc:
            raise _RowError(
                -1, exc.value, f"expected {leaf.expected}, got {_show(exc.value)}", column
            ) from None

    return run


def _render(t: pa.DataType) -> str:
    return f"({t})"


def _leaf(t: pa.DataType) -> _Node:
    def col(parse: pa.DataType, convert: Converter | None, expected: str) -> _Node:
        return _Node(parse, convert, expected)

    if pa.types.is_boolean(t):
        return col(t, None, "true or false")
    if pa.types.is_integer(t):
        info = _int_range(t)
        return col(t, None, f"an integer from {info[0]} to {info[1]}")
    if pa.types.is_floating(t):
        return col(t, None, "a number")
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return col(t, None, "a string")
    if pa.types.is_decimal(t):
        # pyarrow.json converts the number's own text (or the string), never via a
        # double, so 0.1 and 38-digit values stay exact.
        return col(
            t,
            _decimal_range(t),
            f"a decimal (number or string) with at most {t.precision - t.scale} integer "
            f"and {t.scale} fractional digits",
        )
    if pa.types.is_timestamp(t) and t.tz is not None:
        return col(
            t,
            None,
            'an ISO-8601 timestamp string such as "2024-05-01T12:00:00Z" or '
            f'"2024-05-01T14:00:00.5+02:00" (no offset means UTC; at most {_digits(t)} '
            "fractional digits)",
        )
    if pa.types.is_timestamp(t):
        return col(
            pa.string(),
            _cast_text(t),
            'an ISO-8601 timestamp string WITHOUT offset such as "2024-05-01T12:00:00" '
            f"(the column has no time zone; at most {_digits(t)} fractional digits)",
        )
    if pa.types.is_date(t):
        return col(pa.string(), _cast_text(t), 'a date string "YYYY-MM-DD"')
    if pa.types.is_time(t):
        return col(pa.string(), _time_of_day(t), 'a time string "HH:MM:SS[.ffffff]"')
    if isinstance(t, pa.BaseExtensionType) and t.extension_name == "arrow.uuid":
        return col(pa.string(), _per_value(t, _uuid_bytes), "a UUID string")
    if pa.types.is_fixed_size_binary(t):
        width = t.byte_width
        return col(
            pa.string(),
            _per_value(t, functools.partial(_base64_fixed, width)),
            f"a base64 string of exactly {width} bytes",
        )
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return col(pa.string(), _per_value(t, _base64), "a base64 string")
    # Anything newer than this list: let Arrow's own string cast try.
    return col(pa.string(), _cast_text(t), f"a string convertible to {t}")


def _int_range(t: pa.DataType) -> tuple[int, int]:
    bits = t.bit_width
    if pa.types.is_signed_integer(t):
        return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    return 0, 2**bits - 1


def _digits(t: pa.TimestampType) -> int:
    return {"s": 0, "ms": 3, "us": 6, "ns": 9}[t.unit]
