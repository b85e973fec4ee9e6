"""Protobuf messages -> Arrow columns in the table's types, and a message's own Arrow schema.

The message descriptor decides, once per (schema, message, table), how each column
converts (`batch_builder`). The serialized messages are then parsed and turned into
an Arrow batch by ptars (Rust: no Python per message), and each of its columns is
brought to the table's type on whole arrays: nested messages, lists and maps rebuilt
from their converted children, Arrow's checked casts, enums named by one lookup over
the column. Only Struct, Value and ListValue (their JSON text) and uuids convert
value by value in Python. Groups (proto2's deprecated nested messages) are not read.

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

import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf import json_format, struct_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from icespool.errors import BadInputError, SchemaError
from icespool.schema import cast_array, conform, find_out_of_range

__all__ = ["CONVERSION_ERRORS", "batch_builder", "message_schema"]

#: What a conversion of values that do not fit raises.
CONVERSION_ERRORS: Final = (BadInputError, pa.ArrowException, ValueError, TypeError, OverflowError)

#: A field's column as ptars reads it -> the column in the table's type.
Convert = Callable[[pa.Array], pa.Array]

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
    if f.type == _F.TYPE_GROUP:
        raise _group(path)
    if f.type == _F.TYPE_MESSAGE:
        special = _special(f.message_type.full_name)
        if special is not None:
            return special
        return pa.struct(_fields(f.message_type, left - 1, f"{path}."))
    return _SCALARS[f.type]


def _too_deep(path: str) -> SchemaError:
    return SchemaError(
        path, "the Protobuf message nests deeper than max_nesting_depth (or is recursive)"
    ).because("too_deep")


def _group(path: str) -> SchemaError:
    return SchemaError(path, "Protobuf groups (deprecated since proto2) are not read")


# ------------------------------------------------------------------ messages -> a batch


class NotProtobuf(ValueError):
    """Bytes that do not parse as the message type (ptars' own words)."""


def batch_builder(
    descriptor: Descriptor, handler: Any, value_schema: pa.Schema, max_depth: int
) -> Callable[[pa.BinaryArray], pa.RecordBatch]:
    """serialized messages -> a batch in ``value_schema``, through ``handler`` (ptars'
    converter of the message type); SchemaError when the message type cannot fit the
    table at all (then no message of it can)."""
    fields = descriptor.fields_by_name
    for name in fields:
        if value_schema.get_field_index(name) < 0:
            raise SchemaError(name, "Protobuf field is not a column of the table")
    columns: list[tuple[str, Convert] | pa.DataType] = []
    for target in value_schema:
        if target.name in fields:
            f = fields[target.name]
            # The message itself is the first level, as a JSON object is.
            columns.append((f.name, _converter(f, target.type, target.name, max_depth - 1)))
        elif not target.nullable:
            raise SchemaError(target.name, "required column is missing from the Protobuf message")
        else:
            columns.append(target.type)

    def build(payloads: pa.BinaryArray) -> pa.RecordBatch:
        try:
            natural = handler.array_to_record_batch(payloads)
        except ValueError as exc:
            raise NotProtobuf(str(exc)) from None
        arrays = [
            pa.nulls(len(payloads), column)
            if isinstance(column, pa.DataType)
            else column[1](natural.column(column[0]))
            for column in columns
        ]
        batch = conform(pa.RecordBatch.from_arrays(arrays, schema=value_schema), value_schema)
        for name, values in zip(batch.schema.names, batch.columns, strict=True):
            found = find_out_of_range(values)
            if found is not None:
                raise SchemaError(found.column(name), found.problem).because("out_of_range")
        return batch

    return build


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
    if f.type == _F.TYPE_GROUP:
        raise _group(path)
    if f.type == _F.TYPE_MESSAGE:
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
        return _checked(path, _kind(f), _enum(f), target)
    return _checked(path, _kind(f), lambda values: values.cast(natural), target)


def _kind(f: FieldDescriptor) -> str:
    if f.type == _F.TYPE_ENUM:
        return f"enum {f.enum_type.full_name}"
    if f.type in (_F.TYPE_MESSAGE, _F.TYPE_GROUP):
        return str(f.message_type.full_name)
    return _TYPE_NAMES.get(f.type, "field")


def _checked(path: str, kind: str, natural: Convert, target: pa.DataType) -> Convert:
    def convert(values: pa.Array) -> pa.Array:
        try:
            return cast_array(natural(values), target)
        except SchemaError:
            raise
        except CONVERSION_ERRORS as exc:
            raise SchemaError(path, f"cannot convert Protobuf {kind} to {target}: {exc}") from exc

    return convert


def _enum(f: FieldDescriptor) -> Convert:
    """An enum's numbers -> their names (a number the schema does not name: its
    digits), by one lookup over the whole column."""
    names = {v.number: v.name for v in f.enum_type.values}
    numbers = pa.array(sorted(names), pa.int32())
    labels = pa.array([names[n] for n in numbers.to_pylist()], pa.string())

    def enum(values: pa.Array) -> pa.Array:
        named = labels.take(pc.index_in(values, value_set=numbers))
        return pc.coalesce(named, values.cast(pa.string()))

    return enum


def _well_known(name: str) -> Convert:
    """ptars reads a Timestamp as a timestamp, a Duration as a duration (both in
    microseconds), a wrapper as its value (null when unset); Struct, Value and
    ListValue come as their bytes (`icespool.decode._proto_schema`)."""
    if name == _TIMESTAMP:
        return lambda values: values.cast(_MICROS)
    if name == _DURATION:
        return lambda values: values.view(pa.int64())
    if name in _JSON_TYPES:
        return _json_text(name)
    wrapped = _WRAPPERS[name]
    return lambda values: values.cast(wrapped)


def _json_text(name: str) -> Convert:
    """Struct, Value or ListValue messages (serialized) -> their JSON text: a parse
    and a `json_format` call per value, in Python."""
    kind = {"Struct": struct_pb2.Struct, "Value": struct_pb2.Value}.get(
        name.rsplit(".", 1)[1], struct_pb2.ListValue
    )

    def text(values: pa.Array) -> pa.Array:
        return pa.array(
            [
                None
                if v is None
                else json.dumps(
                    json_format.MessageToDict(kind.FromString(v)), separators=(",", ":")
                )
                for v in values.to_pylist()
            ],
            pa.string(),
        )

    return text


def _uuid(values: pa.Array) -> pa.Array:
    try:
        storage = pa.array(
            [
                None if v is None else (v if isinstance(v, bytes) else uuid.UUID(v).bytes)
                for v in values.to_pylist()
            ],
            pa.binary(16),
        )
    except ValueError as exc:
        raise ValueError(f"not a UUID: {exc}") from None
    return pa.ExtensionArray.from_storage(pa.uuid(), storage)


def _nulls(values: pa.Array) -> pa.Array | None:
    return values.is_null() if values.null_count else None


def _struct(descriptor: Descriptor, target: pa.DataType, path: str, left: int) -> Convert:
    if not pa.types.is_struct(target):
        raise SchemaError(
            path, f"a Protobuf message ({descriptor.full_name}) does not convert to {target}"
        )
    fields = descriptor.fields_by_name
    for name in fields:
        if target.get_field_index(name) < 0:
            raise SchemaError(f"{path}.{name}", "Protobuf field is not in the table's struct")
    children: list[tuple[str, Convert] | pa.DataType] = []
    for child in target.fields:
        if child.name in fields:
            f = fields[child.name]
            children.append((f.name, _converter(f, child.type, f"{path}.{child.name}", left)))
        else:
            children.append(child.type)

    def convert(values: pa.Array) -> pa.Array:
        arrays = [
            pa.nulls(len(values), c) if isinstance(c, pa.DataType) else c[1](values.field(c[0]))
            for c in children
        ]
        return pa.StructArray.from_arrays(arrays, fields=list(target.fields), mask=_nulls(values))

    return convert


def _list(f: FieldDescriptor, target: pa.DataType, path: str, left: int) -> Convert:
    if not (pa.types.is_list(target) or pa.types.is_large_list(target)):
        raise SchemaError(path, f"a repeated Protobuf field does not convert to {target}")
    element = _single(f, target.value_type, f"{path}.element", left)

    def convert(values: pa.Array) -> pa.Array:
        return pa.ListArray.from_arrays(
            values.offsets, element(values.values), type=target, mask=_nulls(values)
        )

    return convert


def _map(f: FieldDescriptor, target: pa.DataType, path: str, left: int) -> Convert:
    if not pa.types.is_map(target):
        raise SchemaError(path, f"a Protobuf map does not convert to {target}")
    entry = f.message_type.fields_by_name
    key = _single(entry["key"], target.key_type, f"{path}.key", left)
    item = _single(entry["value"], target.item_type, f"{path}.value", left)

    def convert(values: pa.Array) -> pa.Array:
        return pa.MapArray.from_arrays(
            values.offsets,
            key(values.keys),
            item(values.items),
            type=target,
            mask=_nulls(values),
        )

    return convert
