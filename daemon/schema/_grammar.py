"""The column type grammar of ``[[tables]]`` schemas: Iceberg types, nested ones included.

One string per column, Spark-DDL-like so it stays on one TOML line::

    long | decimal(18,2) | fixed[16] | list<string> | map<string, long>
    struct<id: long not null, tags: list<string>, attrs: map<string, double not null>>

Nested fields, list elements and map values are optional unless followed by
``not null``; map keys are always required (Iceberg). Struct field names are
identifiers or back-quoted (`` `a b` ``). The parser lives in the config package so
that check-config rejects a bad type with the key, and the daemon builds its pyiceberg
schema from the same code.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Final, Literal

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
    TimestampNanoType,
    TimestampType,
    TimestamptzNanoType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

__all__ = [
    "PRIMITIVE_TYPES",
    "TYPE_HELP",
    "PartitionTerm",
    "count_columns",
    "parse_partition",
    "parse_sort",
    "parse_type_string",
    "render_type",
    "transform_accepts",
    "type_columns",
]

#: Primitive type keywords (format versions 1 and 2).
PRIMITIVE_TYPES: Final[dict[str, PrimitiveType]] = {
    "boolean": BooleanType(),
    "int": IntegerType(),
    "long": LongType(),
    "float": FloatType(),
    "double": DoubleType(),
    "date": DateType(),
    "time": TimeType(),
    "timestamp": TimestampType(),
    "timestamptz": TimestamptzType(),
    "string": StringType(),
    "uuid": UUIDType(),
    "binary": BinaryType(),
}
# Nanosecond timestamps exist only in table format version 3, and pyiceberg 0.12 cannot
# write v3 table metadata ("Writing V3 is not yet supported"), so a table using them
# could be neither created nor committed to.
_V3_ONLY: Final = {"timestamp_ns": "timestamp", "timestamptz_ns": "timestamptz"}

TYPE_HELP: Final = (
    "use boolean, int, long, float, double, decimal(P,S), date, time, timestamp, "
    "timestamptz, string, uuid, fixed[L], binary, list<T>, map<K, V> or "
    "struct<name: T, ...> (append 'not null' to a nested field, element or value to make "
    'it required), e.g. "map<string, list<long>>"'
)

_TOKEN: Final = re.compile(
    r"\s*(?:(?P<word>[A-Za-z_][A-Za-z0-9_]*)|(?P<number>\d+)|`(?P<quoted>[^`]+)`|(?P<sym>[<>,:()\[\]]))"
)

IdAllocator = Callable[[], int]


class _Final(ValueError):
    """A problem whose message already says the fix (no generic type list appended)."""


def _counter() -> IdAllocator:
    state = [0]

    def next_id() -> int:
        state[0] += 1
        return state[0]

    return next_id


class _Parser:
    def __init__(self, text: str, next_id: IdAllocator) -> None:
        self.text = text
        self.tokens = list(self._tokenize(text))
        self.position = 0
        self.next_id = next_id

    def _tokenize(self, text: str) -> Iterator[tuple[str, str]]:
        position = 0
        while position < len(text):
            if text[position:].strip() == "":
                return
            match = _TOKEN.match(text, position)
            if match is None:
                raise ValueError(f"unexpected character {text[position:].strip()[0]!r}")
            kind = match.lastgroup
            assert kind is not None
            yield kind, match.group(kind)
            position = match.end()

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def take(self) -> tuple[str, str]:
        token = self.peek()
        if token is None:
            raise ValueError("the type ends too early")
        self.position += 1
        return token

    def expect(self, symbol: str) -> None:
        kind, value = self.take()
        if kind != "sym" or value != symbol:
            raise ValueError(f"expected {symbol!r}, found {value!r}")

    def number(self) -> int:
        kind, value = self.take()
        if kind != "number":
            raise ValueError(f"expected a number, found {value!r}")
        return int(value)

    def not_null(self) -> bool:
        token = self.peek()
        if token is None or token[0] != "word" or token[1].lower() != "not":
            return False
        self.take()
        kind, value = self.take()
        if kind != "word" or value.lower() != "null":
            raise ValueError(f"expected 'not null', found 'not {value}'")
        return True

    def parse(self) -> IcebergType:
        result = self.type()
        if self.peek() is not None:
            raise ValueError(f"unexpected {self.peek()[1]!r} after the type")  # type: ignore[index]
        return result

    def type(self) -> IcebergType:
        kind, value = self.take()
        if kind != "word":
            raise ValueError(f"expected a type name, found {value!r}")
        word = value.lower()
        if word in PRIMITIVE_TYPES:
            return PRIMITIVE_TYPES[word]
        if word in _V3_ONLY:
            raise _Final(
                f"{word} needs Iceberg table format version 3, which pyiceberg 0.12 cannot "
                f"write yet; use {_V3_ONLY[word]} (microseconds)"
            )
        if word == "decimal":
            return self.decimal()
        if word == "fixed":
            return self.fixed()
        if word == "list":
            self.expect("<")
            element_id = self.next_id()
            element = self.type()
            required = self.not_null()
            self.expect(">")
            return ListType(element_id, element, element_required=required)
        if word == "map":
            self.expect("<")
            key_id, value_id = self.next_id(), self.next_id()
            key = self.type()
            if self.not_null():
                pass  # keys are required anyway; accept the redundant spelling
            self.expect(",")
            value_type = self.type()
            required = self.not_null()
            self.expect(">")
            return MapType(key_id, key, value_id, value_type, value_required=required)
        if word == "struct":
            return self.struct()
        raise ValueError(f"unknown type {value!r}")

    def decimal(self) -> DecimalType:
        self.expect("(")
        precision = self.number()
        self.expect(",")
        scale = self.number()
        self.expect(")")
        if not 1 <= precision <= 38 or scale > precision:
            raise _Final(
                f"decimal({precision},{scale}) needs 1 <= P <= 38 and 0 <= S <= P, "
                "e.g. decimal(18,2)"
            )
        return DecimalType(precision, scale)

    def fixed(self) -> FixedType:
        # Iceberg spells it fixed[L]; fixed(L) is accepted as well.
        kind, opening = self.take()
        if kind != "sym" or opening not in "[(":
            raise ValueError("fixed needs a length: fixed[16]")
        length = self.number()
        self.expect("]" if opening == "[" else ")")
        if length < 1:
            raise _Final("fixed length must be at least 1, e.g. fixed[16]")
        return FixedType(length)

    def struct(self) -> StructType:
        self.expect("<")
        fields: list[NestedField] = []
        seen: set[str] = set()
        while True:
            kind, name = self.take()
            if kind not in ("word", "quoted"):
                raise ValueError(f"expected a struct field name, found {name!r}")
            if name.lower() in seen:
                raise ValueError(f"struct field {name!r} appears twice")
            seen.add(name.lower())
            self.expect(":")
            field_id = self.next_id()
            field_type = self.type()
            required = self.not_null()
            fields.append(NestedField(field_id, name, field_type, required=required))
            kind, value = self.take()
            if kind == "sym" and value == ">":
                return StructType(*fields)
            if kind != "sym" or value != ",":
                raise ValueError(f"expected ',' or '>' in struct, found {value!r}")


def parse_type_string(text: str, next_id: IdAllocator | None = None) -> IcebergType:
    """Parse a column type; nested ids come from ``next_id``. ValueError names the problem."""
    if not text.strip():
        raise ValueError(f"the type is empty; {TYPE_HELP}")
    try:
        return _Parser(text, next_id or _counter()).parse()
    except _Final as exc:
        raise ValueError(f"type {text!r}: {exc}") from None
    except ValueError as exc:
        raise ValueError(f"type {text!r}: {exc}; {TYPE_HELP}") from None


def _name(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) else f"`{name}`"


def render_type(iceberg_type: IcebergType) -> str:
    """The canonical spelling of a type in this grammar (parse_type_string reads it back)."""
    if isinstance(iceberg_type, DecimalType):
        return f"decimal({iceberg_type.precision},{iceberg_type.scale})"
    if isinstance(iceberg_type, FixedType):
        return f"fixed[{len(iceberg_type)}]"
    if isinstance(iceberg_type, ListType):
        suffix = " not null" if iceberg_type.element_required else ""
        return f"list<{render_type(iceberg_type.element_type)}{suffix}>"
    if isinstance(iceberg_type, MapType):
        suffix = " not null" if iceberg_type.value_required else ""
        return (
            f"map<{render_type(iceberg_type.key_type)}, "
            f"{render_type(iceberg_type.value_type)}{suffix}>"
        )
    if isinstance(iceberg_type, StructType):
        inner = ", ".join(
            f"{_name(f.name)}: {render_type(f.field_type)}{' not null' if f.required else ''}"
            for f in iceberg_type.fields
        )
        return f"struct<{inner}>"
    if isinstance(iceberg_type, TimestampNanoType):
        return "timestamp_ns"
    if isinstance(iceberg_type, TimestamptzNanoType):
        return "timestamptz_ns"
    return str(iceberg_type)


def count_columns(fields: Iterable[NestedField]) -> int:
    """Columns of a schema's ``fields``: every field with an Iceberg field id (struct
    fields, list elements, map keys and values included)."""
    return sum(type_columns(f.field_type) for f in fields)


def type_columns(field_type: IcebergType) -> int:
    """Columns one field of ``field_type`` counts for: itself and its nested fields."""
    if isinstance(field_type, StructType):
        return 1 + count_columns(field_type.fields)
    if isinstance(field_type, ListType):
        return 1 + type_columns(field_type.element_type)
    if isinstance(field_type, MapType):
        return 1 + type_columns(field_type.key_type) + type_columns(field_type.value_type)
    return 1


_SORT_RE: Final = re.compile(
    r"^\s*(?P<term>.+?)(?:\s+(?P<direction>asc|desc))?(?:\s+nulls\s+(?P<nulls>first|last))?\s*$",
    re.IGNORECASE,
)


def parse_sort(spec: str) -> tuple[str, bool, bool]:
    """Split one ``sort_by`` entry into (term, descending, nulls_first).

    ``"ts"``, ``"id desc"``, ``"day(ts) asc nulls last"``; the term is a column or a
    partition-style transform of one. Nulls sort first for ascending and last for
    descending unless told otherwise (Spark's and Iceberg's defaults).
    """
    match = _SORT_RE.match(spec)
    if match is None or not match.group("term").strip():
        raise ValueError(
            f"{spec!r} is not a sort field; write 'col', 'col desc', 'col asc nulls last' "
            "or a transform such as 'day(ts) desc'"
        )
    descending = (match.group("direction") or "asc").lower() == "desc"
    nulls = match.group("nulls")
    nulls_first = (nulls.lower() == "first") if nulls else not descending
    return match.group("term").strip(), descending, nulls_first


# ------------------------------------------------------------------ partition_by terms


@dataclass(frozen=True, slots=True)
class PartitionTerm:
    """One parsed ``partition_by`` entry: ``day(ts)`` -> PartitionTerm("day", "ts")."""

    transform: Literal["identity", "year", "month", "day", "hour", "bucket", "truncate", "void"]
    column: str
    param: int | None = None  # bucket count or truncate width


_PARTITION_RE = re.compile(
    r"^\s*(?:(?P<fn>[A-Za-z_]+)\s*\(\s*(?:(?P<param>\d+)\s*,\s*)?(?P<arg>[^\s,()]+)\s*\)"
    r"|(?P<bare>[^\s,()]+))\s*$"
)
_TRANSFORM_ALIASES = {
    "identity": "identity",
    "year": "year",
    "years": "year",
    "month": "month",
    "months": "month",
    "day": "day",
    "days": "day",
    "date": "day",
    "hour": "hour",
    "hours": "hour",
    "bucket": "bucket",
    "truncate": "truncate",
    "void": "void",
}
_PARTITION_HELP = (
    "write 'col', 'identity(col)', 'year(col)', 'month(col)', 'day(col)', 'hour(col)', "
    "'bucket(N, col)', 'truncate(W, col)' or 'void(col)'"
)
# Which column types each transform accepts (Iceberg spec, "Partition Transforms").
_TEMPORAL = frozenset({"date", "timestamp", "timestamptz"})
_TRANSFORM_TYPES: dict[str, frozenset[str] | None] = {
    "identity": None,
    "void": None,
    "year": _TEMPORAL,
    "month": _TEMPORAL,
    "day": _TEMPORAL,
    "hour": frozenset({"timestamp", "timestamptz"}),
    "bucket": frozenset(
        {"int", "long", "date", "time", "timestamp", "timestamptz", "string", "uuid", "binary"}
    ),
    "truncate": frozenset({"int", "long", "string", "binary"}),
}


def parse_partition(spec: str) -> PartitionTerm:
    """Parse one ``partition_by`` entry; raises ValueError saying what is accepted."""
    m = _PARTITION_RE.match(spec)
    if m is None:
        raise ValueError(f"{spec!r} is not a partition field; {_PARTITION_HELP}")
    if m.group("bare") is not None:
        return PartitionTerm("identity", m.group("bare"))
    fn = m.group("fn").lower()
    transform = _TRANSFORM_ALIASES.get(fn)
    if transform is None:
        raise ValueError(f"{spec!r}: unknown transform {m.group('fn')!r}; {_PARTITION_HELP}")
    param = int(m.group("param")) if m.group("param") is not None else None
    if transform in ("bucket", "truncate"):
        if param is None or param < 1:
            raise ValueError(
                f"{spec!r}: {transform} needs a positive number first, e.g. "
                f"'{transform}(16, {m.group('arg')})'"
            )
    elif param is not None:
        raise ValueError(f"{spec!r}: {transform} takes only a column, e.g. '{fn}(col)'")
    return PartitionTerm(transform, m.group("arg"), param)  # type: ignore[arg-type]


def transform_accepts(transform: str, column_type: str) -> bool:
    """Whether a column of ``column_type`` (the config's spelling) can be the source
    of a ``transform`` partition field (Iceberg spec, "Partition Transforms")."""
    allowed = _TRANSFORM_TYPES[transform]
    if allowed is None:
        return True
    base = column_type.split("(")[0].split("[")[0]
    if base == "decimal":
        return transform in ("bucket", "truncate")
    if base == "fixed":
        return transform == "bucket"
    if "<" in column_type:
        return False  # struct, list and map columns cannot be partition sources
    return column_type in allowed
