"""Kafka Connect's field schemas in Debezium JSON values: the encodings -> the table's types.

Kafka Connect's JsonConverter with schemas (Debezium's default) sends every value as
``{"schema": ..., "payload": ...}``, and the schema says how each field of ``after``
and ``before`` is spelled in JSON. Debezium's defaults spell several column types in
ways the table's JSON rules do not read:

    org.apache.kafka.connect.data.Decimal     base64 of the unscaled two's-complement
                                              integer; ``scale`` (and
                                              ``connect.decimal.precision``) in the schema
    io.debezium.time.Date, connect Date       int32 days since 1970-01-01
    io.debezium.time.{,Micro,Nano}Timestamp   int64 ms / us / ns since 1970-01-01,
    connect Timestamp (ms)                    wall-clock time without a zone
    io.debezium.time.{,Micro,Nano}Time        ms (int32) / us / ns since midnight
    connect Time (ms)

`ConnectTypes` wraps the JSON envelope decoder: the values' ``schema`` parts are read
(``pyarrow.json``) once per distinct schema text, records grouped by the shape of their
``after`` schema (a fetch usually holds one or two), then per group ONE decode in which
those columns are read as what the JSON holds (string, int32, int64) and converted with
Arrow and numpy to the table's types. Everything else (ZonedTimestamp's ISO text,
plain numbers, strings, booleans) follows the table's JSON rules unchanged. Values that
do not convert (bad base64, a date past 9999, more digits than the column holds) are
dead letters naming the column.

It also says which columns the schemas carry that the table lacks or holds narrower
(`ConnectTypes.wanted`), with exact types, so the source can evolve the table as its
``evolve`` policy allows.
"""

from __future__ import annotations

import decimal
from dataclasses import dataclass, replace
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from icespool.decode._decoded import DeadRecord, RowReader, Rows
from icespool.decode._ndjson import decode_ndjson_lenient
from icespool.decode._plan import JsonOptions
from icespool.decode._records import Binary
from icespool.schema import temporal_bounds

__all__ = ["ConnectField", "ConnectTypes", "decimal_from_base64", "wider"]

DECIMAL: Final = "org.apache.kafka.connect.data.Decimal"
_SCALE: Final = "scale"
_PRECISION: Final = "connect.decimal.precision"
# Logical name -> (what the int holds, its unit).
_EPOCHS: Final[dict[str, tuple[str, str]]] = {
    "io.debezium.time.Date": ("date", "day"),
    "org.apache.kafka.connect.data.Date": ("date", "day"),
    "io.debezium.time.Timestamp": ("timestamp", "ms"),
    "io.debezium.time.MicroTimestamp": ("timestamp", "us"),
    "io.debezium.time.NanoTimestamp": ("timestamp", "ns"),
    "org.apache.kafka.connect.data.Timestamp": ("timestamp", "ms"),
    "io.debezium.time.Time": ("time", "ms"),
    "io.debezium.time.MicroTime": ("time", "us"),
    "io.debezium.time.NanoTime": ("time", "ns"),
    "org.apache.kafka.connect.data.Time": ("time", "ms"),
}
_ZONED: Final = frozenset({"io.debezium.time.ZonedTimestamp"})
# Connect's primitive types -> Arrow (the column a new field becomes).
_PRIMITIVES: Final[dict[str, pa.DataType]] = {
    "int8": pa.int32(),
    "int16": pa.int32(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "boolean": pa.bool_(),
    "string": pa.string(),
    "bytes": pa.binary(),
}
_ENTRY: Final = pa.struct(
    [
        pa.field("field", pa.string()),
        pa.field("type", pa.string()),
        pa.field("name", pa.string()),
        pa.field("parameters", pa.struct([(_SCALE, pa.string()), (_PRECISION, pa.string())])),
    ]
)
#: What is read of each value: ``schema.fields[]`` (before, after, source, ...) and,
#: inside each, its ``fields[]``; the payload and everything else is skipped.
_SCHEMA_ONLY: Final = pa.schema(
    [
        pa.field(
            "schema",
            pa.struct(
                [
                    pa.field(
                        "fields",
                        pa.list_(
                            pa.struct(
                                [
                                    pa.field("field", pa.string()),
                                    pa.field("fields", pa.list_(_ENTRY)),
                                ]
                            )
                        ),
                    )
                ]
            ),
        )
    ]
)
#: The same for Kafka keys, whose schema is the key's row itself.
_KEY_SCHEMA_ONLY: Final = pa.schema(
    [pa.field("schema", pa.struct([pa.field("fields", pa.list_(_ENTRY))]))]
)
_UNIT: Final = "\x1f"  # between the parts of one field's signature
_FIELDS: Final = "\x1e"  # between fields
_ROWS: Final = ("before", "after")  # the envelope's row structs (also inside payload)
_MAX_BASE64: Final = 24  # 16 bytes, the most a decimal128 holds, in base64


@dataclass(frozen=True, slots=True)
class ConnectField:
    """One field of a Connect row schema: its column, Connect type, logical name and,
    for decimals, scale and precision (parameters)."""

    column: str
    type: str
    logical: str | None = None
    scale: int | None = None
    precision: int | None = None

    @property
    def wire(self) -> pa.DataType | None:
        """What the JSON holds when it needs converting here (None: the table's JSON
        rules read it)."""
        if self.logical == DECIMAL and self.type == "bytes":
            return pa.string()
        if self.logical in _EPOCHS and self.type in ("int32", "int64"):
            return pa.int32() if self.type == "int32" else pa.int64()
        return None

    def wire_for(self, target: pa.DataType) -> pa.DataType | None:
        """`wire`, or int64 for an int64 field in a narrower integer column (so a value
        that does not fit is a dead letter naming the column)."""
        if self.wire is not None:
            return self.wire
        if self.type == "int64" and pa.types.is_integer(target) and target.bit_width < 64:
            return pa.int64()
        return None

    @property
    def arrow(self) -> pa.DataType | None:
        """The column type the field becomes in a table (None: none here, e.g. a
        struct or Debezium's VariableScaleDecimal)."""
        if self.logical == DECIMAL and self.scale is not None:
            return pa.decimal128(self.precision or 38, self.scale)
        if self.logical in _EPOCHS:
            kind, _ = _EPOCHS[self.logical]
            if kind == "date":
                return pa.date32()
            return pa.timestamp("us") if kind == "timestamp" else pa.time64("us")
        if self.logical in _ZONED:
            return pa.timestamp("us", tz="UTC")
        # Other logical types (Debezium's Json, Uuid, Enum, Year, Bits...) are their
        # Connect type; structs (VariableScaleDecimal, Geometry...) are no column here.
        return _PRIMITIVES.get(self.type)

    @classmethod
    def parse(cls, text: str) -> ConnectField:
        column, kind, logical, scale, precision = text.split(_UNIT)
        return cls(
            column,
            kind,
            logical or None,
            int(scale) if scale.lstrip("-").isdigit() else None,
            int(precision) if precision.isdigit() else None,
        )


def wider(current: pa.DataType, incoming: pa.DataType) -> bool:
    """``incoming`` is an Iceberg promotion of ``current`` (int -> long, float ->
    double, decimal(P,S) -> decimal(P',S), P' > P)."""
    if pa.types.is_int32(current) and pa.types.is_int64(incoming):
        return True
    if pa.types.is_float32(current) and pa.types.is_float64(incoming):
        return True
    return bool(
        pa.types.is_decimal(current)
        and pa.types.is_decimal(incoming)
        and incoming.scale == current.scale
        and incoming.precision > current.precision
    )


# ------------------------------------------------------------------ the wrapper


class ConnectTypes:
    """An envelope reader (a `RowReader`, for `icespool.decode._keyed`) of Debezium JSON values
    that honours each value's Kafka Connect schema; see the module's doc. ``wanted``:
    after a call, the columns the values' schemas carry that the table (the ``after``
    struct it was called with) lacks or holds narrower, with their types (None: none).
    ``keys``: for Kafka keys instead, whose schema and payload are the key's row (the
    key columns at the top level and in ``payload``)."""

    def __init__(self, inner: RowReader, options: JsonOptions, *, keys: bool = False) -> None:
        self._inner = inner
        self._options = replace(options, ignore_unknown=True)
        self._keys = keys
        self.wanted: pa.Schema | None = None

    def __call__(self, values: Binary, indices: npt.NDArray[np.int64], schema: pa.Schema) -> Rows:
        self.wanted = None
        groups, fields = self._groups(values, indices)
        if self._keys:
            row = pa.struct([f for f in schema if f.name != "payload"])
        else:
            row = schema.field("after").type
            self.wanted = _wanted(fields, row)
        parts: list[tuple[pa.Table, npt.NDArray[np.int64]]] = []
        dead: list[DeadRecord] = []
        for group, at in groups:
            wire = {
                f.column: f
                for f in (fields[group].values() if group >= 0 else ())
                if row.get_field_index(f.column) >= 0
                and f.wire_for(row.field(f.column).type) is not None
            }
            if not wire:
                table, got, bad = self._inner(values, at, schema)
            else:
                read = _wire_schema(schema, wire, keys=self._keys)
                table, got, bad = self._inner(values, at, read)
                if table is not None:
                    table, got, bad = _converted(table, got, bad, schema, wire, keys=self._keys)
            dead += bad
            if table is not None and len(got):
                parts.append((table, got))
        if not parts:
            return None, indices[:0], dead
        if len(parts) == 1:
            return parts[0][0], parts[0][1], dead
        table = pa.concat_tables([t.cast(schema) for t, _ in parts])
        at = np.concatenate([a for _, a in parts])
        order = np.argsort(at, kind="stable")
        return table.take(pa.array(order)), at[order], dead

    def _groups(
        self, values: Binary, indices: npt.NDArray[np.int64]
    ) -> tuple[list[tuple[int, npt.NDArray[np.int64]]], list[dict[str, ConnectField]]]:
        """The records by the shape of their ``after`` schema (group -1: none found,
        the table's JSON rules alone), and each group's fields by column.

        JsonConverter writes ``{"schema":<schema>,"payload":...}``: the schema text up to
        the first ``,"payload":`` is byte-identical for the records of one shape, so only
        the distinct texts are parsed (a fetch has one or two). A value of another layout,
        or whose cut is no JSON (that text held ``,"payload":`` itself), is parsed whole."""
        picked = values.take(pa.array(indices))
        if not len(indices) or not pc.any(pc.match_substring(picked, '"schema"')).as_py():
            return [(-1, indices)], []
        raw = picked.to_pylist()
        cuts = [_schema_text(v) for v in raw]
        texts = list(dict.fromkeys(c for c in cuts if c is not None))
        found, unread = self._signatures([t + b"}" for t in texts])
        read = {t: found[i] for i, t in enumerate(texts) if i not in unread}
        signature: list[str | None] = [None] * len(raw)
        whole: list[int] = []
        for j, cut in enumerate(cuts):
            if cut is not None and cut in read:
                signature[j] = read[cut]
            elif raw[j] is not None and b'"schema"' in raw[j]:
                whole.append(j)
        if whole:
            found, _ = self._signatures([raw[j] for j in whole])
            for j, text in zip(whole, found, strict=True):
                signature[j] = text
        shapes = list(dict.fromkeys(s for s in signature if s))
        code = {text: g for g, text in enumerate(shapes)}
        codes = np.array([code[s] if s else -1 for s in signature], dtype=np.int64)
        fields = [
            {f.column: f for f in (ConnectField.parse(t) for t in text.split(_FIELDS) if t)}
            for text in shapes
        ]
        return [(int(g), indices[codes == g]) for g in np.unique(codes)], fields

    def _signatures(self, lines: list[bytes]) -> tuple[list[str | None], set[int]]:
        """Each JSON value's schema signature (None: it has none) and the values that do
        not read (the envelope decode says what is wrong with them)."""
        out: list[str | None] = [None] * len(lines)
        if not lines:
            return out, set()
        only = _KEY_SCHEMA_ONLY if self._keys else _SCHEMA_ONLY
        result = decode_ndjson_lenient(lines, only, self._options)
        unread = {error.index for error in result.errors}
        if result.table is not None and result.table.num_rows:
            schemas = result.table.column("schema").combine_chunks()
            found = _key_signatures(schemas) if self._keys else _signatures(schemas)
            good = [j for j in range(len(lines)) if j not in unread]
            for j, text in zip(good, found.to_pylist(), strict=True):
                out[j] = text
        return out, unread


_LAYOUT: Final = b'{"schema":'
_CUT: Final = b',"payload":'


def _schema_text(value: bytes | None) -> bytes | None:
    """``{"schema":<schema>`` of a value as JsonConverter lays it out (else None)."""
    if value is None or not value.startswith(_LAYOUT):
        return None
    end = value.find(_CUT)
    return value[:end] if end > 0 else None


def _signatures(schemas: pa.StructArray) -> pa.Array:
    """Per record, the signature of its ``after`` schema's fields (null: none)."""
    n = len(schemas)
    outer = pc.struct_field(schemas, "fields")
    entries = pc.list_flatten(outer)
    parents = pc.list_parent_indices(outer).to_numpy(zero_copy_only=False)
    is_after = pc.fill_null(pc.equal(pc.struct_field(entries, "field"), "after"), False)
    after = pc.struct_field(entries, "fields").filter(is_after)
    records = parents[is_after.to_numpy(zero_copy_only=False)]
    per_after = _joined(after)
    if not len(per_after):
        return pa.nulls(n, pa.string())
    out = np.full(n, -1, dtype=np.int64)
    out[records] = np.arange(len(records))  # a schema has one "after" (the last wins)
    mask = out < 0
    return per_after.take(pa.array(np.where(mask, 0, out), mask=mask))


def _key_signatures(schemas: pa.StructArray) -> pa.Array:
    """Per Kafka key, the signature of its schema's fields (null: none)."""
    return _joined(pc.struct_field(schemas, "fields"))


def _joined(lists: pa.ListArray) -> pa.Array:
    """Each list of field schemas as one signature string (null list: null)."""
    flat = pc.list_flatten(lists)
    params = pc.struct_field(flat, "parameters")
    parts = [
        pc.struct_field(flat, "field"),
        pc.struct_field(flat, "type"),
        pc.struct_field(flat, "name"),
        pc.struct_field(params, _SCALE),
        pc.struct_field(params, _PRECISION),
    ]
    joined = pc.binary_join_element_wise(*[pc.fill_null(p, "") for p in parts], _UNIT)
    lengths = pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    each = pc.binary_join(pa.ListArray.from_arrays(pa.array(offsets), joined), _FIELDS)
    return pc.if_else(pc.is_valid(lists), each, pa.scalar(None, pa.string()))


def _wanted(fields: list[dict[str, ConnectField]], row: pa.StructType) -> pa.Schema | None:
    """Columns the schemas carry that ``row`` lacks or holds narrower."""
    wanted: dict[str, pa.DataType] = {}
    for group in fields:
        for f in group.values():
            arrow = f.arrow
            if arrow is None or f.column in wanted:
                continue
            index = row.get_field_index(f.column)
            if index < 0 or wider(row.field(index).type, arrow):
                wanted[f.column] = arrow
    return pa.schema(list(wanted.items())) if wanted else None


def _wire_schema(schema: pa.Schema, wire: dict[str, ConnectField], *, keys: bool) -> pa.Schema:
    """The envelope schema with ``wire``'s columns (inside before/after, also in the
    payload; ``keys``: at the top level and in the payload) read as what the JSON holds."""
    if keys:
        return pa.schema(
            [
                f.with_type(pa.struct([_wire_field(c, wire) for c in f.type]))
                if f.name == "payload"
                else _wire_field(f, wire)
                for f in schema
            ]
        )

    def rows(field: pa.Field) -> pa.Field:
        if field.name not in _ROWS:
            return field
        return field.with_type(pa.struct([_wire_field(f, wire) for f in field.type]))

    out = []
    for field in schema:
        if field.name == "payload":
            field = field.with_type(pa.struct([rows(f) for f in field.type]))
        out.append(rows(field))
    return pa.schema(out)


def _wire_field(field: pa.Field, wire: dict[str, ConnectField]) -> pa.Field:
    found = wire.get(field.name)
    read = found.wire_for(field.type) if found is not None else None
    return field if read is None else field.with_type(read)


# ------------------------------------------------------------------ conversion


@dataclass(slots=True)
class _Failures:
    """Rows (positions in the decoded table) that did not convert: the first failure
    of each, as (column, reason, problem)."""

    rows: dict[int, tuple[str, str, str]]

    def add(self, mask: npt.NDArray[np.bool_], column: str, reason: str, problem: str) -> None:
        for j in np.flatnonzero(mask):
            self.rows.setdefault(int(j), (column, reason, problem))


def _converted(
    table: pa.Table,
    at: npt.NDArray[np.int64],
    dead: list[DeadRecord],
    schema: pa.Schema,
    wire: dict[str, ConnectField],
    *,
    keys: bool,
) -> Rows:
    """``table`` (read with `_wire_schema`) in ``schema``'s types; records whose values
    do not convert become dead letters."""
    failures = _Failures({})
    columns = []
    for field in schema:
        values = table.column(field.name).combine_chunks()
        if keys and field.name == "payload":
            values = _struct(values, field.type, wire, failures, "payload")
        elif keys:
            if field.name in wire:
                values = _leaf(values, field.type, wire[field.name], failures, field.name)
        elif field.name == "payload":
            values = _struct(values, field.type, wire, failures, "payload", nested=True)
        elif field.name in _ROWS:
            values = _struct(values, field.type, wire, failures, field.name)
        columns.append(values)
    out = pa.Table.from_arrays(columns, schema=schema)
    if not failures.rows:
        return out, at, dead
    bad = np.zeros(len(at), dtype=bool)
    for j, (column, reason, problem) in failures.rows.items():
        bad[j] = True
        dead.append(DeadRecord(int(at[j]), reason, f"column {column!r}: {problem}", column))
    return out.filter(pa.array(~bad)), at[~bad], dead


def _struct(
    values: pa.StructArray,
    target: pa.StructType,
    wire: dict[str, ConnectField],
    failures: _Failures,
    path: str,
    *,
    nested: bool = False,
) -> pa.StructArray:
    """A row struct (``path``: where, e.g. ``payload.after``; the envelope's decode
    names columns so) with ``wire``'s columns converted; ``nested``: the payload."""
    children = []
    for field, child in zip(target, values.flatten(), strict=True):
        where = f"{path}.{field.name}"
        if nested and field.name in _ROWS:
            child = _struct(child, field.type, wire, failures, where)
        elif not nested and field.name in wire:
            child = _leaf(child, field.type, wire[field.name], failures, where)
        children.append(child)
    mask = values.is_null() if values.null_count else None
    return pa.StructArray.from_arrays(children, fields=list(target), mask=mask)


def _leaf(
    values: pa.Array, target: pa.DataType, field: ConnectField, failures: _Failures, path: str
) -> pa.Array:
    """One column's JSON values (``field.wire``) -> ``target``; failed rows become null
    and are recorded."""
    if field.logical == DECIMAL:
        scale = field.scale if field.scale is not None else 0
        converted, bad = decimal_from_base64(values, scale)
        if bad.any():
            failures.add(
                bad,
                path,
                "invalid",
                f"expected a Kafka Connect Decimal (base64 of at most 16 bytes, scale "
                f"{scale}), got {_shown(values, bad)}",
            )
        what = f"decimal with scale {scale} (Kafka Connect Decimal)"
    elif field.logical in _EPOCHS:
        kind, unit = _EPOCHS[field.logical]
        converted = _epoch(values, kind, unit)
        what = f"{kind} as {unit}s since 1970-01-01 ({field.logical})"
    else:  # an int64 for a narrower integer column
        converted, what = values, f"Kafka Connect {field.type}"
    return _cast(converted, values, target, path, what, failures)


def _cast(
    values: pa.Array,
    raw: pa.Array,
    target: pa.DataType,
    column: str,
    what: str,
    failures: _Failures,
) -> pa.Array:
    """``values`` cast to ``target``, checked (digits, lost precision, range); rows that
    fail are recorded, nulled, the rest cast."""
    bad = np.zeros(len(values), dtype=bool)
    if pa.types.is_decimal(target) and pa.types.is_decimal(values.type):
        # At most P digits at the column's scale (Arrow's cast would also refuse them,
        # but for the whole array at once).
        wide = pa.decimal256(76, max(values.type.scale, target.scale))
        limit = pa.scalar(decimal.Decimal(10) ** (target.precision - target.scale), wide)
        magnitude = pc.abs(pc.cast(values, wide))
        bad |= pc.fill_null(pc.greater_equal(magnitude, limit), False).to_numpy(
            zero_copy_only=False
        )
    try:
        cast = pc.cast(_nulled(values, bad), target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        # The failure path: the rows that do not cast, one by one.
        for j in np.flatnonzero(pc.is_valid(values).to_numpy(zero_copy_only=False) & ~bad):
            try:
                pc.cast(values.slice(int(j), 1), target)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                bad[j] = True
        cast = pc.cast(_nulled(values, bad), target)
    bounds = temporal_bounds(target)
    if bounds is not None:
        low, high, _ = bounds
        ints = pa.int64() if target.bit_width == 64 else pa.int32()
        storage = pc.fill_null(cast.view(ints), 0).to_numpy(zero_copy_only=False)
        valid = pc.is_valid(cast).to_numpy(zero_copy_only=False)
        outside = valid & ((storage < low) | (storage > high))
        if outside.any():
            failures.add(
                outside,
                column,
                "out_of_range",
                f"{_shown(raw, outside)} ({what}) is out of range: the column holds {bounds[2]}",
            )
            bad |= outside
            cast = _nulled(cast, outside)
    if bad.any():
        failures.add(
            bad,
            column,
            "out_of_range",
            f"{_shown(values, bad)} ({what}) does not fit the column ({target})"
            if pa.types.is_decimal(values.type)
            else f"{_shown(raw, bad)} ({what}) does not fit the column ({target})",
        )
    return cast


def _nulled(values: pa.Array, mask: npt.NDArray[np.bool_]) -> pa.Array:
    if not mask.any():
        return values
    return pc.if_else(pa.array(mask), pa.scalar(None, values.type), values)


def _shown(values: pa.Array, mask: npt.NDArray[np.bool_]) -> str:
    first = values[int(np.flatnonzero(mask)[0])].as_py()
    text = repr(first) if isinstance(first, str) else str(first)
    return text if len(text) <= 80 else text[:77] + "..."


def _epoch(values: pa.Array, kind: str, unit: str) -> pa.Array:
    """Epoch integers as the Arrow type of that unit (exact: no scaling yet)."""
    if kind == "date":
        return pc.cast(pc.cast(values, pa.int32()), pa.date32())
    if kind == "timestamp":
        return pc.cast(pc.cast(values, pa.int64()), pa.timestamp(unit))
    if unit == "ms":
        return pc.cast(pc.cast(values, pa.int32()), pa.time32("ms"))
    return pc.cast(pc.cast(values, pa.int64()), pa.time64(unit))


# ------------------------------------------------------------------ base64 decimals

_ALPHABET: Final = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_CODES: Final = np.full(256, 255, dtype=np.uint8)
_CODES[np.frombuffer(_ALPHABET, dtype=np.uint8)] = np.arange(64, dtype=np.uint8)
_PAD: Final = 64
_CODES[ord("=")] = _PAD


def decimal_from_base64(values: pa.Array, scale: int) -> tuple[pa.Array, npt.NDArray[np.bool_]]:
    """Kafka Connect Decimals (base64 text of a big-endian two's-complement unscaled
    integer, as Java's ``BigInteger.toByteArray``) -> decimal128(38, ``scale``), all at
    once in numpy; and the rows that are not such text (null in the result) or hold
    more than 16 bytes."""
    strings = values.cast(pa.string())
    n = len(strings)
    valid = pc.is_valid(strings).to_numpy(zero_copy_only=False)
    offsets = np.frombuffer(strings.buffers()[1], dtype=np.int32)[
        strings.offset : strings.offset + n + 1
    ].astype(np.int64)
    buffer = strings.buffers()[2]
    data = np.frombuffer(buffer, dtype=np.uint8) if buffer is not None else np.empty(0, np.uint8)
    lengths = offsets[1:] - offsets[:-1]
    bad = valid & ((lengths == 0) | (lengths % 4 != 0) | (lengths > _MAX_BASE64))
    ok = valid & ~bad
    column = np.arange(_MAX_BASE64)
    inside = (column[None, :] < lengths[:, None]) & ok[:, None]
    codes = np.zeros((n, _MAX_BASE64), dtype=np.uint8)
    where = (offsets[:-1, None] + column[None, :])[inside]
    codes[inside] = _CODES[data[where]]
    pad = codes == _PAD
    pads = pad.sum(axis=1)
    # "=" only as the last one or two characters.
    tail = column[None, :] >= (lengths - pads)[:, None]
    bad |= ok & (((codes == 255) & inside).any(axis=1) | (pads > 2) | (pad & ~tail).any(axis=1))
    codes[pad | (codes == 255)] = 0
    quads = codes.reshape(n, _MAX_BASE64 // 4, 4).astype(np.uint32)
    triples = (quads[..., 0] << 18) | (quads[..., 1] << 12) | (quads[..., 2] << 6) | quads[..., 3]
    raw = np.stack([(triples >> 16) & 0xFF, (triples >> 8) & 0xFF, triples & 0xFF], axis=-1)
    raw = raw.reshape(n, _MAX_BASE64 // 4 * 3).astype(np.uint8)
    sizes = lengths // 4 * 3 - pads
    bad |= ok & ((sizes <= 0) | (sizes > 16))
    good = valid & ~bad
    # Right-aligned in 16 big-endian bytes, sign-extended, then little-endian.
    negative = raw[:, 0] >= 0x80
    wide = np.where(negative[:, None], np.uint8(0xFF), np.uint8(0)).astype(np.uint8)
    wide = np.broadcast_to(wide, (n, 16)).copy()
    byte = np.arange(raw.shape[1])
    target = (16 - sizes)[:, None] + byte[None, :]
    take = (byte[None, :] < sizes[:, None]) & good[:, None]
    rows = np.broadcast_to(np.arange(n)[:, None], take.shape)
    wide[rows[take], target[take]] = raw[take]
    wide[~good] = 0
    little = np.ascontiguousarray(wide[:, ::-1])
    array = pa.Array.from_buffers(
        pa.decimal128(38, scale), n, [None, pa.py_buffer(little.tobytes())]
    )
    return _nulled(array, ~good), bad
