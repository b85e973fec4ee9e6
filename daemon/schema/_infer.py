"""Inference (an Iceberg schema from the Arrow schema of a first batch) and the
differences between a declared schema and an existing table's."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final, Literal

import pyarrow as pa
from pyiceberg.schema import Schema
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
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from icespool.errors import SchemaError
from icespool.schema._grammar import render_type

__all__ = ["MAX_INFERRED_FIELDS", "SchemaDifference", "infer_schema", "schema_diff"]

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
