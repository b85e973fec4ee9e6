"""Table declarations -> Iceberg schema and partition spec; Arrow schema and batch conformance.

A table is declared in the config as a list of column dicts plus ``partition_by``
strings. This module turns those into pyiceberg objects, derives the Arrow schema
that every batch is cast to before it is spooled, and conforms incoming batches to
that schema with vectorized casts only (no per-row Python on the hot path).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.sorting import (
    UNSORTED_SORT_ORDER,
    NullOrder,
    SortDirection,
    SortField,
    SortOrder,
)
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
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    PrimitiveType,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from daemon.config import parse_partition
from daemon.config._types import parse_sort, parse_type_string, render_type
from daemon.errors import SchemaError
from daemon.value_ranges import find_out_of_range, has_huge_exponent

__all__ = [
    "FIELD_ID_KEY",
    "MAX_INFERRED_FIELDS",
    "SchemaDifference",
    "arrow_schema_for",
    "cast_array",
    "check_required_children",
    "conform",
    "fill_masked_children",
    "infer_schema",
    "parse_partition_spec",
    "parse_schema",
    "parse_sort_order",
    "parse_type",
    "schema_diff",
]

#: Arrow field-metadata key that carries the Iceberg field id (what the Parquet writer stores).
FIELD_ID_KEY: Final = b"PARQUET:field_id"

# The Iceberg spec starts partition field ids at 1000 so they never clash with column ids.
_FIRST_PARTITION_FIELD_ID: Final = 1000

_COLUMN_KEYS: Final = frozenset({"name", "type", "required", "doc", "timestamp_unit"})

_TIME_TRANSFORMS: Final[dict[str, Callable[[], Transform[Any, Any]]]] = {
    "year": YearTransform,
    "month": MonthTransform,
    "day": DayTransform,
    "hour": HourTransform,
}


def parse_type(
    type_string: str, column: str = "?", next_id: Callable[[], int] | None = None
) -> IcebergType:
    """Parse a column type (``long``, ``decimal(10,2)``, ``fixed[16]``, ``list<string>``,
    ``map<string, long>``, ``struct<a: int not null, b: list<double>>``, ...).

    Nested field, element and value ids come from ``next_id`` (1, 2, ... when omitted).
    """
    try:
        return parse_type_string(type_string, next_id)
    except ValueError as exc:
        raise SchemaError(column, str(exc)) from None


def parse_schema(columns: Sequence[Mapping[str, object]]) -> Schema:
    """Build an Iceberg schema from column declarations.

    Top-level columns get field ids 1..n in order (as Iceberg assigns them); ids of
    nested fields, list elements and map keys/values follow, column by column.
    """
    if not columns:
        raise SchemaError("?", "a table needs at least one column")
    fields: list[NestedField] = []
    seen: dict[str, str] = {}
    next_nested = itertools.count(len(columns) + 1)
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
                field_type=parse_type(type_value, name, lambda: next(next_nested)),
                required=required,
                doc=doc,
            )
        )
    return Schema(*fields)


def parse_sort_order(schema: Schema, sort_by: Sequence[str]) -> SortOrder:
    """Parse ``sort_by`` entries (``"ts"``, ``"id desc"``, ``"day(ts) asc nulls last"``)."""
    if not sort_by:
        return UNSORTED_SORT_ORDER
    fields: list[SortField] = []
    for expression in sort_by:
        try:
            term, descending, nulls_first = parse_sort(expression)
        except ValueError as exc:
            raise SchemaError(expression.strip() or expression, f"sort_by {exc}") from None
        column, transform, _ = _parse_partition_expression(term)
        try:
            source = schema.find_field(column)
        except ValueError:
            raise SchemaError(
                column, f"sort_by {expression!r}: no such column in the table schema"
            ) from None
        if not isinstance(source.field_type, PrimitiveType) or not transform.can_transform(
            source.field_type
        ):
            raise SchemaError(
                column,
                f"sort_by {expression!r}: cannot sort by {transform} of a "
                f"{source.field_type} column; sort by a primitive column",
            )
        fields.append(
            SortField(
                source_id=source.field_id,
                transform=transform,
                direction=SortDirection.DESC if descending else SortDirection.ASC,
                null_order=NullOrder.NULLS_FIRST if nulls_first else NullOrder.NULLS_LAST,
            )
        )
    return SortOrder(*fields, order_id=1)


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
        if pa.types.is_nested(target.type):
            # Arrow's struct cast drops unknown fields and stringifies numbers without a
            # word; apply the same rules as for top-level columns, field by field.
            _check_nested_cast(name, values.type, target.type)
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
    if _has_required_child(target.type):
        check_required_children(name, values, target.type)
    return values


def _child_fields(data_type: pa.DataType) -> list[tuple[str, pa.Field]]:
    """(path suffix, field) of a nested type's children, as Iceberg names them."""
    if pa.types.is_struct(data_type):
        return [(f".{f.name}", f) for f in data_type.fields]
    if pa.types.is_map(data_type):
        return [(".key", data_type.key_field), (".value", data_type.item_field)]
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        return [(".element", data_type.value_field)]
    return []


def _has_required_child(data_type: pa.DataType) -> bool:
    return any(
        not field.nullable or _has_required_child(field.type)
        for _, field in _child_fields(data_type)
    )


def _check_nested_cast(path: str, source: pa.DataType, target: pa.DataType) -> None:
    if pa.types.is_struct(target):
        if not pa.types.is_struct(source):
            raise SchemaError(path, f"expected a struct, got {source}")
        names = {field.name for field in target.fields}
        for field in source.fields:
            if field.name not in names:
                raise SchemaError(
                    f"{path}.{field.name}",
                    f"field is not in the table schema; the struct has {', '.join(names)}",
                )
            _check_nested_cast(f"{path}.{field.name}", field.type, target.field(field.name).type)
        return
    source_children = dict(_child_fields(source))
    target_children = _child_fields(target)
    if target_children:
        if [suffix for suffix, _ in target_children] != list(source_children):
            raise SchemaError(path, f"expected {target}, got {source}")
        for suffix, field in target_children:
            _check_nested_cast(f"{path}{suffix}", source_children[suffix].type, field.type)
        return
    if source == target:
        return
    if _is_text(target) and not _is_text(source):
        raise SchemaError(path, f"only text converts to a string field, got {source}")
    if _is_temporal(target) and not (_is_temporal(source) or _is_text(source)):
        raise SchemaError(
            path, "numbers are ambiguous as times; send ISO-8601 text or Arrow temporal values"
        )


def check_required_children(path: str, values: pa.Array, data_type: pa.DataType) -> None:
    """Raise ``SchemaError`` naming the nested path of a null in a required nested
    field, element or map value (struct fields count only where the struct is set)."""
    if not _has_required_child(data_type):
        return
    if pa.types.is_struct(data_type):
        for index, field in enumerate(data_type.fields):
            child = values.field(index)
            if not field.nullable:
                # The child array ignores the parent's validity: a null struct's
                # fields are don't-care, only present structs must fill them.
                bad = pc.and_(pc.is_null(child), pc.is_valid(values))
                if pc.any(bad).as_py():
                    row = pc.index(bad, True).as_py()
                    raise SchemaError(f"{path}.{field.name}", f"required field is null (row {row})")
            if _has_required_child(field.type):
                check_required_children(f"{path}.{field.name}", child, field.type)
        return
    for suffix, field in _child_fields(data_type):
        if pa.types.is_map(data_type):
            child = values.keys if suffix == ".key" else values.items
        else:
            child = values.flatten()
        if not field.nullable and child.null_count:
            raise SchemaError(f"{path}{suffix}", "required value is null")
        if _has_required_child(field.type):
            check_required_children(f"{path}{suffix}", child, field.type)


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


def cast_array(values: pa.Array, target: pa.DataType) -> pa.Array:
    """Cast one array to ``target`` with conform's rules, nested types included.

    Struct fields are matched by name (missing ones become null), and nested arrays
    are rebuilt with the target's child fields rather than cast by Arrow: Arrow's
    cast refuses a null in a required struct field even under a null struct, where
    Iceberg (and Parquet) do not care. Raises ``pa.ArrowInvalid`` and friends.
    """
    if values.type == target:
        return values
    if pa.types.is_struct(target):
        if not pa.types.is_struct(values.type):
            raise pa.ArrowInvalid(f"expected a struct, got {values.type}")
        positions = {field.name: i for i, field in enumerate(values.type.fields)}
        children = [
            cast_array(values.field(positions[field.name]), field.type)
            if field.name in positions
            else pa.nulls(len(values), field.type)
            for field in target.fields
        ]
        return pa.StructArray.from_arrays(
            children, fields=list(target.fields), mask=_null_mask(values)
        )
    if pa.types.is_map(target):
        if not pa.types.is_map(values.type):
            raise pa.ArrowInvalid(f"expected a map, got {values.type}")
        entries = values.values
        return pa.MapArray.from_arrays(
            values.offsets,
            cast_array(entries.field(0), target.key_type),
            cast_array(entries.field(1), target.item_type),
            type=target,
            mask=_null_mask(values),
        )
    if pa.types.is_list(target):
        if not (pa.types.is_list(values.type) or pa.types.is_large_list(values.type)):
            raise pa.ArrowInvalid(f"expected a list, got {values.type}")
        return pa.ListArray.from_arrays(
            values.offsets.cast(pa.int32()),
            cast_array(values.values, target.value_type),
            type=target,
            mask=_null_mask(values),
        )
    return _cast_values(values, target)


def fill_masked_children(values: pa.Array, data_type: pa.DataType) -> pa.Array:
    """Give required nested fields a placeholder where their parent struct is null.

    Arrow keeps whatever a null struct's children hold, but the Parquet writer refuses
    any null in a non-nullable child, even under a null parent, where Parquet stores
    nothing for it. Call after ``check_required_children`` has verified that present
    structs fill their required fields; returns ``values`` unchanged when nothing needs
    filling.
    """
    if not _has_required_child(data_type):
        return values
    if pa.types.is_struct(data_type):
        children = []
        for index, field in enumerate(data_type.fields):
            child = fill_masked_children(values.field(index), field.type)
            if not field.nullable and child.null_count:
                child = _placeholder(child, field.type)
            children.append(child)
        return pa.StructArray.from_arrays(
            children, fields=list(data_type.fields), mask=_null_mask(values)
        )
    if pa.types.is_map(data_type):
        entries = values.values
        return pa.MapArray.from_arrays(
            values.offsets,
            entries.field(0),
            fill_masked_children(entries.field(1), data_type.item_type),
            type=data_type,
            mask=_null_mask(values),
        )
    if pa.types.is_list(data_type):
        return pa.ListArray.from_arrays(
            values.offsets,
            fill_masked_children(values.values, data_type.value_type),
            type=data_type,
            mask=_null_mask(values),
        )
    return values


def _placeholder(values: pa.Array, data_type: pa.DataType) -> pa.Array:
    """``values`` with every slot valid, built from its own buffers and children.

    The slots that were null hold whatever their buffers hold (zeros, empty ranges);
    they sit under a null parent, which Parquet does not store. No value of the type
    is constructed: pyarrow cannot build scalars of a list or map holding a uuid, nor
    cast a number to every date or decimal type.
    """
    if isinstance(data_type, pa.BaseExtensionType):
        storage = values.storage if isinstance(values, pa.ExtensionArray) else values
        return pa.ExtensionArray.from_storage(
            data_type, _placeholder(storage, data_type.storage_type)
        )
    if pa.types.is_struct(data_type):
        children = [
            _placeholder(values.field(i), f.type) if not f.nullable else values.field(i)
            for i, f in enumerate(data_type.fields)
        ]
        return pa.StructArray.from_arrays(children, fields=list(data_type.fields))
    if pa.types.is_map(data_type):
        entries = values.values
        return pa.MapArray.from_arrays(
            values.offsets, entries.field(0), entries.field(1), type=data_type
        )
    if pa.types.is_list(data_type):
        return pa.ListArray.from_arrays(values.offsets, values.values, type=data_type)
    return pa.Array.from_buffers(
        data_type, len(values), [None, *values.buffers()[1:]], offset=values.offset
    )


def _null_mask(values: pa.Array) -> pa.Array | None:
    return values.is_null() if values.null_count else None


def _cast_values(values: pa.Array, target: pa.DataType) -> pa.Array:
    if pa.types.is_nested(target):
        return cast_array(values, target)
    # Arrow would happily stringify numbers and read integers as timestamps in the
    # target's unit; both hide a wrongly typed input instead of reporting it.
    if _is_text(target) and not _is_text(values.type):
        raise pa.ArrowInvalid("only text converts to a string column")
    if _is_temporal(target) and not (_is_temporal(values.type) or _is_text(values.type)):
        raise pa.ArrowInvalid(
            "numbers are ambiguous as times; send ISO-8601 text or Arrow temporal values"
        )
    if pa.types.is_decimal(target) and _is_text(values.type) and has_huge_exponent(values):
        raise pa.ArrowInvalid(
            "a value has an exponent of 5 or more digits, which no numeric column can hold"
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
    cast = values.cast(target, safe=True)
    if _is_text(values.type) and _is_temporal(target):
        # Text parses to any year Arrow can hold ("0000-01-01"); Arrow temporal
        # input was range-checked at decode, text only becomes a time here.
        found = find_out_of_range(cast)
        if found is not None:
            raise pa.ArrowInvalid(found.problem)
    return cast


def conform(
    batch: pa.RecordBatch | pa.Table,
    arrow_schema: pa.Schema,
    *,
    match_field_ids: bool = False,
    drop_extra: bool = False,
) -> pa.RecordBatch:
    """Cast ``batch`` to ``arrow_schema`` column by column, in the schema's order.

    ``drop_extra`` ignores columns the schema lacks (spooled before someone dropped
    them from the table) instead of refusing the batch.

    Columns are matched by name (or by Iceberg field id when ``match_field_ids`` is set
    and both sides carry ids: that survives a column rename between spooling and
    encoding). Missing optional columns become nulls. A missing required column, an
    unknown column, a null in a required column or a failed cast raises
    ``SchemaError`` naming the column.
    """
    if isinstance(batch, pa.Table):
        batch = batch.combine_chunks().to_batches()[0] if batch.num_rows else _empty(batch)
    if batch.schema.equals(arrow_schema, check_metadata=False) and all(
        (field.nullable or batch.column(i).null_count == 0)
        and not (pa.types.is_nested(field.type) and _has_required_child(field.type))
        for i, field in enumerate(arrow_schema)
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
    if extra and not drop_extra:
        raise SchemaError(extra[0], "column is not in the table schema")
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)


def _empty(table: pa.Table) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        # pa.nulls: pa.array([]) fails for nested types holding a uuid (pyarrow 26).
        [pa.nulls(0, type=field.type) for field in table.schema],
        schema=table.schema,
    )


# ------------------------------------------------------------------ declared vs existing


DifferenceKind = Literal["missing", "extra", "type", "required"]


@dataclass(frozen=True, slots=True)
class SchemaDifference:
    """One way an existing table's schema differs from the declared one.

    ``path`` is the dotted column path (``payload.tags.element``, ``attrs.value``).
    ``kind``: ``missing`` (declared, not in the table), ``extra`` (in the table, not
    declared), ``type`` (both have it, types differ), ``required`` (required-ness
    differs). ``declared``/``existing`` are the types in the config's spelling, plus
    `` not null`` when required (None when that side lacks the column).
    ``writable``: records of the declared shape can be written to the existing table
    as it is (an optional extra column, a legal promotion such as int -> long, a
    declared-required column that the table has as optional).
    """

    path: str
    kind: DifferenceKind
    declared: str | None
    existing: str | None
    writable: bool

    def describe(self, table_name: str = "the table") -> str:
        if self.kind == "missing":
            return f"{self.path}: declared as {self.declared} but missing from {table_name}"
        if self.kind == "extra":
            return f"{self.path}: {table_name} has {self.existing}, which is not declared"
        if self.kind == "type":
            return (
                f"{self.path}: declared as {self.declared} but {table_name} has {self.existing}"
                + (" (a legal promotion: writable)" if self.writable else "")
            )
        return f"{self.path}: declared {self.declared} but {table_name} has {self.existing}"


def _spelled(field: NestedField) -> str:
    return render_type(field.field_type) + (" not null" if field.required else "")


def _promotable(source: IcebergType, target: IcebergType) -> bool:
    """Whether values of ``source`` fit a ``target`` column unchanged (Iceberg promotions)."""
    if isinstance(source, IntegerType) and isinstance(target, LongType):
        return True
    if isinstance(source, FloatType) and isinstance(target, DoubleType):
        return True
    return (
        isinstance(source, DecimalType)
        and isinstance(target, DecimalType)
        and source.scale == target.scale
        and source.precision <= target.precision
    )


def _children(field_type: IcebergType) -> list[NestedField] | None:
    if isinstance(field_type, StructType):
        return list(field_type.fields)
    if isinstance(field_type, ListType):
        return [field_type.element_field]
    if isinstance(field_type, MapType):
        return [field_type.key_field, field_type.value_field]
    return None


def _same_kind(a: IcebergType, b: IcebergType) -> bool:
    return type(a) is type(b) and isinstance(a, StructType | ListType | MapType)


def _diff_fields(
    prefix: str,
    declared: Sequence[NestedField],
    existing: Sequence[NestedField],
    out: list[SchemaDifference],
) -> None:
    by_name = {field.name: field for field in existing}
    for field in declared:
        path = f"{prefix}{field.name}"
        current = by_name.pop(field.name, None)
        if current is None:
            out.append(SchemaDifference(path, "missing", _spelled(field), None, False))
            continue
        source, target = field.field_type, current.field_type
        if _same_kind(source, target):
            _diff_fields(f"{path}.", _children(source) or [], _children(target) or [], out)
        elif source != target:
            out.append(
                SchemaDifference(
                    path,
                    "type",
                    render_type(source),
                    render_type(target),
                    _promotable(source, target),
                )
            )
        if field.required != current.required:
            out.append(
                SchemaDifference(
                    path,
                    "required",
                    "required" if field.required else "optional",
                    "required" if current.required else "optional",
                    # Required declared values fit an optional column; the reverse lets
                    # nulls through that the table refuses.
                    writable=field.required,
                )
            )
    for current in by_name.values():
        # An undeclared optional column just stays null; a required one cannot be filled.
        out.append(
            SchemaDifference(
                f"{prefix}{current.name}", "extra", None, _spelled(current), not current.required
            )
        )


def schema_diff(existing: Schema, declared: Schema) -> list[SchemaDifference]:
    """Every difference between an existing table schema and a declared one, by name.

    Nested fields are compared recursively (struct fields by name, list ``element``,
    map ``key``/``value``); field ids are ignored, since the catalog assigns its own.
    Empty when the schemas match. Order: declared columns first (in declaration
    order), then undeclared table columns.
    """
    out: list[SchemaDifference] = []
    _diff_fields("", declared.fields, existing.fields, out)
    return out


# ------------------------------------------------------------------ inference


def infer_schema(arrow_schema: pa.Schema) -> Schema:
    """Infer an Iceberg schema for a table created from a batch with ``arrow_schema``.

    Every field is optional (a first batch without nulls says nothing about the
    next one). Top-level ids are 1..n, nested ids follow, as in ``parse_schema``.
    Arrow types without a faithful Iceberg type (unsigned 64-bit integers, all-null
    columns, unions, durations, nanosecond timestamps/times, which need format
    version 3) raise ``SchemaError`` naming the column and what to declare instead.
    """
    if len(arrow_schema) == 0:
        raise SchemaError("?", "cannot infer a schema from a batch without columns")
    fields_count = _count_fields(arrow_schema)
    if fields_count > MAX_INFERRED_FIELDS:
        raise SchemaError(
            "?",
            f"the records hold {fields_count} fields; a table is inferred or evolved with "
            f"at most {MAX_INFERRED_FIELDS} (declare a wider table's schema)",
        )
    next_id = itertools.count(len(arrow_schema) + 1)
    seen: dict[str, str] = {}
    fields: list[NestedField] = []
    for position, field in enumerate(arrow_schema, start=1):
        _check_name(field.name, field.name)
        folded = field.name.lower()
        if folded in seen:
            raise SchemaError(field.name, f"duplicate column name (clashes with {seen[folded]!r})")
        seen[folded] = field.name
        fields.append(
            NestedField(
                position, field.name, _infer_type(field.name, field.type, next_id), required=False
            )
        )
    return Schema(*fields)


#: Records with 100,000 keys made an inferred table whose first commit took minutes,
#: blocked the event loop for seconds and slowed every later start by tens of
#: seconds; no real record has this many fields (Parquet readers struggle far sooner).
MAX_INFERRED_FIELDS: Final = 10_000


def _count_fields(arrow_schema: pa.Schema) -> int:
    count, types = 0, [field.type for field in arrow_schema]
    while types:
        t = types.pop()
        count += 1
        if pa.types.is_struct(t):
            types.extend(field.type for field in t.fields)
        elif pa.types.is_map(t):
            types += (t.key_type, t.item_type)
        elif isinstance(t, pa.ListType | pa.LargeListType | pa.FixedSizeListType):
            types.append(t.value_type)
    return count


def _check_name(path: str, name: str) -> None:
    # An inferred table with an empty field name was created, its records acked,
    # and then no commit could write the field into pyiceberg's Avro manifests.
    if not name:
        raise SchemaError(path or '""', "a field name must not be empty; rename the key")


def _infer_type(path: str, t: pa.DataType, next_id: Iterator[int]) -> IcebergType:
    def fail(fix: str) -> SchemaError:
        return SchemaError(path, f"cannot infer an Iceberg type from Arrow {t}; {fix}")

    if isinstance(t, pa.BaseExtensionType):
        if t.extension_name == "arrow.uuid":
            return UUIDType()
        return _infer_type(path, t.storage_type, next_id)
    if pa.types.is_dictionary(t):
        return _infer_type(path, t.value_type, next_id)
    if pa.types.is_boolean(t):
        return BooleanType()
    if pa.types.is_integer(t):
        if t.bit_width <= 16 or (t.bit_width == 32 and pa.types.is_signed_integer(t)):
            return IntegerType()
        if t.bit_width == 32 or pa.types.is_signed_integer(t):
            return LongType()
        raise fail("uint64 values can exceed long; declare the column as decimal(20,0)")
    if pa.types.is_float16(t) or pa.types.is_float32(t):
        return FloatType()
    if pa.types.is_float64(t):
        return DoubleType()
    if pa.types.is_decimal(t):
        if t.precision > 38:
            raise fail("Iceberg decimals have at most 38 digits")
        return DecimalType(t.precision, t.scale)
    if pa.types.is_date(t):
        return DateType()
    if pa.types.is_time(t):
        if t.unit == "ns":
            raise fail("Iceberg time has microsecond precision; cast to time64('us')")
        return TimeType()
    if pa.types.is_timestamp(t):
        if t.unit == "ns":
            raise fail(
                "nanosecond timestamps need table format version 3, which pyiceberg 0.12 "
                "cannot write; cast to microseconds"
            )
        return TimestamptzType() if t.tz is not None else TimestampType()
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return StringType()
    if pa.types.is_fixed_size_binary(t):
        return FixedType(t.byte_width)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return BinaryType()
    if pa.types.is_map(t):
        key_id, value_id = next(next_id), next(next_id)
        return MapType(
            key_id,
            _infer_type(f"{path}.key", t.key_type, next_id),
            value_id,
            _infer_type(f"{path}.value", t.item_type, next_id),
            value_required=False,
        )
    if (
        pa.types.is_list(t)
        or pa.types.is_large_list(t)
        or pa.types.is_fixed_size_list(t)
        or pa.types.is_list_view(t)
        or pa.types.is_large_list_view(t)
    ):
        element_id = next(next_id)
        return ListType(
            element_id,
            _infer_type(f"{path}.element", t.value_type, next_id),
            element_required=False,
        )
    if pa.types.is_struct(t):
        if t.num_fields == 0:
            raise fail("a struct needs at least one field")
        for i in range(t.num_fields):
            _check_name(f"{path}.{t.field(i).name}", t.field(i).name)
        ids = [next(next_id) for _ in range(t.num_fields)]
        return StructType(
            *(
                NestedField(
                    field_id,
                    t.field(i).name,
                    _infer_type(f"{path}.{t.field(i).name}", t.field(i).type, next_id),
                    required=False,
                )
                for i, field_id in enumerate(ids)
            )
        )
    if pa.types.is_null(t):
        raise fail("every value of the first batch is null; declare the column's type")
    raise fail("declare the column's type in the table's schema")
