"""Protobuf messages -> Arrow columns in the table's types, and a message's own Arrow schema.

The message descriptor decides, once per (schema, message, table), how each column
converts (`batch_builder`). Values are then read a field at a time over all messages
(``[m.f for m in messages]``, one C attribute read each) into ``pa.array``, nested
messages, lists and maps rebuilt from their flattened children, and cast to the
table's types with Arrow's checked casts. Only enums (a name per number), the
well-known message types and uuids convert value by value in Python.

Type mapping (the natural type before the cast to the column's):

    bool -> boolean; int32, sint32, sfixed32 -> int; int64, sint64, sfixed64, uint32,
    fixed32, uint64, fixed64 -> long (a uint64 past 2^63 - 1 does not fit: invalid);
    float -> float; double -> double; string -> string; bytes -> binary; enum -> string
    (the value's name; a number the schema does not name, its digits); message ->
    struct; repeated -> list; map -> map; google.protobuf.Timestamp -> timestamptz;
    Duration -> long (microseconds); wrappers (Int64Value, StringValue, ...) -> their
    scalar, null when unset; Struct, Value, ListValue -> string (their JSON text).

A scalar field without presence (proto3 without ``optional``) reads as its default
when unset, as every Protobuf reader does; one with presence (``optional``, a oneof
member, proto2), a message and a wrapper are null when unset; a repeated field or map
is an empty list or map.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any, Final

import numpy as np
import pyarrow as pa
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from icespool.errors import BadInputError, SchemaError
from icespool.schema import cast_array, conform, find_out_of_range

__all__ = ["CONVERSION_ERRORS", "batch_builder", "message_schema"]

#: What a conversion of values that do not fit raises.
CONVERSION_ERRORS: Final = (BadInputError, pa.ArrowException, ValueError, TypeError, OverflowError)

Convert = Callable[[list[Any]], pa.Array]

_F = FieldDescriptor
_SCALARS: Final[dict[int, pa.DataType]] = {
    _F.TYPE_BOOL: pa.bool_(),
    _F.TYPE_INT32: pa.int32(),
    _F.TYPE_SINT32: pa.int32(),
    _F.TYPE_SFIXED32: pa.int32(),
    _F.TYPE_INT64: pa.int64(),
    _F.TYPE_SINT64: pa.int64(),
    _F.TYPE_SFIXED64: pa.int64(),
    _F.TYPE_UINT32: pa.int64(),
    _F.TYPE_FIXED32: pa.int64(),
    _F.TYPE_UINT64: pa.int64(),
    _F.TYPE_FIXED64: pa.int64(),
    _F.TYPE_FLOAT: pa.float32(),
    _F.TYPE_DOUBLE: pa.float64(),
    _F.TYPE_STRING: pa.string(),
    _F.TYPE_BYTES: pa.binary(),
    _F.TYPE_ENUM: pa.string(),
}
_WRAPPERS: Final[dict[str, pa.DataType]] = {
    "google.protobuf.BoolValue": pa.bool_(),
    "google.protobuf.Int32Value": pa.int32(),
    "google.protobuf.Int64Value": pa.int64(),
    "google.protobuf.UInt32Value": pa.int64(),
    "google.protobuf.UInt64Value": pa.int64(),
    "google.protobuf.FloatValue": pa.float32(),
    "google.protobuf.DoubleValue": pa.float64(),
    "google.protobuf.StringValue": pa.string(),
    "google.protobuf.BytesValue": pa.binary(),
}
_TIMESTAMP: Final = "google.protobuf.Timestamp"
_DURATION: Final = "google.protobuf.Duration"
_JSON_TYPES: Final = frozenset(
    {"google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue"}
)
_MICROS: Final = pa.timestamp("us", "UTC")
_TYPE_NAMES: Final[dict[int, str]] = {
    number: name.removeprefix("TYPE_").lower()
    for name, number in vars(_F).items()
    if name.startswith("TYPE_")
}


def _is_map(f: FieldDescriptor) -> bool:
    return bool(
        f.type == _F.TYPE_MESSAGE and f.is_repeated and f.message_type.GetOptions().map_entry
    )


def _special(name: str) -> pa.DataType | None:
    """The natural type of a well-known message type; None for other messages."""
    if name == _TIMESTAMP:
        return _MICROS
    if name == _DURATION:
        return pa.int64()
    if name in _JSON_TYPES:
        return pa.string()
    return _WRAPPERS.get(name)


# ------------------------------------------------------------------ the message's own schema


def message_schema(descriptor: Descriptor, max_depth: int) -> pa.Schema:
    """The Arrow schema a table gets for ``descriptor``'s messages (every column
    optional); SchemaError when it nests deeper than ``max_depth`` (or is recursive)."""
    return pa.schema(_fields(descriptor, max_depth - 1, ""))


def _fields(descriptor: Descriptor, left: int, prefix: str) -> list[pa.Field]:
    return [pa.field(f.name, _field_type(f, left, prefix + f.name)) for f in descriptor.fields]


def _field_type(f: FieldDescriptor, left: int, path: str) -> pa.DataType:
    if _is_map(f):
        entry = f.message_type
        key = _value_type(entry.fields_by_name["key"], left - 1, f"{path}.key")
        item = _value_type(entry.fields_by_name["value"], left - 1, f"{path}.value")
        return pa.map_(key, item)
    if f.is_repeated:
        return pa.list_(_value_type(f, left - 1, f"{path}.element"))
    return _value_type(f, left, path)


def _value_type(f: FieldDescriptor, left: int, path: str) -> pa.DataType:
    if left < 0:
        raise _too_deep(path)
    if f.type in (_F.TYPE_MESSAGE, _F.TYPE_GROUP):
        special = _special(f.message_type.full_name)
        if special is not None:
            return special
        return pa.struct(_fields(f.message_type, left - 1, f"{path}."))
    return _SCALARS[f.type]


def _too_deep(path: str) -> SchemaError:
    return SchemaError(
        path, "the Protobuf message nests deeper than max_nesting_depth (or is recursive)"
    ).because("too_deep")


# ------------------------------------------------------------------ messages -> a batch


def batch_builder(
    descriptor: Descriptor, value_schema: pa.Schema, max_depth: int
) -> Callable[[list[Any]], pa.RecordBatch]:
    """messages -> a batch in ``value_schema``; SchemaError when the message type cannot
    fit the table at all (then no message of it can)."""
    fields = descriptor.fields_by_name
    for name in fields:
        if value_schema.get_field_index(name) < 0:
            raise SchemaError(name, "Protobuf field is not a column of the table")
    columns: list[tuple[Callable[[list[Any]], list[Any]], Convert] | pa.DataType] = []
    for target in value_schema:
        if target.name in fields:
            f = fields[target.name]
            # The message itself is the first level, as a JSON object is.
            columns.append((_getter(f), _converter(f, target.type, target.name, max_depth - 1)))
        elif not target.nullable:
            raise SchemaError(target.name, "required column is missing from the Protobuf message")
        else:
            columns.append(target.type)

    def build(messages: list[Any]) -> pa.RecordBatch:
        arrays = [
            pa.nulls(len(messages), column)
            if isinstance(column, pa.DataType)
            else column[1](column[0](messages))
            for column in columns
        ]
        batch = conform(pa.RecordBatch.from_arrays(arrays, schema=value_schema), value_schema)
        for name, values in zip(batch.schema.names, batch.columns, strict=True):
            found = find_out_of_range(values)
            if found is not None:
                raise SchemaError(found.column(name), found.problem).because("out_of_range")
        return batch

    return build


def _getter(f: FieldDescriptor) -> Callable[[list[Any]], list[Any]]:
    """A field's values of some messages (None for a message that is None, or, for a
    field with presence, that does not have it)."""
    name = f.name
    if f.has_presence and not f.is_repeated:
        return lambda ms: [
            None if m is None or not m.HasField(name) else getattr(m, name) for m in ms
        ]
    return lambda ms: [None if m is None else getattr(m, name) for m in ms]


def _converter(f: FieldDescriptor, target: pa.DataType, path: str, left: int) -> Convert:
    """``left``: how many more levels the message may nest (max_nesting_depth)."""
    if left < 0:
        raise _too_deep(path)
    if _is_map(f):
        return _map(f, target, path, left - 1)
    if f.is_repeated:
        return _list(f, target, path, left - 1)
    return _single(f, target, path, left)


def _single(f: FieldDescriptor, target: pa.DataType, path: str, left: int) -> Convert:
    """A value that is not repeated (a list element or map value too)."""
    if f.type in (_F.TYPE_MESSAGE, _F.TYPE_GROUP):
        name = f.message_type.full_name
        if _special(name) is None:
            return _struct(f.message_type, target, path, left - 1)
        return _checked(path, name, _well_known(name), target)
    natural = _SCALARS[f.type]
    if isinstance(target, pa.BaseExtensionType) and target.extension_name == "arrow.uuid":
        if f.type not in (_F.TYPE_STRING, _F.TYPE_BYTES):
            raise SchemaError(path, f"Protobuf {_kind(f)} does not convert to uuid")
        return _checked(path, _kind(f), _uuid, target)
    if f.type == _F.TYPE_ENUM:
        names = {v.number: v.name for v in f.enum_type.values}

        def enum(values: list[Any]) -> pa.Array:
            return pa.array(
                [None if v is None else names.get(v, str(v)) for v in values], pa.string()
            )

        return _checked(path, _kind(f), enum, target)
    return _checked(path, _kind(f), lambda values: pa.array(values, natural), target)


def _kind(f: FieldDescriptor) -> str:
    if f.type == _F.TYPE_ENUM:
        return f"enum {f.enum_type.full_name}"
    if f.type in (_F.TYPE_MESSAGE, _F.TYPE_GROUP):
        return str(f.message_type.full_name)
    return _TYPE_NAMES.get(f.type, "field")


def _checked(path: str, kind: str, natural: Convert, target: pa.DataType) -> Convert:
    def convert(values: list[Any]) -> pa.Array:
        try:
            return cast_array(natural(values), target)
        except SchemaError:
            raise
        except CONVERSION_ERRORS as exc:
            raise SchemaError(path, f"cannot convert Protobuf {kind} to {target}: {exc}") from exc

    return convert


def _well_known(name: str) -> Convert:
    if name == _TIMESTAMP:
        return lambda values: pa.array(
            [None if v is None else v.seconds * 1_000_000 + v.nanos // 1000 for v in values],
            pa.int64(),
        ).view(_MICROS)
    if name == _DURATION:
        # Duration's nanos carry the seconds' sign: truncation toward zero keeps it.
        return lambda values: pa.array(
            [None if v is None else v.seconds * 1_000_000 + int(v.nanos / 1000) for v in values],
            pa.int64(),
        )
    if name in _JSON_TYPES:
        return lambda values: pa.array(
            [
                None
                if v is None
                else json.dumps(json_format.MessageToDict(v), separators=(",", ":"))
                for v in values
            ],
            pa.string(),
        )
    wrapped = _WRAPPERS[name]
    return lambda values: pa.array([None if v is None else v.value for v in values], wrapped)


def _uuid(values: list[Any]) -> pa.Array:
    try:
        storage = pa.array(
            [
                None if v is None else (v if isinstance(v, bytes) else uuid.UUID(v).bytes)
                for v in values
            ],
            pa.binary(16),
        )
    except ValueError as exc:
        raise ValueError(f"not a UUID: {exc}") from None
    return pa.ExtensionArray.from_storage(pa.uuid(), storage)


def _mask(values: list[Any]) -> pa.Array | None:
    if all(v is not None for v in values):
        return None
    return pa.array([v is None for v in values], pa.bool_())


def _offsets(values: list[Any]) -> pa.Array:
    lengths = np.fromiter((0 if v is None else len(v) for v in values), np.int32, len(values))
    offsets = np.zeros(len(values) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.array(offsets)


def _struct(descriptor: Descriptor, target: pa.DataType, path: str, left: int) -> Convert:
    if not pa.types.is_struct(target):
        raise SchemaError(
            path, f"a Protobuf message ({descriptor.full_name}) does not convert to {target}"
        )
    fields = descriptor.fields_by_name
    for name in fields:
        if target.get_field_index(name) < 0:
            raise SchemaError(f"{path}.{name}", "Protobuf field is not in the table's struct")
    children: list[tuple[Callable[[list[Any]], list[Any]], Convert] | pa.DataType] = []
    for child in target.fields:
        if child.name in fields:
            f = fields[child.name]
            children.append((_getter(f), _converter(f, child.type, f"{path}.{child.name}", left)))
        else:
            children.append(child.type)

    def convert(values: list[Any]) -> pa.Array:
        arrays = [
            pa.nulls(len(values), c) if isinstance(c, pa.DataType) else c[1](c[0](values))
            for c in children
        ]
        return pa.StructArray.from_arrays(arrays, fields=list(target.fields), mask=_mask(values))

    return convert


def _list(f: FieldDescriptor, target: pa.DataType, path: str, left: int) -> Convert:
    if not (pa.types.is_list(target) or pa.types.is_large_list(target)):
        raise SchemaError(path, f"a repeated Protobuf field does not convert to {target}")
    element = _single(f, target.value_type, f"{path}.element", left)

    def convert(values: list[Any]) -> pa.Array:
        flat = [x for v in values if v is not None for x in v]
        return pa.ListArray.from_arrays(
            _offsets(values), element(flat), type=target, mask=_mask(values)
        )

    return convert


def _map(f: FieldDescriptor, target: pa.DataType, path: str, left: int) -> Convert:
    if not pa.types.is_map(target):
        raise SchemaError(path, f"a Protobuf map does not convert to {target}")
    entry = f.message_type.fields_by_name
    key = _single(entry["key"], target.key_type, f"{path}.key", left)
    item = _single(entry["value"], target.item_type, f"{path}.value", left)

    def convert(values: list[Any]) -> pa.Array:
        pairs = [pair for v in values if v is not None for pair in v.items()]
        return pa.MapArray.from_arrays(
            _offsets(values),
            key([k for k, _ in pairs]),
            item([x for _, x in pairs]),
            type=target,
            mask=_mask(values),
        )

    return convert
