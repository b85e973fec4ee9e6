"""Kafka format "avro": a real schema registry (Apicurio Registry's Confluent-compatible API,
support/apicurio.py), a real Apache Kafka broker, an in-process daemon, and the rows read back
from Iceberg through pyiceberg. Producers register their schemas as a Confluent serializer
does and write the Confluent wire format (byte 0, the 4-byte schema id, Avro binary).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import json
import time
import uuid
from collections import Counter
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from support.apicurio import CCOMPAT, PASSWORD, USERNAME, ApicurioRegistry
from support.kafka_harness import (
    SESSION_TIMEOUT,
    Broker,
    create_topic,
    produce_values,
    unique_name,
)
from support.proxy import Mode, TcpProxy
from support.service_helpers import metric, table_rows, wait_rows

from icespool.config import Config, redacted
from icespool.decode import AvroValues, Decoded, RecordArrays, Target
from icespool.decode._avro_registry import AvroSchemas, RegistrySchemas
from icespool.errors import ConfigError
from icespool.lifecycle.service import Icespool
from icespool.schema import arrow_schema_for, parse_schema

MakeConfig = Callable[..., Config]
UTC = dt.UTC
TABLE = "demo.avro_events"
# A schema id no registry here hands out: a registry's ids count up from 1.
UNKNOWN_ID = 2**31 - 1

# Every column type a table supports, plus `note`, which only schema version 2 has.
COLUMNS: list[dict[str, Any]] = [
    {"name": "id", "type": "long", "required": True},
    {"name": "flag", "type": "boolean"},
    {"name": "small", "type": "int"},
    {"name": "ratio", "type": "float"},
    {"name": "score", "type": "double"},
    {"name": "amount", "type": "decimal(12,3)"},
    {"name": "day", "type": "date"},
    {"name": "tod", "type": "time"},
    {"name": "local_ts", "type": "timestamp"},
    {"name": "ts", "type": "timestamptz"},
    {"name": "name", "type": "string"},
    {"name": "uid", "type": "uuid"},
    {"name": "digest", "type": "fixed[4]"},
    {"name": "blob", "type": "binary"},
    {"name": "point", "type": "struct<x: int, y: double>"},
    {"name": "tags", "type": "list<string>"},
    {"name": "attrs", "type": "map<string, long>"},
    {"name": "note", "type": "string"},
]

METADATA = [{"name": "_kafka_offset", "type": "long"}, {"name": "_kafka_key", "type": "binary"}]


def _optional(avro_type: Any) -> list[Any]:
    return ["null", avro_type]


def _schema(version: int, amount_precision: int = 12) -> dict[str, Any]:
    """Version 1 and 2 encode the same columns differently (bytes vs fixed decimals,
    micros vs millis); version 2 adds the optional field `note`."""
    if version == 1:
        amount: dict[str, Any] = {"type": "bytes"}
        tod = {"type": "long", "logicalType": "time-micros"}
        local_ts = {"type": "long", "logicalType": "local-timestamp-micros"}
        ts = {"type": "long", "logicalType": "timestamp-millis"}
    else:
        amount = {"type": "fixed", "name": "Amount", "size": 8}
        tod = {"type": "int", "logicalType": "time-millis"}
        local_ts = {"type": "long", "logicalType": "local-timestamp-millis"}
        ts = {"type": "long", "logicalType": "timestamp-micros"}
    amount.update(logicalType="decimal", precision=amount_precision, scale=3)
    fields: list[dict[str, Any]] = [
        {"name": "id", "type": "long"},
        {"name": "flag", "type": _optional("boolean")},
        {"name": "small", "type": _optional("int")},
        {"name": "ratio", "type": _optional("float")},
        {"name": "score", "type": _optional("double")},
        {"name": "amount", "type": _optional(amount)},
        {"name": "day", "type": _optional({"type": "int", "logicalType": "date"})},
        {"name": "tod", "type": _optional(tod)},
        {"name": "local_ts", "type": _optional(local_ts)},
        {"name": "ts", "type": _optional(ts)},
        {"name": "name", "type": _optional("string")},
        {"name": "uid", "type": _optional({"type": "string", "logicalType": "uuid"})},
        {"name": "digest", "type": _optional({"type": "fixed", "name": "Digest", "size": 4})},
        {"name": "blob", "type": _optional("bytes")},
        {
            "name": "point",
            "type": _optional(
                {
                    "type": "record",
                    "name": "Point",
                    "fields": [{"name": "x", "type": "int"}, {"name": "y", "type": "double"}],
                }
            ),
        },
        {"name": "tags", "type": _optional({"type": "array", "items": "string"})},
        {"name": "attrs", "type": _optional({"type": "map", "values": "long"})},
    ]
    if version == 2:
        fields.append({"name": "note", "type": ["null", "string"], "default": None})
    return {"type": "record", "name": "Event", "namespace": "demo", "fields": fields}


def _record(i: int, version: int) -> dict[str, Any]:
    """What the producer sends for event ``i`` (every 9th has every optional field null)."""
    record: dict[str, Any] = {name["name"]: None for name in COLUMNS}
    record["id"] = i
    if version == 1:
        del record["note"]
    if i % 9 == 4:
        return record
    millis = version == 2
    record.update(
        flag=i % 2 == 0,
        small=-(2**31) if i % 5 == 0 else i * 7,
        ratio=i + 0.25,  # exact in a float
        score=i / 3,
        amount=Decimal(f"{-i if i % 4 else i}.{i % 1000:03d}"),
        day=dt.date(2020, 2, 29) + dt.timedelta(days=i),
        tod=dt.time(i % 24, i % 60, 5, 123000 if millis else 123456),
        local_ts=dt.datetime(2024, 3, 1, 12, 0, 0, 250000) + dt.timedelta(seconds=i),
        ts=dt.datetime(2024, 3, 1, 23, 59, 59, 999000 if not millis else 999999, tzinfo=UTC)
        + dt.timedelta(minutes=i),
        name=f"événement {i}",
        uid=uuid.UUID(int=i * 0x9E3779B97F4A7C15),
        digest=i.to_bytes(4, "big"),
        blob=bytes(range(i % 7)),
        point={"x": i, "y": i * 1.5},
        tags=[f"t{j}" for j in range(i % 4)],
        attrs={f"k{j}": i * 1000 + j for j in range(i % 3)},
    )
    if version == 2:
        record["note"] = f"note {i}" if i % 3 else None
    return record


def _expected(record: dict[str, Any]) -> dict[str, Any]:
    """The row pyiceberg reads back for ``record``."""
    row = {c["name"]: None for c in COLUMNS} | record
    if row["uid"] is not None:
        row["uid"] = row["uid"].bytes
    if row["attrs"] is not None:
        row["attrs"] = list(row["attrs"].items())
    return row


def _normalized(row: dict[str, Any]) -> dict[str, Any]:
    if isinstance(row["uid"], uuid.UUID):
        row["uid"] = row["uid"].bytes
    return row


def _avro(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def _framed(schema_id: int, body: bytes) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + body


# ------------------------------------------------------------------ helpers


# ------------------------------------------------------------------ end to end


def _registry_source(registry: ApicurioRegistry, **source: Any) -> dict[str, Any]:
    """A ``[[kafka]]`` section reading Avro through ``registry`` with its credentials."""
    return source | {
        "format": "avro",
        "schema_registry_url": registry.url,
        "schema_registry_username": USERNAME,
        "schema_registry_password": PASSWORD,
    }


async def test_registry_framed_avro_lands_every_type_exactly_and_poison_is_dead_lettered(
    make_config: MakeConfig, broker: Broker, schema_registry: ApicurioRegistry
) -> None:
    topic = unique_name("avro-registry")
    await create_topic(broker.bootstrap, topic, 1)
    # Three versions of the topic's value subject: the two encodings of the columns, and
    # one whose decimal is wider than the table's column.
    subject = f"{topic}-value"
    ids = {version: schema_registry.register(subject, _schema(version)) for version in (1, 2)}
    wide = schema_registry.register(subject, _schema(1, amount_precision=20))
    assert len({*ids.values(), wide}) == 3
    mark = schema_registry.log_mark()
    values: list[bytes | None] = []
    expected: dict[int, dict[str, Any]] = {}
    dead: dict[int, tuple[str, str]] = {}  # offset -> (reason, error fragment)
    for i in range(400):
        version = 1 + i % 2  # both schema versions, interleaved
        record = _record(i, version)
        body = _avro(_schema(version), record)
        if i % 50 == 11:
            values.append(_framed(UNKNOWN_ID, body))
            dead[i] = (
                "schema_unavailable",
                f"schema id {UNKNOWN_ID} unavailable after 3 tries: the registry answered "
                f"404: Schema {UNKNOWN_ID} not found.",
            )
        elif i % 50 == 23:
            values.append(_framed(ids[version], body[: len(body) // 2]))
            dead[i] = ("invalid", f"not Avro of schema id {ids[version]}")
        elif i % 50 == 30:
            values.append(b"\x01" + _framed(ids[version], body)[1:])
            dead[i] = ("invalid", "magic byte is 1, not 0")
        elif i % 50 == 31:
            values.append(b"\x00\x00\x01")
            dead[i] = ("invalid", "too short for the Confluent wire format")
        elif i % 50 == 37:
            # Written with decimal(20,3): 10^10 does not fit the table's decimal(12,3).
            record = _record(i, 1) | {"amount": Decimal("12345678901.5")}
            values.append(_framed(wide, _avro(_schema(1, amount_precision=20), record)))
            dead[i] = ("invalid", "column 'amount'")
        elif i % 50 == 45:
            values.append(None)
            dead[i] = ("empty", "no value")
        else:
            values.append(_framed(ids[version], body))
            expected[i] = _expected(record)
    await produce_values(broker.bootstrap, topic, values)
    config = make_config(
        tables=[{"name": TABLE, "create": True, "schema": [*COLUMNS, *METADATA]}],
        defaults={"batch_timeout": "1s"},
        kafka=[
            _registry_source(
                schema_registry,
                bootstrap_servers=broker.bootstrap,
                topics=[topic],
                group_id=f"g-{topic}",
                session_timeout=SESSION_TIMEOUT,
                table=TABLE,
                metadata_columns=["_kafka_offset", "_kafka_key"],
                offset_commit_interval="1s",
            )
        ],
    )
    async with Icespool(config) as service:
        await wait_rows(service, TABLE, len(expected))
        await wait_rows(service, f"{TABLE}_dead_letter", len(dead))
        await asyncio.sleep(1.5)  # nothing more arrives
        rows = await asyncio.to_thread(table_rows, service, TABLE)
        dead_rows = await asyncio.to_thread(table_rows, service, f"{TABLE}_dead_letter")
        assert len(rows) == len(expected)
        by_id = {row["id"]: _normalized(row) for row in rows}
        assert sorted(by_id) == sorted(expected)
        for i, want in expected.items():
            # Offset and key stay with their row although the two schema versions are
            # decoded as separate groups (one partition: offset i is record i).
            assert by_id[i] == want | {"_kafka_offset": i, "_kafka_key": str(i).encode()}, i
        assert sorted(d["offset"] for d in dead_rows) == sorted(dead)
        for d in dead_rows:
            reason, fragment = dead[d["offset"]]
            assert (d["reason"], d["topic"], d["target_table"]) == (reason, topic, TABLE), d
            assert fragment in d["error"], d
            if reason == "schema_unavailable":
                assert d["error"] == fragment, d  # the registry's own words, the id named
            assert d["value"] == values[d["offset"]]
        for reason, count in Counter(r for r, _ in dead.values()).items():
            counted = metric(service, "icespool_dead_letters_total", table=TABLE, reason=reason)
            assert counted == count, reason
    # Each known schema was fetched once (cached after); the unknown id was tried 3
    # times, then remembered as unavailable for the rest of the (quick) run. (The
    # registry answers 401 to a request without the configured credentials: the rows
    # landing at all say they were sent.)
    assert schema_registry.lookups(mark) == {ids[1]: 1, ids[2]: 1, wide: 1, UNKNOWN_ID: 3}


# Version 1 and 2 of a subject under BACKWARD compatibility: 2 adds a field with a default.
_READING_V1: dict[str, Any] = {
    "type": "record",
    "name": "Reading",
    "namespace": "demo",
    "fields": [{"name": "id", "type": "long"}, {"name": "name", "type": "string"}],
}
_READING_V2: dict[str, Any] = _READING_V1 | {
    "fields": [*_READING_V1["fields"], {"name": "note", "type": "string", "default": "none"}]
}


async def test_a_version_registered_while_the_daemon_runs_is_fetched_when_first_seen(
    make_config: MakeConfig, broker: Broker, schema_registry: ApicurioRegistry
) -> None:
    topic = unique_name("avro-evolve")
    await create_topic(broker.bootstrap, topic, 1)
    subject = f"{topic}-value"
    v1 = schema_registry.register(subject, _READING_V1)
    schema_registry.set_compatibility(subject, "BACKWARD")
    mark = schema_registry.log_mark()
    first = [{"id": i, "name": f"r{i}"} for i in range(100)]
    await produce_values(
        broker.bootstrap, topic, [_framed(v1, _avro(_READING_V1, r)) for r in first]
    )
    table = "demo.readings"
    columns = [
        {"name": "id", "type": "long", "required": True},
        {"name": "name", "type": "string"},
        {"name": "note", "type": "string"},
    ]
    config = make_config(
        tables=[{"name": table, "create": True, "schema": columns}],
        defaults={"batch_timeout": "1s"},
        kafka=[
            _registry_source(
                schema_registry,
                bootstrap_servers=broker.bootstrap,
                topics=[topic],
                group_id=f"g-{topic}",
                session_timeout=SESSION_TIMEOUT,
                table=table,
                offset_commit_interval="1s",
            )
        ],
    )
    async with Icespool(config) as service:
        await wait_rows(service, table, len(first))
        # The producer moves to version 2 while the daemon runs: the registry accepts it
        # under BACKWARD (the new field has a default), and the daemon meets its id only
        # in the records that follow.
        v2 = schema_registry.register(subject, _READING_V2)
        assert v2 != v1
        second = [
            {"id": i, "name": f"r{i}", "note": f"n{i}" if i % 2 else "none"}
            for i in range(100, 200)
        ]
        await produce_values(
            broker.bootstrap, topic, [_framed(v2, _avro(_READING_V2, r)) for r in second]
        )
        await wait_rows(service, table, len(first) + len(second))
        await asyncio.sleep(1.5)  # nothing more arrives
        rows = await asyncio.to_thread(table_rows, service, table)
        assert await asyncio.to_thread(table_rows, service, f"{table}_dead_letter") == []
    assert sorted(r["id"] for r in rows) == list(range(200))  # every id once
    # A version-1 record has no `note`: the column is null (no reader schema fills in
    # version 2's default).
    assert sorted(rows, key=lambda r: r["id"]) == [r | {"note": None} for r in first] + second
    assert schema_registry.lookups(mark) == {v1: 1, v2: 1}


async def test_fixed_schema_file_with_header_routing(
    make_config: MakeConfig, broker: Broker, tmp_path: Path
) -> None:
    topic = unique_name("avro-file")
    await create_topic(broker.bootstrap, topic, 2)
    schema = {
        "type": "record",
        "name": "Reading",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
            {"name": "values", "type": {"type": "array", "items": "double"}},
            {"name": "unit", "type": {"type": "enum", "name": "Unit", "symbols": ["C", "F"]}},
        ],
    }
    schema_file = tmp_path / "reading.avsc"
    schema_file.write_text(json.dumps(schema))
    columns = [
        {"name": "id", "type": "long", "required": True},
        {"name": "at", "type": "timestamptz"},
        {"name": "values", "type": "list<double>"},
        {"name": "unit", "type": "string"},
        {"name": "site", "type": "string"},  # not in the Avro schema: null
    ]
    start = dt.datetime(2025, 1, 1, tzinfo=UTC)
    sent = [
        {
            "id": i,
            "at": start + dt.timedelta(microseconds=i * 1001),
            "values": [i / 2] * (i % 3),
            "unit": "CF"[i % 2],
        }
        for i in range(200)
    ]
    values: list[bytes | None] = [_avro(schema, r) for r in sent]
    values[17] = values[17][:3]  # cut inside the record
    values[18] = values[18] + b"\x02"  # a byte after the record
    routes = ["north" if i % 3 else "south" for i in range(200)]
    routes[40] = "west"  # no such table
    config = make_config(
        tables=[
            {"name": "demo.readings_north", "create": True, "schema": columns},
            {"name": "demo.readings_south", "create": True, "schema": columns},
        ],
        defaults={"batch_timeout": "1s"},
        kafka=[
            {
                "bootstrap_servers": broker.bootstrap,
                "topics": [topic],
                "group_id": f"g-{topic}",
                "session_timeout": SESSION_TIMEOUT,
                "route_header": "site",
                "table_template": "demo.readings_{value}",
                "format": "avro",
                "avro_schema_file": str(schema_file),
                "offset_commit_interval": "1s",
            }
        ],
    )
    await produce_values(
        broker.bootstrap,
        topic,
        values,
        partition_of=lambda i: i % 2,
        headers_of=lambda i: [("site", routes[i].encode())],
    )
    bad = {
        17: ("invalid", "not Avro of reading.avsc: the value is cut short"),
        18: ("invalid", "1 byte(s) left after the record"),
    }
    bad[40] = ("unknown_route", "'demo.readings_west' is not a configured table")
    want = {
        site: sorted(i for i in range(200) if routes[i] == site and i not in bad)
        for site in ("north", "south")
    }
    async with Icespool(config) as service:
        for site, ids in want.items():
            await wait_rows(service, f"demo.readings_{site}", len(ids))
        await wait_rows(service, "demo.kafka_dead_letter", len(bad))
        await asyncio.sleep(1.5)
        for site, ids in want.items():
            rows = await asyncio.to_thread(table_rows, service, f"demo.readings_{site}")
            assert sorted(r["id"] for r in rows) == ids
            for row in rows:
                assert row == sent[row["id"]] | {"site": None}
        dead_rows = await asyncio.to_thread(table_rows, service, "demo.kafka_dead_letter")
        got = {(d["partition"], d["offset"]): d for d in dead_rows}
        # Partition i % 2, offset i // 2.
        assert sorted(got) == sorted((i % 2, i // 2) for i in bad)
        for i, (reason, fragment) in bad.items():
            d = got[(i % 2, i // 2)]
            assert d["reason"] == reason and fragment in d["error"], d
            assert d["value"] == values[i]


# ------------------------------------------------------------------ decoder and client


def _fetch(values: list[bytes | None]) -> RecordArrays:
    return RecordArrays(values)


def _decode_avro(records: RecordArrays, schema: pa.Schema, *, schemas: AvroSchemas) -> Decoded:
    return AvroValues(lambda: schemas).decode(records, Target("t", schema))


@pytest.mark.parametrize(
    ("mode", "cause", "waits"),
    [
        ("refuse", "[Errno 111] Connection refused", 0.0),
        ("silent", "timed out", 1.5),  # three requests of 0.5 s that get no answer
    ],
)
def test_a_registry_outage_dead_letters_after_3_tries_and_the_schema_is_fetched_once_back(
    schema_registry: ApicurioRegistry, mode: Mode, cause: str, waits: float
) -> None:
    schema = arrow_schema_for(parse_schema(COLUMNS))
    schema_id = schema_registry.register(f"{unique_name('avro-outage')}-value", _schema(1))
    body = _framed(schema_id, _avro(_schema(1), _record(1, 1)))
    mark = schema_registry.log_mark()
    with TcpProxy(("127.0.0.1", schema_registry.port)) as proxy:
        url = f"http://127.0.0.1:{proxy.port}{CCOMPAT}"
        schemas = RegistrySchemas(url, USERNAME, PASSWORD, timeout=0.5)
        proxy.mode = mode
        began = time.monotonic()
        decoded = _decode_avro(_fetch([body, body]), schema, schemas=schemas)
        took = time.monotonic() - began
        failed_at = time.monotonic()
        error = (
            f"schema id {schema_id} unavailable after 3 tries: the registry is unreachable: {cause}"
        )
        assert decoded.batch is None and decoded.rows.tolist() == []
        assert [(d.index, d.reason, d.error) for d in decoded.dead] == [
            (0, "schema_unavailable", error),
            (1, "schema_unavailable", error),
        ]
        # One lookup for both records: two pauses (0.25 s + 0.75 s) and the requests.
        assert 1.0 + waits <= took < 3.0 + waits
        # Back, but the failure is remembered for 5 s: records meanwhile are dead letters
        # at once, without a request. (The requests a silent proxy holds are dropped first:
        # forwarded now, they would reach the registry after their client gave up.)
        proxy.mode = "reset"
        proxy.mode = "forward"
        began = time.monotonic()
        again = _decode_avro(_fetch([body]), schema, schemas=schemas)
        assert time.monotonic() - began < 0.5
        assert [(d.index, d.reason, d.error) for d in again.dead] == [
            (0, "schema_unavailable", error)
        ]
        time.sleep(max(0.0, failed_at + 5.2 - time.monotonic()))
        back = _decode_avro(_fetch([body, body]), schema, schemas=schemas)
        assert back.dead == [] and back.rows.tolist() == [0, 1]
        assert back.batch is not None and back.batch.column("id").to_pylist() == [1, 1]
    # Nothing reached the registry during the outage.
    assert schema_registry.lookups(mark) == {schema_id: 1}


def test_credentials_the_registry_refuses_make_dead_letters_without_retrying(
    schema_registry: ApicurioRegistry,
) -> None:
    schema = arrow_schema_for(parse_schema(COLUMNS))
    schema_id = schema_registry.register(f"{unique_name('avro-auth')}-value", _schema(1))
    body = _framed(schema_id, _avro(_schema(1), _record(1, 1)))
    mark = schema_registry.log_mark()
    for username, password, detail in [
        (USERNAME, "wrong", ""),  # Apicurio answers a bad password with an empty body
        (None, None, ": User is not authenticated."),
    ]:
        schemas = RegistrySchemas(schema_registry.url, username, password)
        decoded = _decode_avro(_fetch([body]), schema, schemas=schemas)
        # Not retried: one try, one lookup each (below), no backoff pause.
        error = f"schema id {schema_id} unavailable after 1 try: the registry answered 401"
        assert [(d.index, d.reason, d.error) for d in decoded.dead] == [
            (0, "schema_unavailable", error + detail)
        ]
    assert schema_registry.lookups(mark) == {schema_id: 2}


async def test_schemas_are_cached_and_fields_map_to_columns_by_name(
    schema_registry: ApicurioRegistry,
) -> None:
    # A schema whose fields come in another order than the table's columns, a nested
    # record with a field the table's struct lacks, one that is not a record, and a JSON
    # Schema (a topic whose producer registered JSON, not Avro).
    reordered = {
        "type": "record",
        "name": "R",
        "fields": [
            {"name": "name", "type": "string"},
            {"name": "id", "type": "long"},
            {
                "name": "point",
                "type": {
                    "type": "record",
                    "name": "P",
                    "fields": [
                        {"name": "y", "type": "double"},
                    ],
                },
            },
        ],
    }
    extra = json.loads(json.dumps(reordered))
    extra["fields"][2]["type"]["fields"].append({"name": "z", "type": "int"})
    array = {"type": "array", "items": "long"}
    json_schema = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {"id": {"type": "integer"}},
    }
    name = unique_name("avro-shapes")
    ids = {
        "reordered": schema_registry.register(f"{name}-reordered-value", reordered),
        "extra": schema_registry.register(f"{name}-extra-value", extra),
        "array": schema_registry.register(f"{name}-array-value", array),
        "events": schema_registry.register(f"{name}-events-value", _schema(2)),
        "json": schema_registry.register(f"{name}-json-value", json.dumps(json_schema), "JSON"),
    }
    assert len(set(ids.values())) == len(ids)
    mark = schema_registry.log_mark()
    schema = arrow_schema_for(parse_schema(COLUMNS))
    schemas = RegistrySchemas(schema_registry.url, USERNAME, PASSWORD)
    reordered_id = ids["reordered"]
    values: list[bytes | None] = [
        _framed(reordered_id, _avro(reordered, {"name": "a", "id": 1, "point": {"y": 0.5}})),
        _framed(ids["extra"], _avro(extra, {"name": "b", "id": 2, "point": {"y": 1.0, "z": 3}})),
        _framed(reordered_id, _avro(reordered, {"name": "c", "id": 3, "point": {"y": 2.5}})),
        _framed(ids["array"], _avro(array, [1, 2])),
        _framed(ids["events"], _avro(_schema(2), _record(4, 2))),  # optional fields null
        _framed(reordered_id, _avro(reordered, {"name": "e", "id": 5, "point": {"y": 4.5}})),
        _framed(ids["json"], json.dumps({"id": 6}).encode()),
    ]
    for _ in range(2):
        decoded = await asyncio.to_thread(_decode_avro, _fetch(values), schema, schemas=schemas)
        assert decoded.batch is not None
        # Rows come back in fetch order although each schema id is decoded apart.
        assert decoded.rows.tolist() == [0, 2, 4, 5]
        assert decoded.batch.select(["id", "name", "point", "amount"]).to_pylist() == [
            {"id": 1, "name": "a", "point": {"x": None, "y": 0.5}, "amount": None},
            {"id": 3, "name": "c", "point": {"x": None, "y": 2.5}, "amount": None},
            {"id": 4, "name": None, "point": None, "amount": None},
            {"id": 5, "name": "e", "point": {"x": None, "y": 4.5}, "amount": None},
        ]
        assert [(d.index, d.reason, d.error) for d in decoded.dead] == [
            (
                1,
                "invalid",
                f"schema id {ids['extra']}: column 'point.z': Avro field is not in the "
                "table's struct",
            ),
            (
                3,
                "invalid",
                f"schema id {ids['array']}: the top-level Avro schema must be a record, not array",
            ),
            (6, "invalid", f"schema id {ids['json']} is a JSON schema, not Avro"),
        ]
    # Each fetched once: the second pass is served from the cache (a schema that is not
    # Avro is remembered as unusable, as any failure is, for 5 s).
    assert schema_registry.lookups(mark) == dict.fromkeys(ids.values(), 1)


# ------------------------------------------------------------------ config


def _kafka_config(make_config: MakeConfig, **kafka: Any) -> Config:
    source = {"bootstrap_servers": "127.0.0.1:9092", "topics": ["t"], "table": "demo.t"} | kafka
    if source["table"] is None:
        del source["table"]
    return make_config(
        tables=[{"name": "demo.t", "create": True, "schema": [{"name": "a", "type": "long"}]}],
        kafka=[source],
    )


@pytest.mark.parametrize(
    ("kafka", "key", "fragment"),
    [
        ({"format": "avro"}, "kafka[0].schema_registry_url", "exactly one of"),
        (
            {"format": "avro", "schema_registry_url": "http://r:8081", "avro_schema_file": "x"},
            "kafka[0].schema_registry_url",
            "exactly one of",
        ),
        (
            {"format": "json", "schema_registry_url": "http://r:8081"},
            "kafka[0].schema_registry_url",
            'only used with format = "avro"',
        ),
        (
            {"format": "avro", "avro_schema_file": "/nonexistent/x.avsc"},
            "kafka[0].avro_schema_file",
            "cannot read '/nonexistent/x.avsc'",
        ),
        (
            {
                "format": "avro",
                "schema_registry_url": "http://r:8081",
                "schema_registry_username": "u",
            },
            "kafka[0].schema_registry_username",
            "needs both",
        ),
        (
            {
                "format": "avro",
                "schema_registry_url": "http://r:8081",
                "table": None,
                "route_field": "kind",
                "table_template": "demo.{value}",
            },
            "kafka[0].route_field",
            "route by 'route_header'",
        ),
    ],
)
def test_avro_config_errors_name_the_key(
    make_config: MakeConfig, kafka: dict[str, Any], key: str, fragment: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        _kafka_config(make_config, **kafka)
    assert caught.value.key == key
    assert fragment in caught.value.problem


def test_avro_config_validates_urls_and_schema_files_and_redacts_the_password(
    make_config: MakeConfig, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError) as caught:
        _kafka_config(make_config, format="avro", schema_registry_url="ftp://r")
    assert caught.value.key == "kafka[0].schema_registry_url"
    assert "must be an http(s) URL" in caught.value.problem
    bad = tmp_path / "bad.avsc"
    bad.write_text('{"type": "record", "name": "R", "fields": [{"name": "a", "type": "lng"}]}')
    with pytest.raises(ConfigError) as caught:
        _kafka_config(make_config, format="avro", avro_schema_file=str(bad))
    assert caught.value.key == "kafka[0].avro_schema_file"
    assert caught.value.problem.startswith("bad.avsc is not a valid Avro schema: ")
    config = _kafka_config(
        make_config,
        format="avro",
        schema_registry_url="https://registry:8081",
        schema_registry_username="icespool",
        schema_registry_password="hunter2",
    )
    shown = redacted(config)["kafka"][0]
    assert {k: v for k, v in shown.items() if k.startswith("schema_registry")} == {
        "schema_registry_url": "https://registry:8081",
        "schema_registry_username": "icespool",
        "schema_registry_password": "***",
        "schema_registry_timeout": "2s",
    }
