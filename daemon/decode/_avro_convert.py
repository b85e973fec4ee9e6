"""Avro records (fastavro's plain dicts) -> Arrow columns in the table's types.

The writer schema decides, once per schema and table, how each column converts
(`batch_builder`); the values are then turned into Arrow one column at a time
(``pa.array`` over the column's Python values, nested types rebuilt from their
flattened children), and logical types are applied on whole arrays: a
``timestamp-micros`` column is its int64 array viewed as ``timestamp[us, UTC]`` and
cast to the table's type with Arrow's checked casts. Only decimals and uuids convert
value by value.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, Final

import numpy as np
import pyarrow as pa

from icespool.decode._avro_schema import WriterSchema
from icespool.errors import BadInputError, SchemaError
from icespool.schema import cast_array, conform, find_out_of_range

__all__ = ["CONVERSION_ERRORS", "Convert", "batch_builder"]

#: What a conversion of values that do not fit raises.
CONVERSION_ERRORS: Final = (BadInputError, pa.ArrowException, ValueError, TypeError, OverflowError)

_PRIMITIVES: Final = frozenset(
    {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
)
_RESOLVE_LIMIT: Final = 64

Convert = Callable[[list[Any]], pa.Array]


def batch_builder(
    writer: WriterSchema, value_schema: pa.Schema, max_depth: int, ignore_unknown: bool = False
) -> Callable[[list[Any]], pa.RecordBatch]:
    """rows (fastavro dicts) -> a batch in ``value_schema``; SchemaError when the writer
    schema cannot fit the table at all (then no record of it can). ``ignore_unknown``:
    top-level fields ``value_schema`` lacks are skipped (an envelope's ``source``)."""
    shape = _resolve(writer, writer.shape)
    if not (isinstance(shape, dict) and shape.get("type") == "record"):
        raise BadInputError(f"the top-level Avro schema must be a record, not {_describe(shape)}")
    fields = {f["name"]: f["type"] for f in shape["fields"]}
    for name in fields:
        if value_schema.get_field_index(name) < 0 and not ignore_unknown:
            raise SchemaError(name, "Avro field is not a column of the table")
    columns: list[tuple[str, Convert | None, pa.DataType]] = []
    for target in value_schema:
        if target.name in fields:
            convert = _converter(
                # The record itself is the first level, as a JSON object is.
                writer,
                fields[target.name],
                target.type,
                target.name,
                max_depth - 1,
            )
            columns.append((target.name, convert, target.type))
        elif not target.nullable:
            raise SchemaError(target.name, "required column is missing from the Avro schema")
        else:
            columns.append((target.name, None, target.type))

    def build(rows: list[Any]) -> pa.RecordBatch:
        arrays = [
            pa.nulls(len(rows), data_type)
            if convert is None
            else convert([row[name] for row in rows])
            for name, convert, data_type in columns
        ]
        batch = conform(pa.RecordBatch.from_arrays(arrays, schema=value_schema), value_schema)
        for name, values in zip(batch.schema.names, batch.columns, strict=True):
            found = find_out_of_range(values)
            if found is not None:
                raise SchemaError(found.column(name), found.problem).because("out_of_range")
        return batch

    return build


def _resolve(writer: WriterSchema, node: Any) -> Any:
    """A named-type reference -> its definition; ``{"type": X}`` without more -> X."""
    for _ in range(_RESOLVE_LIMIT):
        if isinstance(node, str) and node not in _PRIMITIVES:
            if node not in writer.named:
                raise BadInputError(f"unknown Avro type name {node!r}")
            node = writer.named[node]
        elif isinstance(node, dict) and set(node) <= {"type"} and "type" in node:
            node = node["type"]
        else:
            return node
    raise BadInputError("Avro type references loop")


def _describe(node: Any) -> str:
    if isinstance(node, list):
        return "union"
    if isinstance(node, dict):
        logical = node.get("logicalType")
        kind = str(node.get("type"))
        return f"{kind} ({logical})" if logical else kind
    return str(node)


def _converter(
    writer: WriterSchema, node: Any, target: pa.DataType, path: str, left: int
) -> Convert:
    """``left``: how many more levels the schema may nest (max_nesting_depth); a
    recursive schema runs out of them too, before any value of it is read."""
    if left < 0:
        raise SchemaError(
            path, "the Avro schema nests deeper than max_nesting_depth (or is recursive)"
        ).because("too_deep")
    node = _resolve(writer, node)
    if isinstance(node, list):
        branches = [b for b in node if _resolve(writer, b) != "null"]
        if len(branches) == 1:
            return _converter(writer, branches[0], target, path, left)
        if not branches:
            return lambda values: pa.nulls(len(values), target)
        resolved = [_resolve(writer, b) for b in branches]
        if all(isinstance(b, str) for b in resolved) and _plain(target):
            # e.g. ["int", "long"] or ["string", "bytes"]: pyarrow converts value by value.
            return _checked(path, "union", lambda values: pa.array(values, type=target), target)
        raise SchemaError(
            path,
            "an Avro union of several non-null types maps to no single column type (only "
            "unions of primitives into a boolean, number, string or binary column do)",
        )
    kind = node["type"] if isinstance(node, dict) else node
    logical = node.get("logicalType") if isinstance(node, dict) else None
    if kind == "record":
        return _struct(writer, node, target, path, left - 1)
    if kind == "array":
        return _list(writer, node, target, path, left - 1)
    if kind == "map":
        return _map(writer, node, target, path, left - 1)
    if kind == "null":
        return lambda values: pa.nulls(len(values), target)
    natural = _natural(node, kind, logical, target, path)
    return _checked(path, _describe(node), natural, target)


def _checked(path: str, avro: str, natural: Convert, target: pa.DataType) -> Convert:
    def convert(values: list[Any]) -> pa.Array:
        try:
            return cast_array(natural(values), target)
        except SchemaError:
            raise
        except CONVERSION_ERRORS as exc:
            raise SchemaError(path, f"cannot convert Avro {avro} to {target}: {exc}") from exc

    return convert


def _plain(t: pa.DataType) -> bool:
    """Types ``pa.array`` fills from Python values without reinterpreting numbers."""
    return bool(
        pa.types.is_boolean(t)
        or pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_string(t)
        or pa.types.is_binary(t)
    )


def _is_integer(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t))


def _natural(node: Any, kind: str, logical: str | None, target: pa.DataType, path: str) -> Convert:
    """The Arrow array an Avro primitive (with its logical type) stands for."""

    def refuse() -> SchemaError:
        return SchemaError(path, f"Avro {_describe(node)} does not convert to {target}")

    is_uuid = isinstance(target, pa.BaseExtensionType) and target.extension_name == "arrow.uuid"
    if logical == "decimal" and kind in ("bytes", "fixed"):
        if not (pa.types.is_decimal(target) or pa.types.is_floating(target)):
            raise refuse()
        return _decimal(int(node.get("precision", 38)), int(node.get("scale", 0)))
    if is_uuid and kind in ("string", "fixed"):
        # Text of a UUID (logical type uuid or not), or its 16 bytes.
        return _uuid(kind)
    temporal = _TEMPORAL.get((kind, logical or ""))
    if temporal is not None:
        storage, view = temporal
        if not (
            pa.types.is_timestamp(target) or pa.types.is_date(target) or pa.types.is_time(target)
        ):
            raise refuse()
        return lambda values: pa.array(values, storage).view(view)
    simple = _SIMPLE.get(kind)
    if simple is None and kind == "fixed":
        simple = pa.binary(int(node["size"]))
    if simple is None:
        raise SchemaError(path, f"Avro {_describe(node)} is not supported")
    compatible = {
        "boolean": pa.types.is_boolean(target),
        "int": _is_integer(target) or pa.types.is_floating(target) or pa.types.is_decimal(target),
        "long": _is_integer(target) or pa.types.is_floating(target) or pa.types.is_decimal(target),
        "float": pa.types.is_floating(target),
        "double": pa.types.is_floating(target),
        "string": pa.types.is_string(target),
        "enum": pa.types.is_string(target),
        "bytes": pa.types.is_binary(target) or pa.types.is_fixed_size_binary(target),
        "fixed": pa.types.is_binary(target) or pa.types.is_fixed_size_binary(target),
    }[kind]
    if not compatible:
        raise refuse()
    return lambda values: pa.array(values, simple)


_SIMPLE: Final[dict[str, pa.DataType]] = {
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "string": pa.string(),
    "enum": pa.string(),
    "bytes": pa.binary(),
}

# (Avro type, logical type) -> (array of the raw numbers, the type it is viewed as)
_TEMPORAL: Final[dict[tuple[str, str], tuple[pa.DataType, pa.DataType]]] = {
    ("int", "date"): (pa.int32(), pa.date32()),
    ("int", "time-millis"): (pa.int32(), pa.time32("ms")),
    ("long", "time-micros"): (pa.int64(), pa.time64("us")),
    ("long", "timestamp-millis"): (pa.int64(), pa.timestamp("ms", "UTC")),
    ("long", "timestamp-micros"): (pa.int64(), pa.timestamp("us", "UTC")),
    ("long", "timestamp-nanos"): (pa.int64(), pa.timestamp("ns", "UTC")),
    ("long", "local-timestamp-millis"): (pa.int64(), pa.timestamp("ms")),
    ("long", "local-timestamp-micros"): (pa.int64(), pa.timestamp("us")),
    ("long", "local-timestamp-nanos"): (pa.int64(), pa.timestamp("ns")),
}


def _decimal(precision: int, scale: int) -> Convert:
    """Big-endian two's-complement unscaled values -> decimal128 (decimal256 above 38
    digits) in the writer's scale; the cast to the table's type checks range and scale."""
    width = 16 if precision <= 38 else 32
    carrier = pa.decimal128(38, scale) if width == 16 else pa.decimal256(76, scale)
    zero = bytes(width)

    def convert(values: list[Any]) -> pa.Array:
        data = bytearray()
        valid: list[bool] = []
        for value in values:
            if value is None:
                data += zero
                valid.append(False)
            else:
                unscaled = int.from_bytes(value, "big", signed=True)
                try:
                    data += unscaled.to_bytes(width, "little", signed=True)
                except OverflowError:
                    raise ValueError(f"decimal of {len(value)} bytes is too large") from None
                valid.append(True)
        mask = None if all(valid) else pa.array(valid, pa.bool_()).buffers()[1]
        array = pa.Array.from_buffers(carrier, len(values), [mask, pa.py_buffer(bytes(data))])
        array.validate(full=True)  # more digits than the carrier's precision
        return array

    return convert


def _uuid(kind: str) -> Convert:
    def convert(values: list[Any]) -> pa.Array:
        if kind == "fixed":
            storage = pa.array(values, pa.binary(16))
        else:
            try:
                storage = pa.array(
                    [None if v is None else uuid.UUID(v).bytes for v in values], pa.binary(16)
                )
            except ValueError as exc:
                raise ValueError(f"not a UUID: {exc}") from None
        return pa.ExtensionArray.from_storage(pa.uuid(), storage)

    return convert


def _mask(values: list[Any]) -> pa.Array | None:
    if all(v is not None for v in values):
        return None
    return pa.array([v is None for v in values], pa.bool_())


def _offsets(values: list[Any]) -> pa.Array:
    lengths = np.fromiter((0 if v is None else len(v) for v in values), np.int32, len(values))
    offsets = np.zeros(len(values) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.array(offsets)


def _struct(writer: WriterSchema, node: Any, target: pa.DataType, path: str, left: int) -> Convert:
    if not pa.types.is_struct(target):
        raise SchemaError(path, f"an Avro record does not convert to {target}")
    fields = {f["name"]: f["type"] for f in node["fields"]}
    for name in fields:
        if target.get_field_index(name) < 0:
            raise SchemaError(f"{path}.{name}", "Avro field is not in the table's struct")
    children: list[tuple[str, Convert | None, pa.DataType]] = []
    for field in target.fields:
        if field.name in fields:
            child = _converter(writer, fields[field.name], field.type, f"{path}.{field.name}", left)
            children.append((field.name, child, field.type))
        else:
            children.append((field.name, None, field.type))

    def convert(values: list[Any]) -> pa.Array:
        arrays = [
            pa.nulls(len(values), data_type)
            if child is None
            else child([None if v is None else v[name] for v in values])
            for name, child, data_type in children
        ]
        return pa.StructArray.from_arrays(arrays, fields=list(target.fields), mask=_mask(values))

    return convert


def _list(writer: WriterSchema, node: Any, target: pa.DataType, path: str, left: int) -> Convert:
    if not (pa.types.is_list(target) or pa.types.is_large_list(target)):
        raise SchemaError(path, f"an Avro array does not convert to {target}")
    element = _converter(writer, node["items"], target.value_type, f"{path}.element", left)

    def convert(values: list[Any]) -> pa.Array:
        flat = [x for v in values if v is not None for x in v]
        return pa.ListArray.from_arrays(
            _offsets(values), element(flat), type=target, mask=_mask(values)
        )

    return convert


def _map(writer: WriterSchema, node: Any, target: pa.DataType, path: str, left: int) -> Convert:
    if not pa.types.is_map(target):
        raise SchemaError(path, f"an Avro map does not convert to {target}")
    key = _converter(writer, "string", target.key_type, f"{path}.key", left)
    item = _converter(writer, node["values"], target.item_type, f"{path}.value", left)

    def convert(values: list[Any]) -> pa.Array:
        keys = [k for v in values if v is not None for k in v]
        items = [x for v in values if v is not None for x in v.values()]
        return pa.MapArray.from_arrays(
            _offsets(values), key(keys), item(items), type=target, mask=_mask(values)
        )

    return convert
