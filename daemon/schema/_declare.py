"""Table declarations -> Iceberg: schema, partition spec and sort order.

A table is declared in the config as a list of column dicts plus ``partition_by``
and ``sort_by`` strings; this module turns those into pyiceberg objects.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

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
    IcebergType,
    NestedField,
    PrimitiveType,
)

from icespool.errors import SchemaError
from icespool.schema._grammar import parse_partition, parse_sort, parse_type_string

__all__ = ["parse_partition_spec", "parse_schema", "parse_sort_order", "parse_type"]

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
