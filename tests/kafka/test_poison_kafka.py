"""Poison corpus for Kafka (JSON and Avro) against a real broker (Apache Kafka): every poison
record becomes a dead letter with the reason that names its problem, every good
record lands exactly once, and nothing stalls — records after the poison, and in
the other partition, land too.

Covers issue 11 items 4-6: values nested 10 / 1,000 / 100,000 deep (also through
``auto_create`` inference), invalid UTF-8 at every depth and in the Kafka key,
header key and header value, out-of-range temporals and decimals (the edges
themselves land), non-object JSON, empty values, and a record aiokafka cannot parse
(a header key that is not UTF-8: it used to stall its partition forever).
"""

from __future__ import annotations

import asyncio
import base64
import decimal
import io
import json
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import fastavro
import numpy as np
import pyarrow as pa
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.record.default_records import _DefaultRecordBatchBuilderPy
from support.kafka_harness import (
    SESSION_TIMEOUT,
    Broker,
    create_topic,
    produce_values,
    unique_name,
)
from support.service_helpers import metric, table_rows, wait_rows

from icespool.config import Config
from icespool.decode import AvroValues, Decoded, JsonValues, Records, Target
from icespool.decode._avro_registry import AvroSchemas, FileSchema
from icespool.kafka._fetch import Fetch
from icespool.kafka._upstream._raw_fetch import parse_batches
from icespool.lifecycle.service import Icespool

MakeConfig = Callable[..., Config]
TABLE = "poison.events"
DEAD = f"{TABLE}_dead_letter"
SCHEMA = [
    {"name": "id", "type": "long", "required": True},
    {"name": "s", "type": "string"},
    {"name": "l", "type": "list<string>"},
    {"name": "st", "type": "struct<f: string>"},
    {"name": "m", "type": "map<string, string>"},
    {"name": "n", "type": "list<list<list<list<list<list<list<list<list<long>>>>>>>>>"},
    {"name": "ts", "type": "timestamptz"},
    {"name": "d", "type": "date"},
    {"name": "t", "type": "time"},
    {"name": "dec", "type": "decimal(10,2)"},
    {"name": "_kafka_partition", "type": "int"},
    {"name": "_kafka_offset", "type": "long"},
    {"name": "_kafka_key", "type": "binary"},
]


def _nested(depth: int) -> bytes:
    """A record whose value nests ``depth`` levels (the record object is level 1)."""
    return b'{"id":0,"n":' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


def _good(i: int, **extra: Any) -> bytes:
    return json.dumps({"id": i, "s": f"v{i}", **extra}).encode()


# (value, reason) in partition 0 order; None reason: a good record.
def _partition0() -> list[tuple[bytes | None, str | None]]:
    return [
        (_good(0), None),
        (b'{"id":1,"n":' + b"[" * 9 + b"]" * 9 + b"}", None),  # 10 levels: within the limit
        (_nested(1_000), "too_deep"),
        (_good(3), None),
        (_nested(100_000), "too_deep"),
        (b'{"id":5,"s":"a\xffb"}', "bad_utf8"),
        (b'{"id":6,"l":["ok","\xfe"]}', "bad_utf8"),
        (b'{"id":7,"st":{"f":"\xc3\x28"}}', "bad_utf8"),
        (b'{"id":8,"m":[{"key":"\xff","value":"v"}]}', "bad_utf8"),
        (b'{"id":9,"m":[{"key":"k","value":"\xff"}]}', "bad_utf8"),
        (_good(10, ts="0001-01-01T00:00:00Z", d="0001-01-01", t="00:00:00"), None),
        (_good(11, ts="9999-12-31T23:59:59.999999Z", d="9999-12-31", t="23:59:59.999999"), None),
        (_good(12, ts="0000-12-31T23:59:59Z"), "out_of_range"),
        (_good(13, d="0000-12-31"), "out_of_range"),
        (_good(14, t="24:00:00"), "invalid"),  # not a time at all for the parser
        (_good(15, dec="99999999.99"), None),
        (_good(16, dec="100000000.00"), "invalid"),
        (b"[1,2]", "invalid"),
        (b'"text"', "invalid"),
        (b"", "empty"),
        (_good(20), None),
    ]


class _RawKey(str):
    """A header key whose bytes on the wire are not UTF-8 (aiokafka's own producer
    only sends str keys it can encode)."""

    raw: bytes

    def __new__(cls, raw: bytes) -> _RawKey:
        made = super().__new__(cls, "x" * len(raw))
        made.raw = raw
        return made

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return self.raw


async def _send_batch(
    bootstrap: str,
    topic: str,
    partition: int,
    records: list[tuple[bytes | None, bytes, list[tuple[Any, bytes]]]],
) -> None:
    """One record batch, built by aiokafka's pure-Python builder (which writes the
    header key's bytes as ``encode`` returns them), sent as it is."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        batch = producer.create_batch()
        batch._builder = _DefaultRecordBatchBuilderPy(2, 0, 0, -1, -1, -1, 4 << 20)
        for value, key, headers in records:
            assert batch.append(timestamp=None, key=key, value=value, headers=headers)
        await (await producer.send_batch(batch, topic, partition=partition))
    finally:
        await producer.stop()


def _config(make_config: MakeConfig, broker: Broker, topic: str, **kafka: Any) -> Config:
    return make_config(
        tables=[{"name": TABLE, "create": True, "schema": SCHEMA}],
        defaults={"batch_timeout": "1s"},
        kafka=[
            {
                "bootstrap_servers": broker.bootstrap,
                "topics": [topic],
                "group_id": f"g-{topic}",
                "session_timeout": SESSION_TIMEOUT,
                "offset_commit_interval": "1s",
                "table": TABLE,
                "metadata_columns": ["_kafka_partition", "_kafka_offset", "_kafka_key"],
                **kafka,
            }
        ],
    )


async def test_json_poison_is_dead_lettered_with_its_reason_and_nothing_stalls(
    make_config: MakeConfig, broker: Broker
) -> None:
    topic = unique_name("poison-json")
    await create_topic(broker.bootstrap, topic, 2)
    first = _partition0()
    # Partition 0: the JSON corpus, then one batch holding good records around a
    # record aiokafka cannot parse, and Kafka keys/header values that are not UTF-8.
    await produce_values(broker.bootstrap, topic, [v for v, _ in first], partition_of=lambda i: 0)
    tail = len(first)
    corrupt_batch: list[tuple[bytes | None, bytes, list[tuple[Any, bytes]]]] = [
        (_good(tail), b"\xff\xfekey", [("h", b"\xff")]),  # bytes are fine in key and value
        (_good(tail + 1), b"k", [(_RawKey(b"\xff\xfe"), b"v")]),  # unparseable
        (_good(tail + 2), b"k", [("ok", b"v")]),  # same batch, after the poison
    ]
    await _send_batch(broker.bootstrap, topic, 0, corrupt_batch)
    # Partition 1: only good records, some sent after the poison of partition 0.
    await produce_values(
        broker.bootstrap, topic, [_good(1000 + i) for i in range(50)], partition_of=lambda i: 1
    )
    after = [_good(tail + 3 + i) for i in range(20)]
    await produce_values(broker.bootstrap, topic, after, partition_of=lambda i: 0)

    expected_dead = {o: r for o, (_, r) in enumerate(first) if r is not None}
    expected_dead[tail + 1] = "unparseable"
    good_p0 = [json.loads(v)["id"] for v, r in first if r is None]
    good_ids = sorted([*good_p0, tail, tail + 2, *range(tail + 3, tail + 23), *range(1000, 1050)])
    async with Icespool(_config(make_config, broker, topic)) as service:
        await wait_rows(service, TABLE, len(good_ids), within=60)
        await wait_rows(service, DEAD, len(expected_dead), within=30)
        await asyncio.sleep(1.5)  # nothing more arrives
        rows = await asyncio.to_thread(table_rows, service, TABLE)
        dead = await asyncio.to_thread(table_rows, service, DEAD)
        assert sorted(r["id"] for r in rows) == good_ids  # every id exactly once
        by_id = {r["id"]: r for r in rows}
        assert by_id[tail]["_kafka_key"] == b"\xff\xfekey"
        assert str(by_id[10]["ts"]).startswith("0001-01-01") and str(by_id[11]["d"]) == "9999-12-31"
        assert {r["id"] for r in rows if r["_kafka_partition"] == 1} == set(range(1000, 1050))
        assert {d["offset"]: d["reason"] for d in dead} == expected_dead
        assert all(d["partition"] == 0 for d in dead)
        for d in dead:
            if d["reason"] in ("too_deep", "bad_utf8", "out_of_range"):
                assert d["value"] == first[d["offset"]][0]
        deep = [d for d in dead if d["reason"] == "too_deep"]
        assert all("nests deeper than 64 levels" in d["error"] for d in deep)
        assert all("UTF-8" in d["error"] for d in dead if d["reason"] == "bad_utf8")
        ranged = [d for d in dead if d["reason"] == "out_of_range"]
        assert {d["offset"]: d["error"].split("'")[1] for d in ranged} == {12: "ts", 13: "d"}
        assert all("0001-01-01" in d["error"] for d in ranged)
        (unparseable,) = [d for d in dead if d["reason"] == "unparseable"]
        assert "not UTF-8" in unparseable["error"]
        assert unparseable["value"] == corrupt_batch[1][0]  # recovered bytes
        assert unparseable["target_table"] == TABLE
        header = json.loads(unparseable["headers"])[0]
        assert header == ["\\xff\\xfe", base64.b64encode(b"v").decode()]
        counts = Counter(expected_dead.values())
        for reason, count in counts.items():
            labels = {"table": TABLE, "reason": reason}
            assert metric(service, "icespool_dead_letters_total", **labels) == count, reason
        assert service._sources[0].connected


async def test_an_unparseable_record_reaches_a_dead_letter_topic_and_its_neighbours_land(
    make_config: MakeConfig, broker: Broker
) -> None:
    topic, dlq = unique_name("poison-dlq-src"), unique_name("poison-dlq")
    await create_topic(broker.bootstrap, topic, 1)
    await create_topic(broker.bootstrap, dlq, 1)
    batch: list[tuple[bytes | None, bytes, list[tuple[Any, bytes]]]] = [
        (_good(i), b"k", [(_RawKey(b"\xc0") if i == 1 else "h", b"v")]) for i in range(3)
    ]
    await _send_batch(broker.bootstrap, topic, 0, batch)
    config = _config(make_config, broker, topic, dead_letter=dlq)
    async with Icespool(config) as service:
        rows = await wait_rows(service, TABLE, 2)
        assert sorted(r["id"] for r in rows) == [0, 2]
        consumer = AIOKafkaConsumer(
            dlq, bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest"
        )
        await consumer.start()
        try:
            got = await consumer.getmany(timeout_ms=10_000)
        finally:
            await consumer.stop()
        (records,) = got.values()
        (record,) = records
        assert record.value == batch[1][0]
        headers = dict(record.headers)
        assert headers["\\xc0"] == b"v"
        assert headers["icespool.reason"] == b"unparseable"
        assert headers["icespool.offset"] == b"1"


async def test_auto_create_never_infers_from_a_value_too_deep(
    make_config: MakeConfig, broker: Broker
) -> None:
    topic = unique_name("poison-routes")
    await create_topic(broker.bootstrap, topic, 1)
    values = [
        b'{"kind":"fresh","id":1}',
        b'{"kind":"fresh","id":2,"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"kind":"other","id":3,"x":' + b"[" * 20_000 + b"]" * 20_000 + b"}",
        b'{"kind":"fresh","id":4}',
    ]
    await produce_values(broker.bootstrap, topic, values)
    config = make_config(
        tables=[],
        defaults={"batch_timeout": "1s"},
        kafka=[
            {
                "bootstrap_servers": broker.bootstrap,
                "topics": [topic],
                "group_id": f"g-{topic}",
                "session_timeout": SESSION_TIMEOUT,
                "offset_commit_interval": "1s",
                "route_field": "kind",
                "table_template": "auto.{value}",
                "auto_create": True,
                "dead_letter": "table",
            }
        ],
    )
    async with Icespool(config) as service:
        rows = await wait_rows(service, "auto.fresh", 2)
        dead_table = service._sources[0].dead_letter_table
        assert dead_table is not None
        dead = await wait_rows(service, dead_table, 2)
        await asyncio.sleep(1)
        rows = await asyncio.to_thread(table_rows, service, "auto.fresh")
        dead = await asyncio.to_thread(table_rows, service, dead_table)
        assert sorted(r["id"] for r in rows) == [1, 4]
        assert sorted((d["offset"], d["reason"]) for d in dead) == [
            (1, "too_deep"),
            (2, "too_deep"),
        ]


# ------------------------------------------------------------------ Avro (decoder level)


def _fetch(values: list[bytes | None]) -> Fetch:
    n = len(values)
    offsets = np.arange(n, dtype=np.int64)
    return Fetch("t", 0, offsets, values, [None] * n, [0] * n, [[] for _ in range(n)])


def _decode_avro(records: Records, schema: pa.Schema, *, schemas: AvroSchemas) -> Decoded:
    return AvroValues(lambda: schemas).decode(records, Target("t", schema))


def _decode_json(
    records: Records, schema: pa.Schema, metadata_columns: Sequence[str] = ()
) -> Decoded:
    return JsonValues(source_columns=metadata_columns).decode(records, Target("t", schema))


def _avro(schema: Any, record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def _schema_file(tmp_path: Any, schema: Any) -> FileSchema:
    path = tmp_path / "v.avsc"
    path.write_text(json.dumps(schema))
    return FileSchema(path)


def test_avro_recursive_and_too_deep_schemas_are_refused_before_any_value_is_read(
    tmp_path: Any,
) -> None:
    node = {
        "type": "record",
        "name": "Node",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "next", "type": ["null", "Node"], "default": None},
        ],
    }
    # 100,000 levels of data in a recursive schema: fastavro would recurse per level.
    value = b"\x02" + b"\x02\x02" * 100_000 + b"\x02\x00"
    # Even a table as deep as the data would be refused: the schema is what nests.
    nested: pa.DataType = pa.int64()
    for _ in range(100):
        nested = pa.struct([("id", pa.int64()), ("next", nested)])
    arrow = pa.schema([("id", pa.int64()), ("next", nested)])
    decoded = _decode_avro(_fetch([value]), arrow, schemas=_schema_file(tmp_path, node))
    assert decoded.batch is None
    assert [(d.index, d.reason) for d in decoded.dead] == [(0, "too_deep")]
    assert "deeper than max_nesting_depth (or is recursive)" in decoded.dead[0].error
    # A schema text nested past what json.loads survives is refused by name, not crashed on.
    deep_text = '{"type":' * 5_000 + '"long"' + "}" * 5_000
    path = tmp_path / "deep.avsc"
    path.write_text(deep_text)
    with pytest.raises(ValueError, match="nests deeper than 400 JSON levels"):
        FileSchema(path)


def test_avro_out_of_range_and_bad_utf8_are_dead_letters_and_edges_land(tmp_path: Any) -> None:
    schema = {
        "type": "record",
        "name": "R",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "s", "type": "string"},
            {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-micros"}},
            {"name": "d", "type": {"type": "int", "logicalType": "date"}},
            {"name": "t", "type": {"type": "long", "logicalType": "time-micros"}},
        ],
    }
    first_us, last_us = -62135596800_000_000, 253402300799_999_999
    first_day, last_day = -719162, 2932896
    day_us = 86_400_000_000
    rows = [
        {"id": 0, "s": "a", "ts": first_us, "d": first_day, "t": 0},
        {"id": 1, "s": "b", "ts": last_us, "d": last_day, "t": day_us - 1},
        {"id": 2, "s": "c", "ts": first_us - 1, "d": 0, "t": 0},
        {"id": 3, "s": "d", "ts": 0, "d": last_day + 1, "t": 0},
        {"id": 4, "s": "e", "ts": 0, "d": 0, "t": day_us},
        {"id": 5, "s": "f", "ts": -(2**62), "d": 0, "t": 0},
    ]
    values = [_avro(schema, r) for r in rows]
    # A string whose bytes are not UTF-8: same length, so the framing stays valid.
    values.append(_avro(schema, {**rows[0], "id": 6, "s": "Z"}).replace(b"\x02Z", b"\x02\xff"))
    arrow = pa.schema(
        [
            ("id", pa.int64()),
            ("s", pa.string()),
            ("ts", pa.timestamp("us", "UTC")),
            ("d", pa.date32()),
            ("t", pa.time64("us")),
        ]
    )
    decoded = _decode_avro(_fetch(values), arrow, schemas=_schema_file(tmp_path, schema))
    assert decoded.batch is not None
    assert decoded.batch.column("id").to_pylist() == [0, 1]
    assert [(d.index, d.reason, d.column) for d in decoded.dead] == [
        (2, "out_of_range", "ts"),
        (3, "out_of_range", "d"),
        (4, "out_of_range", "t"),
        (5, "out_of_range", "ts"),
        (6, "bad_utf8", None),
    ]


# ------------------------------------------------------------------ the raw reader


def _batch_bytes(base: int, headers_of: Callable[[int], list[tuple[Any, bytes]]]) -> bytearray:
    builder = _DefaultRecordBatchBuilderPy(2, 0, 0, -1, -1, -1, 1 << 20)
    for i in range(3):
        builder.append(i, timestamp=1000 + i, key=b"k%d" % i, value=_good(i), headers=headers_of(i))
    data = builder.build()
    data[0:8] = base.to_bytes(8, "big")  # the broker assigns the base offset
    return data


def test_raw_reader_recovers_what_aiokafka_refuses_and_marks_what_is_lost() -> None:
    bad_key = _batch_bytes(10, lambda i: [(_RawKey(b"\xff") if i == 1 else "h", b"v")])
    records, after = parse_batches(bytes(bad_key), 10)
    assert after == 13
    assert [(r.offset, r.value, r.problem is None) for r in records] == [
        (10, _good(0), True),
        (11, _good(1), False),
        (12, _good(2), True),
    ]
    assert records[1].headers == [("\udcff", b"v")] and "not UTF-8" in (records[1].problem or "")
    # From an offset inside the batch: only what follows; a cut-off batch waits.
    second = _batch_bytes(13, lambda i: [])
    records, after = parse_batches(bytes(bad_key + second[:-5]), 12)
    assert [r.offset for r in records] == [12] and after == 13
    # A CRC that does not match: every offset of the batch is marked, no bytes.
    corrupt = bytearray(second)
    corrupt[-1] ^= 0xFF
    records, after = parse_batches(bytes(corrupt), 13)
    assert after == 16
    assert [(r.offset, r.value) for r in records] == [(13, None), (14, None), (15, None)]
    assert all("CRC" in (r.problem or "") for r in records)


def test_a_decimal_with_a_huge_exponent_is_a_dead_letter_not_a_crash() -> None:
    """pyarrow's decimal parser read out of bounds (SIGSEGV, the whole daemon, at
    every restart) on an exponent such as 1e-9999999; now only that record is dead."""
    schema = pa.schema([pa.field("id", pa.int64(), False), ("amount", pa.decimal128(38, 10))])
    values: list[bytes | None] = [
        b'{"id":0,"amount":"12.5"}',
        b'{"id":1,"amount":"1e-9999999"}',
        b'{"id":2,"amount":1E+0000012345}',
        b'{"id":3,"amount":"1e28"}',  # 39 digits at scale 10: one past decimal(38,10)
        b'{"id":4,"amount":"' + b"9" * 28 + b"." + b"9" * 10 + b'"}',  # the edge itself
    ]
    decoded = _decode_json(_fetch(values), schema)
    assert decoded.batch is not None
    assert decoded.batch.column("id").to_pylist() == [0, 4]
    assert decoded.batch.column("amount")[1].as_py() == decimal.Decimal("9" * 28 + "." + "9" * 10)
    assert [(d.index, d.reason) for d in decoded.dead] == [
        (1, "out_of_range"),
        (2, "out_of_range"),
        (3, "invalid"),
    ]
    assert "exponent of 5 or more digits" in decoded.dead[0].error


def test_a_value_longer_than_two_read_blocks_lands() -> None:
    """pyarrow.json cannot read a record longer than about two of its blocks (256 KiB
    here): such a value, well below max_record_bytes, was dead-lettered as invalid."""
    schema = pa.schema([pa.field("id", pa.int64(), False), ("s", pa.string())])
    big = "b" * 900_000
    values: list[bytes | None] = [json.dumps({"id": i, "s": big}).encode() for i in range(3)]
    decoded = _decode_json(_fetch(values), schema)
    assert decoded.dead == []
    assert decoded.batch is not None and decoded.batch.column("s").to_pylist() == [big] * 3


def test_record_timestamps_outside_what_a_table_holds_are_null() -> None:
    """A producer sets any int64 timestamp: 2^62 ms wrapped to 1969 when converted to
    microseconds, and year 10000 was stored where no reader can load it."""
    first, last = -62_135_596_800_000, 253_402_300_799_999
    stamps = [0, first, last, last + 1, first - 1, 2**62, -(2**63)]
    values: list[bytes | None] = [b'{"id":%d}' % i for i in range(len(stamps))]
    fetch = Fetch("t", 0, np.arange(len(stamps), dtype=np.int64), values, [None] * 7, stamps,
                  [[] for _ in stamps])  # fmt: skip
    schema = pa.schema(
        [pa.field("id", pa.int64(), False), ("_kafka_timestamp", pa.timestamp("us", "UTC"))]
    )
    decoded = _decode_json(fetch, schema, metadata_columns=["_kafka_timestamp"])
    assert decoded.batch is not None and decoded.dead == []
    column = decoded.batch.column("_kafka_timestamp").cast(pa.int64()).to_pylist()
    assert column == [0, first * 1000, last * 1000, None, None, None, None]
