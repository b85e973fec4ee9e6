"""When the JSON records of one input disagree on a field's type.

A new field is evolved (or a table inferred) with the type that holds every record's
value: pyarrow's inference already widens whole numbers and fractions to double, and
dates or timestamps mixed with other text to string. Other mixes (a number and a
string, an object and a number, ...) have no such type, since no Iceberg promotion
turns one into the other:

- an HTTP body (all or nothing) is refused whole, naming the field, both JSON types
  and the lines (`first_conflict`);
- Kafka records are inferred one by one and merged with `merge_inferred`, which keeps
  the type seen first: the table evolves for the records that fit it, and the others
  fail to decode into it and are refused by the evolution (``schema_change``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

__all__ = ["TypeConflict", "first_conflict", "json_kind", "merge_inferred"]


@dataclass(frozen=True, slots=True)
class TypeConflict:
    """Field ``path`` (dotted; ``element`` for a list's items) is ``first`` in record
    ``first_at`` and ``other`` in record ``other_at`` (1-based lines): JSON kinds."""

    path: str
    first: str
    first_at: int
    other: str
    other_at: int

    def problem(self) -> str:
        return (
            f"line {self.other_at} has {self.other} where line {self.first_at} has "
            f"{self.first}; no column type holds both (whole numbers and fractions make "
            "double, dates and other text make string), so nothing of the body was taken: "
            "send one type for the field"
        )


def json_kind(value: Any) -> str:
    """What a parsed JSON value is, as an error message names it ("a number", "null")."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, dict):
        return "an object"
    return "an array"


def first_conflict(lines: Iterable[bytes]) -> TypeConflict | None:
    """The first field whose JSON kind differs between two of ``lines`` (NDJSON lines,
    in order; blank or unparseable ones skipped: the decoder names those)."""
    seen: dict[tuple[str, ...], tuple[str, int]] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        found = _walk(record, (), number, seen)
        if found is not None:
            return found
    return None


def _walk(
    value: dict[str, Any] | list[Any],
    path: tuple[str, ...],
    line: int,
    seen: dict[tuple[str, ...], tuple[str, int]],
) -> TypeConflict | None:
    items = value.items() if isinstance(value, dict) else (("element", item) for item in value)
    for name, item in items:
        if item is None:  # a null fits any column type
            continue
        kind = json_kind(item)
        at = (*path, name)
        first = seen.setdefault(at, (kind, line))
        if first[0] != kind:
            return TypeConflict(".".join(at), first[0], first[1], kind, line)
        if isinstance(item, dict | list):
            found = _walk(item, at, line, seen)
            if found is not None:
                return found
    return None


def merge_inferred(first: pa.DataType, other: pa.DataType) -> pa.DataType:
    """The type holding values inferred as ``first`` and as ``other`` (pyarrow's own
    rules for one body), or ``first`` where none does (the values of ``other`` then do
    not decode into it)."""
    if first == other or pa.types.is_null(other):
        return first
    if pa.types.is_null(first):
        return other
    if {first, other} <= {pa.int64(), pa.float64()}:
        return pa.float64()
    texts = (pa.types.is_string(first), pa.types.is_string(other))
    temporal = (_temporal(first), _temporal(other))
    if (texts[0] and temporal[1]) or (temporal[0] and texts[1]):
        return pa.string()
    if pa.types.is_struct(first) and pa.types.is_struct(other):
        fields = {f.name: f.type for f in first}
        for field in other:
            mine = fields.get(field.name)
            fields[field.name] = field.type if mine is None else merge_inferred(mine, field.type)
        return pa.struct(list(fields.items()))
    if pa.types.is_list(first) and pa.types.is_list(other):
        return pa.list_(merge_inferred(first.value_type, other.value_type))
    return first


def _temporal(t: pa.DataType) -> bool:
    return bool(pa.types.is_timestamp(t) or pa.types.is_date(t))
