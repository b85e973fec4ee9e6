"""Generated Iceberg schemas across the whole type matrix, and rows of any volume for them.

hypothesis draws the *shape*: columns of every primitive type (decimal precision and
scale, fixed length, timestamptz offsets...), structs, lists and maps nested in each
other, required or optional, and per primitive a distinctness mode:

- ``distinct``: a different value on every row (where the type's domain allows),
  spread over the whole range of the type;
- ``equal``: one drawn value on every row;
- ``pool``: a few drawn values (range edges included: year 1 and 9999, negative
  epochs, 00:00 and 23:59:59.999999, integer and decimal extremes) cycled.

Rows are then computed from the row id, so a shape drawn in microseconds yields 10,000+
rows without hypothesis generating each value. Values are kept in the form pyiceberg
reads back (``datetime``, ``UUID``, ``Decimal``, maps as lists of pairs); ``json_text``
and ``arrow_value`` spell them the way clients send them.
"""

from __future__ import annotations

import base64
import datetime as dt
import io
import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

import aiohttp
import pyarrow as pa
from hypothesis import strategies as st

from icespool.http import ARROW_STREAM, NDJSON
from icespool.schema import arrow_schema_for, parse_schema
from support.json_values import dumps, storage_type

__all__ = [
    "MAP_KEYS",
    "PRIMITIVES",
    "Column",
    "Node",
    "arrow_value",
    "column_values",
    "columns",
    "every_type",
    "http_bodies",
    "json_text",
    "nodes",
    "post_and_flush",
    "spell",
]

UTC = dt.UTC
_GOLDEN = 0x9E3779B97F4A7C15  # odd: i -> i * _GOLDEN is a bijection modulo any 2**k
_US_MIN = -62_135_596_800_000_000  # 0001-01-01T00:00:00
_US_MAX = 253_402_300_799_999_999  # 9999-12-31T23:59:59.999999
_DAY_MIN, _DAY_MAX = -719_162, 2_932_896  # 0001-01-01, 9999-12-31
_US_PER_DAY = 86_400_000_000
_EPOCH = dt.datetime(1970, 1, 1)
_EPOCH_DAY = dt.date(1970, 1, 1)

PRIMITIVES = (
    "boolean",
    "int",
    "long",
    "float",
    "double",
    "decimal",
    "date",
    "time",
    "timestamp",
    "timestamptz",
    "string",
    "uuid",
    "fixed",
    "binary",
)
MAP_KEYS = ("int", "long", "decimal", "date", "timestamp", "string", "uuid", "fixed")


@dataclass(frozen=True)
class Node:
    """One type in a generated schema, with how its values are made."""

    kind: str  # a PRIMITIVES name, or struct / list / map
    required: bool
    params: tuple[int, ...] = ()  # decimal (precision, scale); fixed (length,); tz offset minutes
    children: tuple[tuple[str, Node], ...] = ()  # struct fields; ("element",); ("key", "value")
    mode: str = "distinct"  # distinct | equal | pool
    pool: tuple[Any, ...] = ()
    null_every: int = 0  # optional values are null on rows id % null_every == 0 (0: never)
    salt: int = 0


@dataclass(frozen=True)
class Column:
    name: str
    node: Node


# ------------------------------------------------------------------ spelling


def spell(node: Node) -> str:
    """The type as the config spells it (``struct<a: uuid not null>``)."""
    if node.kind == "decimal":
        return f"decimal({node.params[0]},{node.params[1]})"
    if node.kind == "fixed":
        return f"fixed[{node.params[0]}]"
    if node.kind == "struct":
        return "struct<" + ", ".join(f"{n}: {_child(c)}" for n, c in node.children) + ">"
    if node.kind == "list":
        return f"list<{_child(node.children[0][1])}>"
    if node.kind == "map":
        return f"map<{spell(node.children[0][1])}, {_child(node.children[1][1])}>"
    return node.kind


def _child(node: Node) -> str:
    return spell(node) + (" not null" if node.required else "")


def columns(shape: list[Column]) -> list[dict[str, object]]:
    """The ``schema`` of a ``[[tables]]`` entry: a required ``id`` and the shape."""
    return [{"name": "id", "type": "long", "required": True}] + [
        {"name": c.name, "type": spell(c.node), "required": c.node.required} for c in shape
    ]


# ------------------------------------------------------------------ values by row


def _float32(value: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", value))[0])


def _spread(slot: int, salt: int, size: int) -> int:
    """A number in [0, size) scattered over the range; different for each slot when
    size is a power of two, almost always otherwise."""
    return ((slot + salt) * _GOLDEN) % size


def _decimal(unscaled: int, scale: int) -> Decimal:
    # From text: arithmetic (scaleb) would round to the context's 28 digits.
    return Decimal(f"{unscaled}E-{scale}")


def _distinct(node: Node, slot: int) -> Any:
    kind, salt = node.kind, node.salt
    if kind == "boolean":
        return slot % 2 == 0
    if kind == "int":
        return ((slot + salt) * _GOLDEN) % 2**32 - 2**31
    if kind == "long":
        return ((slot + salt) * _GOLDEN) % 2**64 - 2**63
    if kind == "float":
        return _float32((slot - 5_000) * 0.25)
    if kind == "double":
        # Odd mantissas over a wide exponent range: distinct, exact, both signs.
        return (-1) ** slot * float(2 * slot + 1) * 2.0 ** (slot % 1_200 - 600)
    if kind == "decimal":
        precision, scale = node.params[0], node.params[1]
        top = 10**precision - 1
        return _decimal(_spread(slot, salt, 2 * top + 1) - top, scale)
    if kind == "date":
        return _EPOCH_DAY + dt.timedelta(days=_DAY_MIN + _spread(slot, salt, _DAY_MAX - _DAY_MIN))
    if kind == "time":
        return (_EPOCH + dt.timedelta(microseconds=_spread(slot, salt, _US_PER_DAY))).time()
    if kind in ("timestamp", "timestamptz"):
        micros = _US_MIN + _spread(slot, salt, _US_MAX - _US_MIN + 1)
        stamp = _EPOCH + dt.timedelta(microseconds=micros)
        return stamp if kind == "timestamp" else stamp.replace(tzinfo=UTC)
    if kind == "string":
        return f"{salt}·é🙂-{slot}-" + "x" * (slot % 40)
    if kind == "uuid":
        return uuid.UUID(int=((slot + salt) * _GOLDEN) % 2**128)
    if kind == "fixed":
        length = node.params[0]
        return (_spread(slot, salt, 256**length)).to_bytes(length, "big")
    if kind == "binary":
        # 64+ bytes a value: an all-distinct column outgrows a 1 MiB dictionary page.
        return slot.to_bytes(8, "big") + bytes([salt % 256]) * (56 + slot % 9)
    raise AssertionError(kind)


def column_values(node: Node, slots: list[int]) -> list[Any]:
    """The value of ``node`` for each slot (row id, or position inside a nested value)."""
    values: list[Any]
    if node.kind == "struct":
        fields = [(name, column_values(child, slots)) for name, child in node.children]
        values = [{name: got[i] for name, got in fields} for i in range(len(slots))]
    elif node.kind in ("list", "map"):
        lengths = [(slot + node.salt) % 4 for slot in slots]
        inner = [slot * 4 + k for slot, n in zip(slots, lengths, strict=True) for k in range(n)]
        parts = [column_values(child, inner) for _, child in node.children]
        values, start = [], 0
        for n in lengths:
            if node.kind == "list":
                values.append(parts[0][start : start + n])
            else:  # a map's keys are distinct within the map
                keys, items = parts[0][start : start + n], parts[1][start : start + n]
                pairs = dict(zip(keys, items, strict=True))
                values.append(list(pairs.items()))
            start += n
    elif node.mode == "distinct":
        values = [_distinct(node, slot) for slot in slots]
    else:
        pool = node.pool
        values = [pool[(slot + node.salt) % len(pool)] for slot in slots]
    if node.null_every and not node.required:
        values = [
            None if slot % node.null_every == 0 else v
            for slot, v in zip(slots, values, strict=True)
        ]
    return values


# ------------------------------------------------------------------ client spellings


def json_text(node: Node, value: Any) -> str:
    if value is None:
        return "null"
    kind = node.kind
    if kind == "struct":
        fields = ",".join(
            f"{dumps(name)}:{json_text(child, value[name])}" for name, child in node.children
        )
        return "{" + fields + "}"
    if kind == "list":
        return "[" + ",".join(json_text(node.children[0][1], v) for v in value) + "]"
    if kind == "map":
        key, item = node.children[0][1], node.children[1][1]
        return (
            "["
            + ",".join(
                f'{{"key":{json_text(key, k)},"value":{json_text(item, v)}}}' for k, v in value
            )
            + "]"
        )
    if kind in ("fixed", "binary"):
        return dumps(base64.b64encode(value).decode())
    if kind == "decimal":
        # Both spellings the README allows; never exponent notation.
        text = format(value, "f")
        return text if value.is_signed() else dumps(text)
    if kind == "timestamptz":
        offset = dt.timezone(dt.timedelta(minutes=node.params[0] if node.params else 0))
        try:
            return dumps(value.astimezone(offset).isoformat())
        except OverflowError:  # the local time would fall outside years 1-9999
            return dumps(value.isoformat())
    if kind in ("date", "time", "timestamp"):
        return dumps(value.isoformat())
    if kind == "uuid":
        return dumps(str(value))
    return dumps(value)


def arrow_value(node: Node, value: Any) -> Any:
    """``value`` as ``pa.array`` takes it for the column's storage type (uuids as bytes)."""
    if value is None:
        return None
    if node.kind == "struct":
        return {name: arrow_value(child, value[name]) for name, child in node.children}
    if node.kind == "list":
        return [arrow_value(node.children[0][1], v) for v in value]
    if node.kind == "map":
        key, item = node.children[0][1], node.children[1][1]
        return [(arrow_value(key, k), arrow_value(item, v)) for k, v in value]
    if node.kind == "uuid":
        return value.bytes
    return value


# ------------------------------------------------------------------ every type at once


def every_type(kinds: tuple[str, ...] = PRIMITIVES) -> list[Column]:
    """A shape holding every primitive of ``kinds`` all-distinct, the temporal range
    edges, all-equal and all-null columns, and uuids nested in a struct, a list and a
    map (issue 11's failing shape)."""

    def leaf(kind: str, params: tuple[int, ...] = (), **extra: Any) -> Node:
        return Node(kind=kind, required=False, params=params, **extra)

    shape = [
        Column(f"p_{kind}", leaf(kind, {"decimal": (38, 10), "fixed": (16,)}.get(kind, ())))
        for kind in kinds
    ]
    uuid_leaf = leaf("uuid", null_every=5)
    low, high = dt.datetime(1, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59, 999_999)
    before_epoch = dt.datetime(1969, 12, 31, 23, 59, 59, 999_999)
    stamps = (low, high, before_epoch)
    shape += [
        Column("edge_ts", leaf("timestamp", mode="pool", pool=stamps)),
        Column(
            "edge_tstz",
            leaf(
                "timestamptz",
                (-60,),
                mode="pool",
                pool=tuple(s.replace(tzinfo=dt.UTC) for s in stamps),
            ),
        ),
        Column(
            "edge_day",
            leaf("date", mode="pool", pool=(low.date(), high.date(), before_epoch.date())),
        ),
        Column("edge_time", leaf("time", mode="pool", pool=(dt.time(0), high.time()))),
        Column("p_dec_frac", leaf("decimal", (38, 38))),
        Column("p_tstz_east", leaf("timestamptz", (14 * 60,))),
        Column("same_long", leaf("long", mode="equal", pool=(7,))),
        Column("same_stamp", leaf("timestamp", mode="equal", pool=(dt.datetime(1, 1, 1),))),
        Column("all_null", leaf("string", null_every=1)),
        Column(
            "buyer",
            Node(
                "struct",
                required=False,
                null_every=3,
                children=(
                    ("id", Node("uuid", required=True)),
                    ("name", leaf("string")),
                    ("tags", Node("list", required=True, children=(("element", uuid_leaf),))),
                ),
            ),
        ),
        Column(
            "by_key",
            Node(
                "map",
                required=False,
                children=(("key", Node("string", required=True)), ("value", uuid_leaf)),
            ),
        ),
    ]
    return [c for c in shape if c.node.kind in ("struct", "map") or c.node.kind in kinds]


# ------------------------------------------------------------------ HTTP bodies


async def _post(http: aiohttp.ClientSession, url: str, body: bytes, content_type: str) -> None:
    # A stream, not bytes: aiohttp warns that a large bytes body blocks the event loop.
    data = io.BytesIO(body)
    async with http.post(url, data=data, headers={"Content-Type": content_type}) as response:
        assert response.status == 200, await response.text()


def _arrow_body(shape: list[Column], ids: range, values: dict[str, list[Any]]) -> bytes:
    schema = arrow_schema_for(parse_schema(columns(shape)))
    data = {"id": pa.array(ids, pa.int64())}
    for column in shape:
        field = schema.field(column.name)
        # Clients send uuids as 16-byte binaries, nested ones too; conform() converts.
        data[column.name] = pa.array(
            [arrow_value(column.node, v) for v in values[column.name]],
            storage_type(field.type),
        )
    table = pa.table(data)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=4_000)  # several batches in one stream
    return sink.getvalue().to_pybytes()


def _ndjson_body(shape: list[Column], ids: range, values: dict[str, list[Any]]) -> bytes:
    lines = []
    for row, row_id in enumerate(ids):
        parts = [f'"id":{row_id}']
        for column in shape:
            value = values[column.name][row]
            if value is not None or row % 2:  # absent and explicit null, both
                parts.append(f"{dumps(column.name)}:{json_text(column.node, value)}")
        lines.append("{" + ",".join(parts) + "}\n")
    return "".join(lines).encode()


def http_bodies(shape: list[Column], values: dict[str, list[Any]]) -> list[tuple[bytes, str]]:
    """Rows ``0..n-1`` of ``values`` as request bodies: the first half as two NDJSON
    bodies (absent keys and explicit nulls), the second as one Arrow stream of
    several record batches."""
    count = len(next(iter(values.values()))) if values else 0
    half, quarter = count // 2, count // 4

    def rows(start: int, stop: int) -> dict[str, list[Any]]:
        return {name: column[start:stop] for name, column in values.items()}

    return [
        (_ndjson_body(shape, range(quarter), rows(0, quarter)), NDJSON),
        (_ndjson_body(shape, range(quarter, half), rows(quarter, half)), NDJSON),
        (_arrow_body(shape, range(half, count), rows(half, count)), ARROW_STREAM),
    ]


async def post_and_flush(
    http: aiohttp.ClientSession, url: str, table: str, bodies: list[tuple[bytes, str]]
) -> dict[str, Any]:
    """POST every body to ``table`` (each must answer 200), then flush: its JSON answer."""
    for body, content_type in bodies:
        await _post(http, f"{url}/v1/tables/{table}/records", body, content_type)
    async with http.post(f"{url}/v1/tables/{table}/flush") as response:
        assert response.status == 200, await response.text()
        flushed: dict[str, Any] = await response.json()
    return flushed


# ------------------------------------------------------------------ shapes


_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=20)
_US_EDGES = [_US_MIN, _US_MAX, -1, 0, -_US_PER_DAY - 1]


def _stamp(micros: int) -> dt.datetime:
    return _EPOCH + dt.timedelta(microseconds=micros)


def _pool_values(kind: str, params: tuple[int, ...]) -> st.SearchStrategy[Any]:
    """Values of one primitive, its range edges drawn often."""
    if kind == "decimal":
        top = 10 ** params[0] - 1
        return st.one_of(st.sampled_from([-top, top, 0, 1, -1]), st.integers(-top, top)).map(
            lambda u: _decimal(u, params[1])
        )
    if kind == "fixed":
        n = params[0]
        return st.sampled_from([b"\0" * n, b"\xff" * n]) | st.binary(min_size=n, max_size=n)
    if kind in ("timestamp", "timestamptz"):
        stamps = st.sampled_from(_US_EDGES).map(_stamp) | st.datetimes()
        return stamps if kind == "timestamp" else stamps.map(lambda d: d.replace(tzinfo=UTC))
    strategies: dict[str, st.SearchStrategy[Any]] = {
        "boolean": st.booleans(),
        "int": st.sampled_from([-(2**31), 2**31 - 1, 0]) | st.integers(-(2**31), 2**31 - 1),
        "long": st.sampled_from([-(2**63), 2**63 - 1, 0]) | st.integers(-(2**63), 2**63 - 1),
        "float": st.floats(width=32, allow_nan=False, allow_infinity=False),
        "double": st.floats(allow_nan=False, allow_infinity=False),
        "date": st.sampled_from([dt.date.min, dt.date.max, dt.date(1969, 12, 31)]) | st.dates(),
        "time": st.sampled_from([dt.time(0), dt.time(23, 59, 59, 999_999)]) | st.times(),
        "string": st.sampled_from(["", "é", "\0"]) | _TEXT,
        "uuid": st.uuids(),
        "binary": st.binary(max_size=30),
    }
    return strategies[kind]


@st.composite
def _primitive(draw: Callable[..., Any], kinds: tuple[str, ...], required: bool | None) -> Node:
    kind = draw(st.sampled_from(kinds))
    params: tuple[int, ...] = ()
    if kind == "decimal":
        precision = draw(st.sampled_from([1, 9, 10, 18, 19, 38]) | st.integers(1, 38))
        params = (precision, draw(st.sampled_from([0, precision]) | st.integers(0, precision)))
    elif kind == "fixed":
        params = (draw(st.sampled_from([1, 16]) | st.integers(1, 24)),)
    elif kind == "timestamptz":
        params = (draw(st.sampled_from([0, -14 * 60, 14 * 60]) | st.integers(-14 * 60, 14 * 60)),)
    mode = draw(st.sampled_from(["distinct", "equal", "pool"]))
    pool = draw(st.lists(_pool_values(kind, params), min_size=1, max_size=4))
    if mode == "equal":
        pool = pool[:1]
    return Node(
        kind=kind,
        required=draw(st.booleans()) if required is None else required,
        params=params,
        mode=mode,
        pool=tuple(pool),
        null_every=draw(st.sampled_from([0, 1, 2, 7])),
        salt=draw(st.integers(0, 1000)),
    )


def nodes(
    kinds: tuple[str, ...] = PRIMITIVES, keys: tuple[str, ...] = MAP_KEYS, depth: int = 2
) -> st.SearchStrategy[Node]:
    """Any type of the matrix (``kinds`` at the leaves, ``keys`` as map keys), nested
    ``depth`` deep."""
    leaf = _primitive(kinds, None)
    if depth == 0:
        return leaf
    inner = nodes(kinds, keys, depth - 1)

    @st.composite
    def nested(draw: Callable[..., Any]) -> Node:
        kind = draw(st.sampled_from(["struct", "list", "map"]))
        if kind == "struct":
            fields = draw(st.lists(inner, min_size=1, max_size=4))
            children = tuple((f"f{i}", child) for i, child in enumerate(fields))
        elif kind == "list":
            children = (("element", draw(inner)),)
        else:
            key = draw(_primitive(keys, True))
            children = (("key", replace(key, mode="distinct")), ("value", draw(inner)))
        return Node(
            kind=kind,
            required=draw(st.booleans()),
            children=children,
            null_every=draw(st.sampled_from([0, 3])),
            salt=draw(st.integers(0, 1000)),
        )

    return st.one_of(leaf, nested())
