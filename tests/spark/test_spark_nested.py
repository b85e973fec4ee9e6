"""Spark reads nested columns the daemon wrote: structs (nested in structs), lists (of
structs, with null elements), maps (string, int and nested values, maps of lists and of
structs), sent once as NDJSON and once as an Arrow IPC stream over real HTTP, compared
as Spark Row objects against the values sent."""

from __future__ import annotations

import datetime as dt
import io
import json
import uuid
from decimal import Decimal
from typing import Any

import aiohttp
import pyarrow as pa
from pyspark.sql import Row
from support.json_values import storage_type

from icespool.http import ARROW_STREAM, NDJSON
from icespool.schema import arrow_schema_for, parse_schema

TABLE = "n.nested"
COLUMNS: list[dict[str, object]] = [
    {"name": "id", "type": "long", "required": True},
    {
        "name": "st",
        "type": "struct<name: string not null, score: double, day: date, "
        "addr: struct<city: string, zip: int>, tags: list<string>>",
    },
    {"name": "nums", "type": "list<long not null>"},
    {"name": "pts", "type": "list<struct<x: int, y: int not null>>"},
    {"name": "attrs", "type": "map<string, long not null>"},
    {"name": "groups", "type": "map<string, list<string>>"},
    {"name": "dm", "type": "map<int, struct<d: decimal(10,2), t: timestamptz>>"},
]
SPARK_SCHEMA = [
    ("id", "bigint"),
    (
        "st",
        "struct<name:string,score:double,day:date,"
        "addr:struct<city:string,zip:int>,tags:array<string>>",
    ),
    ("nums", "array<bigint>"),
    ("pts", "array<struct<x:int,y:int>>"),
    ("attrs", "map<string,bigint>"),
    ("groups", "map<string,array<string>>"),
    ("dm", "map<int,struct<d:decimal(10,2),t:timestamp>>"),
]

PLUS2 = dt.timezone(dt.timedelta(hours=2))
# The logical values of each record (Python values; maps as dicts).
RECORDS: list[dict[str, Any]] = [
    {
        "st": {
            "name": "alpha",
            "score": 1.25,
            "day": dt.date(2024, 2, 29),
            "addr": {"city": "Zürich", "zip": 8001},
            "tags": ["a", None, ""],
        },
        "nums": [1, -(2**63), 2**63 - 1],
        "pts": [{"x": 1, "y": 2}, None, {"x": None, "y": 3}],
        "attrs": {"a": 1, "b": -1, "ключ": 2**40},
        "groups": {"g1": ["x", "y"], "g2": None, "g3": [], "g4": [None, "z"]},
        "dm": {
            1: {"d": Decimal("12345678.90"), "t": dt.datetime(2024, 2, 29, 23, 30, 0, 1, PLUS2)},
            -5: None,
            7: {"d": None, "t": None},
        },
    },
    {
        "st": {"name": "", "score": None, "day": None, "addr": None, "tags": None},
        "nums": [],
        "pts": [],
        "attrs": {},
        "groups": {},
        "dm": {},
    },
    {"st": None, "nums": None, "pts": None, "attrs": None, "groups": None, "dm": None},
    {
        "st": {
            "name": "✓",
            "score": -0.5,
            "day": dt.date(1970, 1, 1),
            "addr": {"city": None, "zip": None},
            "tags": [],
        },
        "nums": [0],
        "pts": [{"x": -1, "y": -2}],
        "attrs": {"": 0},
        "groups": {"k": [None]},
        "dm": {0: {"d": Decimal("-0.01"), "t": dt.datetime(1970, 1, 1, tzinfo=dt.UTC)}},
    },
]
NDJSON_IDS = [1, 2, 3, 4]
ARROW_IDS = [11, 12, 13, 14]


# ------------------------------------------------------------------ JSON input


def _json_value(value: Any) -> Any:
    """The JSON form of a logical value (README: maps are arrays of {"key", "value"})."""
    if isinstance(value, dict):
        return {k: _json_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_value(v) for v in value]
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, (dt.date, dt.datetime)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    return value


def _json_map(value: dict[Any, Any] | None) -> Any:
    if value is None:
        return None
    return [{"key": k, "value": _json_value(v)} for k, v in value.items()]


def _ndjson() -> str:
    lines = []
    for row_id, record in zip(NDJSON_IDS, RECORDS, strict=True):
        line = {
            "id": row_id,
            "st": _json_value(record["st"]),
            "nums": record["nums"],
            "pts": record["pts"],
            "attrs": _json_map(record["attrs"]),
            "groups": _json_map(record["groups"]),
            "dm": _json_map(record["dm"]),
        }
        lines.append(json.dumps(line, ensure_ascii=False) + "\n")
    return "".join(lines)


# ------------------------------------------------------------------ Arrow input


def _arrow_value(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _arrow_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_arrow_value(v) for v in value]
    if isinstance(value, uuid.UUID):
        return value.bytes
    return value


def _arrow_map(value: dict[Any, Any] | None) -> Any:
    return None if value is None else [(k, _arrow_value(v)) for k, v in value.items()]


def _arrow_stream() -> bytes:
    schema = arrow_schema_for(parse_schema(COLUMNS))
    columns: dict[str, pa.Array] = {"id": pa.array(ARROW_IDS, pa.int64())}
    for name in ("st", "nums", "pts"):
        values = [_arrow_value(r[name]) for r in RECORDS]
        columns[name] = pa.array(values, storage_type(schema.field(name).type))
    for name in ("attrs", "groups", "dm"):
        values = [_arrow_map(r[name]) for r in RECORDS]
        columns[name] = pa.array(values, storage_type(schema.field(name).type))
    table = pa.table(columns)
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


# ------------------------------------------------------------------ what Spark returns


def _local_naive(value: dt.datetime) -> dt.datetime:
    # PySpark returns a timestamp (with zone) as a naive datetime in the Python process's
    # local zone, whatever the session zone.
    return value.astimezone().replace(tzinfo=None)


def _expected_row(row_id: int, record: dict[str, Any]) -> Row:
    st = record["st"]
    spark_st = None
    if st is not None:
        addr = st["addr"]
        spark_st = Row(
            name=st["name"],
            score=st["score"],
            day=st["day"],
            addr=None if addr is None else Row(city=addr["city"], zip=addr["zip"]),
            tags=st["tags"],
        )
    pts = record["pts"]
    dm = record["dm"]
    return Row(
        id=row_id,
        st=spark_st,
        nums=record["nums"],
        pts=None if pts is None else [None if p is None else Row(x=p["x"], y=p["y"]) for p in pts],
        attrs=record["attrs"],
        groups=record["groups"],
        dm=None
        if dm is None
        else {
            k: None if v is None else Row(d=v["d"], t=v["t"] and _local_naive(v["t"]))
            for k, v in dm.items()
        },
    )


async def _post(session: aiohttp.ClientSession, url: str, body: bytes, content_type: str) -> None:
    async with session.post(
        f"{url}/v1/tables/{TABLE}/records", data=body, headers={"Content-Type": content_type}
    ) as response:
        assert response.status == 200, await response.text()
        assert await response.json() == {"accepted": len(RECORDS)}


async def test_spark_reads_nested_columns_written_as_ndjson_and_arrow(
    make_config: Any, run_daemon: Any, spark: Any, register: Any, catalog_name: str
) -> None:
    config = make_config(
        catalog={"name": catalog_name},
        tables=[{"name": TABLE, "create": True, "schema": COLUMNS}],
    )
    async with run_daemon(config) as (service, url), aiohttp.ClientSession() as session:
        await _post(session, url, _ndjson().encode(), NDJSON)
        ndjson_flush = await service.flush(TABLE)
        await _post(session, url, _arrow_stream(), ARROW_STREAM)
        arrow_flush = await service.flush(TABLE)
    assert (ndjson_flush.records, arrow_flush.records) == (4, 4)

    name = register(config)
    df = spark.table(f"{name}.{TABLE}")
    assert df.dtypes == SPARK_SCHEMA
    got = df.orderBy("id").collect()
    expected = [_expected_row(i, r) for i, r in zip(NDJSON_IDS, RECORDS, strict=True)] + [
        _expected_row(i, r) for i, r in zip(ARROW_IDS, RECORDS, strict=True)
    ]
    # Row equality is tuple equality: compare field names separately, at every level.
    assert got == expected
    assert [r.asDict(recursive=True) for r in got] == [r.asDict(recursive=True) for r in expected]
    # Both inputs produced the same values, row for row.
    assert [tuple(r)[1:] for r in got[:4]] == [tuple(r)[1:] for r in got[4:]]

    # Nested values are addressable from SQL too (the Iceberg field ids resolve).
    picked = spark.sql(
        f"SELECT id, st.addr.city, st.tags[2], pts[2].y, attrs['ключ'], groups['g4'][1], "
        f"CAST(dm[1].t AS STRING), dm[1].d FROM {name}.{TABLE} WHERE id IN (1, 11) ORDER BY id"
    ).collect()
    expected_picked = (
        "Zürich",
        "",
        3,
        2**40,
        "z",
        "2024-02-29 21:30:00.000001",
        Decimal("12345678.90"),
    )
    assert [tuple(r) for r in picked] == [(1, *expected_picked), (11, *expected_picked)]
    # Spark's own functions see the exact shapes: sizes and a map's keys (a null list or
    # map has no size: NULL, Spark 4's ANSI answer; Spark 3.5 said -1).
    sizes = spark.sql(
        f"SELECT id, size(nums), size(pts), size(attrs), map_keys(dm) FROM {name}.{TABLE} "
        "WHERE id < 10 ORDER BY id"
    ).collect()
    assert [tuple(r) for r in sizes] == [
        (1, 3, 3, 3, [1, -5, 7]),
        (2, 0, 0, 0, []),
        (3, None, None, None, None),
        (4, 1, 1, 1, [0]),
    ]


# ------------------------------------------------------------------ uuid inside nested types

U1 = uuid.UUID("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0")
U2 = uuid.UUID("ffffffff-0000-4000-8000-000000000001")
UUID_COLUMNS: list[dict[str, object]] = [
    {"name": "id", "type": "long", "required": True},
    {"name": "su", "type": "struct<u: uuid, n: int>"},
    {"name": "lu", "type": "list<uuid>"},
    {"name": "mu", "type": "map<string, uuid>"},
]


async def test_uuids_nested_in_struct_list_and_map_reach_spark_as_strings(
    make_config: Any, run_daemon: Any, spark: Any, register: Any, catalog_name: str
) -> None:
    """A uuid below a struct, list or map: the README allows any type at any depth. The
    NDJSON is accepted, and the flush must commit it for Spark (uuid -> string)."""
    config = make_config(
        catalog={"name": catalog_name},
        tables=[{"name": "n.uuids", "create": True, "schema": UUID_COLUMNS}],
    )
    body = (
        json.dumps(
            {
                "id": 1,
                "su": {"u": str(U1), "n": 1},
                "lu": [str(U1), None, str(U2)],
                "mu": [{"key": "a", "value": str(U2)}, {"key": "b", "value": None}],
            }
        )
        + "\n"
        + json.dumps({"id": 2, "su": {"u": None, "n": 2}, "lu": [], "mu": []})
        + "\n"
    )
    async with run_daemon(config) as (service, url), aiohttp.ClientSession() as session:
        async with session.post(
            f"{url}/v1/tables/n.uuids/records", data=body, headers={"Content-Type": NDJSON}
        ) as response:
            assert response.status == 200, await response.text()
        assert (await service.flush("n.uuids")).records == 2

    name = register(config)
    got = spark.table(f"{name}.n.uuids").orderBy("id").collect()
    assert [r.asDict(recursive=True) for r in got] == [
        {
            "id": 1,
            "su": {"u": str(U1), "n": 1},
            "lu": [str(U1), None, str(U2)],
            "mu": {"a": str(U2), "b": None},
        },
        {"id": 2, "su": {"u": None, "n": 2}, "lu": [], "mu": {}},
    ]
