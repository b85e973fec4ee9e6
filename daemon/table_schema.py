"""Table declarations -> Iceberg schema and partition spec; Arrow schema and batch conformance.

A table is declared in the config as a list of column dicts plus ``partition_by``
strings. This module turns those into pyiceberg objects, derives the Arrow schema
that every batch is cast to before it is spooled, and conforms incoming batches to
that schema with vectorized casts only (no per-row Python on the hot path).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    VoidTransform,
    YearTransform,
)
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IntegerType,
    LongType,
    NestedField,
    PrimitiveType,
    StringType,
    TimestampNanoType,
    TimestampType,
    TimestamptzNanoType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from daemon.config import parse_partition
from daemon.errors import SchemaError

__all__ = [
    "FIELD_ID_KEY",
    "arrow_schema_for",
    "conform",
    "parse_partition_spec",
    "parse_schema",
    "parse_type",
]

#: Arrow field-metadata key that carries the Iceberg field id (what the Parquet writer stores).
FIELD_ID_KEY: Final = b"PARQUET:field_id"

# The Iceberg spec starts partition field ids at 1000 so they never clash with column ids.
_FIRST_PARTITION_FIELD_ID: Final = 1000

_SIMPLE_TYPES: Final[dict[str, PrimitiveType]] = {
    "boolean": BooleanType(),
    "int": IntegerType(),
    "long": LongType(),
    "float": FloatType(),
    "double": DoubleType(),
    "date": DateType(),
    "time": TimeType(),
    "timestamp": TimestampType(),
    "timestamptz": TimestamptzType(),
    # Nanosecond timestamps need table format version 3; the catalog rejects them on v1/v2.
    "timestamp_ns": TimestampNanoType(),
    "timestamptz_ns": TimestamptzNanoType(),
    "string": StringType(),
    "uuid": UUIDType(),
    "binary": BinaryType(),
}
_DECIMAL_RE: Final = re.compile(r"^decimal\s*\(\s*(\d+)\s*,\s*(\d+)\s*\)$")
# Iceberg's own JSON spelling is fixed[n]; the config documents fixed(n). Accept both.
_FIXED_RE: Final = re.compile(r"^fixed\s*[\(\[]\s*(\d+)\s*[\)\]]$")
_NESTED_PREFIXES: Final = ("struct", "list", "map")
_MAX_DECIMAL_PRECISION: Final = 38
_COLUMN_KEYS: Final = frozenset({"name", "type", "required", "doc"})

_TIME_TRANSFORMS: Final[dict[str, Callable[[], Transform[Any, Any]]]] = {
    "year": YearTransform,
    "month": MonthTransform,
    "day": DayTransform,
    "hour": HourTransform,
}


def parse_type(type_string: str, column: str = "?") -> PrimitiveType:
    """Parse an Iceberg type string (``long``, ``decimal(10,2)``, ``fixed(16)``, ...)."""
    text = type_string.strip().lower()
    if text in _SIMPLE_TYPES:
        return _SIMPLE_TYPES[text]
    if m := _DECIMAL_RE.match(text):
        precision, scale = int(m.group(1)), int(m.group(2))
        if not 1 <= precision <= _MAX_DECIMAL_PRECISION:
            raise SchemaError(column, f"decimal precision must be 1..38, got {precision}")
        if scale > precision:
            raise SchemaError(column, f"decimal scale {scale} exceeds precision {precision}")
        return DecimalType(precision, scale)
    if m := _FIXED_RE.match(text):
        length = int(m.group(1))
        if length < 1:
            raise SchemaError(column, "fixed length must be at least 1")
        return FixedType(length)
    if text.startswith(_NESTED_PREFIXES):
        raise SchemaError(
            column, f"nested type {type_string!r} is not supported yet; declare a primitive type"
        )
    valid = ", ".join([*_SIMPLE_TYPES, "decimal(p,s)", "fixed(n)"])
    raise SchemaError(column, f"unknown type {type_string!r}; valid types: {valid}")


def parse_schema(columns: Sequence[Mapping[str, object]]) -> Schema:
    """Build an Iceberg schema from column declarations, assigning field ids 1..n in order."""
    if not columns:
        raise SchemaError("?", "a table needs at least one column")
    fields: list[NestedField] = []
    seen: dict[str, str] = {}
    for position, column in enumerate(columns, start=1):
        name = column.get("name")
        if not isinstance(name, str) or not name.strip():
            raise SchemaError(f"#{position}", "every column needs a non-empty string 'name'")
        unknown = sorted(set(column) - _COLUMN_KEYS)
        if unknown:
            raise SchemaError(name, f"unknown key(s) {unknown}; allowed: {sorted(_COLUMN_KEYS)}")
        # Spark resolves column names case-insensitively, so names that differ only in
        # case would make the table unreadable there.
        folded = name.lower()
        if folded in seen:
            raise SchemaError(name, f"duplicate column name (clashes with {seen[folded]!r})")
        seen[folded] = name
        type_value = column.get("type")
        if not isinstance(type_value, str):
            raise SchemaError(name, "'type' must be an Iceberg type string such as 'long'")
        required = column.get("required", False)
        if not isinstance(required, bool):
            raise SchemaError(name, "'required' must be true or false")
        doc = column.get("doc")
        if doc is not None and not isinstance(doc, str):
            raise SchemaError(name, "'doc' must be a string")
        fields.append(
            NestedField(
                field_id=position,
                name=name,
                field_type=parse_type(type_value, name),
                required=required,
                doc=doc,
            )
        )
    return Schema(*fields)


def _parse_partition_expression(expression: str) -> tuple[str, Transform[Any, Any], str]:
    """Return (source column, transform, default partition field name) for one expression.

    The grammar is the config's (`parse_partition`), so a file that passes
    check-config never fails here for syntax.
    """
    try:
        field = parse_partition(expression)
    except ValueError as exc:
        raise SchemaError(expression.strip() or expression, f"partition_by {exc}") from None
    column = field.column
    if field.transform == "identity":
        return column, IdentityTransform(), column
    if field.transform == "void":
        return column, VoidTransform(), f"{column}_null"
    if field.transform == "bucket":
        assert field.param is not None
        return column, BucketTransform(num_buckets=field.param), f"{column}_bucket"
    if field.transform == "truncate":
        assert field.param is not None
        return column, TruncateTransform(width=field.param), f"{column}_trunc"
    return column, _TIME_TRANSFORMS[field.transform](), f"{column}_{field.transform}"


def parse_partition_spec(schema: Schema, partition_by: Sequence[str]) -> PartitionSpec:
    """Parse ``partition_by`` expressions against ``schema`` into a PartitionSpec."""
    fields: list[PartitionField] = []
    used_sources: dict[int, str] = {}
    used_names: set[str] = set()
    for offset, expression in enumerate(partition_by):
        column, transform, field_name = _parse_partition_expression(expression)
        try:
            source = schema.find_field(column)
        except ValueError:
            raise SchemaError(
                column, f"partition_by {expression!r}: no such column in the table schema"
            ) from None
        if not transform.can_transform(source.field_type):
            raise SchemaError(
                column,
                f"partition_by {expression!r}: {transform} cannot be applied to "
                f"{source.field_type} columns",
            )
        # Two transforms of one source column (day(ts) and hour(ts)) are redundant, Java
        # rejects the time-based ones, and pyiceberg's PartitionKey cannot represent them.
        if source.field_id in used_sources:
            raise SchemaError(
                column,
                f"partition_by {expression!r}: column is already partitioned by "
                f"{used_sources[source.field_id]!r}",
            )
        if field_name in used_names:
            raise SchemaError(column, f"partition_by {expression!r}: duplicate partition field")
        used_sources[source.field_id] = expression
        used_names.add(field_name)
        fields.append(
            PartitionField(
                source_id=source.field_id,
                field_id=_FIRST_PARTITION_FIELD_ID + offset,
                transform=transform,
                name=field_name,
            )
        )
    return PartitionSpec(*fields)


def _plain_offsets(data_type: pa.DataType) -> pa.DataType:
    """Replace large (64-bit offset) string/binary/list types by their plain forms, recursively.

    pyiceberg maps string/binary to the large variants, but its writer accepts the plain
    ones, and batches bounded by max_batch_bytes never need 64-bit offsets; plain types
    halve offset memory and are what JSON/IPC decoders produce, so casts become no-ops.
    """
    if pa.types.is_large_string(data_type):
        return pa.string()
    if pa.types.is_large_binary(data_type):
        return pa.binary()
    if pa.types.is_large_list(data_type) or pa.types.is_list(data_type):
        return pa.list_(_plain_field(data_type.value_field))
    if pa.types.is_map(data_type):
        return pa.map_(_plain_field(data_type.key_field), _plain_field(data_type.item_field))
    if pa.types.is_struct(data_type):
        return pa.struct([_plain_field(data_type.field(i)) for i in range(data_type.num_fields)])
    return data_type


def _plain_field(field: pa.Field) -> pa.Field:
    return field.with_type(_plain_offsets(field.type))


def arrow_schema_for(table: Schema | object) -> pa.Schema:
    """Return the Arrow schema batches for ``table`` are cast to before spooling.

    ``table`` is a pyiceberg ``Schema`` or anything with a ``schema()`` method returning
    one (a pyiceberg ``Table``). Fields carry their Iceberg field id in the
    ``PARQUET:field_id`` metadata and required columns are non-nullable.
    """
    schema = table if isinstance(table, Schema) else _schema_of(table)
    arrow = schema_to_pyarrow(schema, include_field_ids=True)
    return pa.schema([_plain_field(field) for field in arrow], metadata=arrow.metadata)


def _schema_of(table: object) -> Schema:
    getter = getattr(table, "schema", None)
    schema = getter() if callable(getter) else None
    if not isinstance(schema, Schema):
        raise TypeError(f"expected a pyiceberg Schema or Table, got {type(table).__name__}")
    return schema


def _field_id(field: pa.Field) -> bytes | None:
    metadata = field.metadata
    return metadata.get(FIELD_ID_KEY) if metadata else None


def _cast_column(name: str, values: pa.Array | pa.ChunkedArray, target: pa.Field) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if values.type != target.type:
        try:
            values = _cast_values(values, target.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise SchemaError(
                name, f"cannot convert {values.type} to {target.type}: {exc}"
            ) from exc
    if not target.nullable and values.null_count:
        first = pc.index(pc.is_null(values), True).as_py()
        raise SchemaError(
            name, f"required column has {values.null_count} null value(s) (first at row {first})"
        )
    return values


def _is_text(data_type: pa.DataType) -> bool:
    if pa.types.is_dictionary(data_type):
        return _is_text(data_type.value_type)
    return bool(
        pa.types.is_string(data_type)
        or pa.types.is_large_string(data_type)
        or pa.types.is_string_view(data_type)
    )


def _is_temporal(data_type: pa.DataType) -> bool:
    return bool(
        pa.types.is_timestamp(data_type)
        or pa.types.is_date(data_type)
        or pa.types.is_time(data_type)
    )


def _cast_values(values: pa.Array, target: pa.DataType) -> pa.Array:
    # Arrow would happily stringify numbers and read integers as timestamps in the
    # target's unit; both hide a wrongly typed input instead of reporting it.
    if _is_text(target) and not _is_text(values.type):
        raise pa.ArrowInvalid("only text converts to a string column")
    if _is_temporal(target) and not (_is_temporal(values.type) or _is_text(values.type)):
        raise pa.ArrowInvalid(
            "numbers are ambiguous as times; send ISO-8601 text or Arrow temporal values"
        )
    if isinstance(target, pa.BaseExtensionType):
        # Arrow cannot cast into extension types (uuid) directly: cast to the storage
        # type, then wrap, which is zero-copy.
        storage = values.storage if isinstance(values, pa.ExtensionArray) else values
        return pa.ExtensionArray.from_storage(target, storage.cast(target.storage_type))
    if pa.types.is_timestamp(target) and pa.types.is_timestamp(values.type):
        if target.tz is not None and values.type.tz is None:
            # Naive timestamps bound for a timestamptz column are taken as UTC, which is
            # what Iceberg and Spark do; Arrow refuses that cast without a hint.
            values = values.cast(pa.timestamp(values.type.unit, tz=target.tz))
        elif target.tz is None and values.type.tz is not None:
            raise pa.ArrowInvalid(
                "refusing to drop the time zone of a timestamptz value into a timestamp column"
            )
    return values.cast(target, safe=True)


def conform(
    batch: pa.RecordBatch | pa.Table,
    arrow_schema: pa.Schema,
    *,
    match_field_ids: bool = False,
) -> pa.RecordBatch:
    """Cast ``batch`` to ``arrow_schema`` column by column, in the schema's order.

    Columns are matched by name (or by Iceberg field id when ``match_field_ids`` is set
    and both sides carry ids: that survives a column rename between spooling and
    encoding). Missing optional columns become nulls. A missing required column, an
    unknown column, a null in a required column or a failed cast raises
    ``SchemaError`` naming the column.
    """
    if isinstance(batch, pa.Table):
        batch = batch.combine_chunks().to_batches()[0] if batch.num_rows else _empty(batch)
    if batch.schema.equals(arrow_schema, check_metadata=False) and all(
        field.nullable or batch.column(i).null_count == 0 for i, field in enumerate(arrow_schema)
    ):
        # Already conforming (the spool replay path): only stamp the target metadata.
        return pa.RecordBatch.from_arrays(batch.columns, schema=arrow_schema)

    source_index: dict[str | bytes, int] = {}
    for index, field in enumerate(batch.schema):
        key: str | bytes = field.name
        if match_field_ids and (field_id := _field_id(field)) is not None:
            key = field_id
        if key in source_index:
            raise SchemaError(field.name, "column appears more than once in the batch")
        source_index[key] = index

    used: set[int] = set()
    arrays: list[pa.Array] = []
    for target in arrow_schema:
        lookup: str | bytes = target.name
        if match_field_ids and (target_id := _field_id(target)) is not None:
            lookup = target_id if target_id in source_index else target.name
        found = source_index.get(lookup)
        if found is None:
            if not target.nullable:
                raise SchemaError(target.name, "required column is missing")
            arrays.append(pa.nulls(batch.num_rows, type=target.type))
            continue
        used.add(found)
        arrays.append(_cast_column(target.name, batch.column(found), target))

    extra = [batch.schema.field(i).name for i in range(batch.num_columns) if i not in used]
    if extra:
        raise SchemaError(extra[0], "column is not in the table schema")
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)


def _empty(table: pa.Table) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [pa.array([], type=field.type) for field in table.schema], schema=table.schema
    )
