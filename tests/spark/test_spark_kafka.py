"""Spark reads a table the daemon wrote from Kafka: a real broker (Apache Kafka), an in-process
daemon with a ``[[kafka]]`` source, a real local Spark session on the same SQLite catalog.
Every value arrives exactly, the table properties hold the consumed offset ranges, and
after Spark expires every snapshot but the last, a restarted daemon adds exactly the
records produced since (the offset ranges live in table properties, not in snapshots)."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from decimal import Decimal
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from pyiceberg.catalog import load_catalog
from pyspark.sql import Row
from support.kafka_harness import SESSION_TIMEOUT, Broker, create_topic, produce, unique_name

from icespool.config import Config
from icespool.kafka._offsets import offsets_key
from icespool.lifecycle.service import Icespool

TABLE = "k.events"
# The broker outlives this module (one per xdist worker): a topic and group of its own.
TOPIC = unique_name("spark-events")
GROUP = f"g-{TOPIC}"
PARTITIONS = 2
FIRST = 300  # records before the expiry: offsets 0-149 in each partition
SECOND = 100  # records after it: offsets 150-199 in each partition
SCHEMA = [
    {"name": "id", "type": "long", "required": True},
    {"name": "kind", "type": "string"},
    {"name": "amount", "type": "double"},
    {"name": "price", "type": "decimal(12,2)"},
    {"name": "ts", "type": "timestamptz"},
    {"name": "day", "type": "date"},
    {"name": "tags", "type": "list<string>"},
]
_T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


def _record(i: int) -> dict[str, Any]:
    """The JSON value produced for id ``i`` (some optional fields absent or null)."""
    record: dict[str, Any] = {
        "id": i,
        "kind": ["click", "view", "buy"][i % 3],
        "amount": i / 8,
        "price": f"{i}.{i % 100:02d}",
        "ts": (_T0 + dt.timedelta(seconds=i, microseconds=i)).isoformat(),
        "day": (dt.date(2026, 3, 1) + dt.timedelta(days=i % 40)).isoformat(),
        "tags": [f"t{i % 5}", f"u{i % 7}"] if i % 4 else [],
    }
    if i % 11 == 0:
        record["kind"] = None
    if i % 13 == 0:
        del record["tags"]
    return record


def _expected(i: int) -> tuple[Any, ...]:
    """What Spark returns for id ``i``: (id, kind, amount, price, unix_micros(ts), day, tags)."""
    record = _record(i)
    ts = _T0 + dt.timedelta(seconds=i, microseconds=i)
    return (
        i,
        record["kind"],
        i / 8,
        Decimal(f"{i}.{i % 100:02d}"),
        (ts - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1),
        dt.date(2026, 3, 1) + dt.timedelta(days=i % 40),
        record.get("tags"),
    )


def _config(make_config: Any, broker: Broker, catalog_name: str) -> Config:
    config: Config = make_config(
        catalog={"name": catalog_name},
        tables=[{"name": TABLE, "create": True, "schema": SCHEMA}],
        defaults={"batch_timeout": "1s"},
        kafka=[
            {
                "bootstrap_servers": broker.bootstrap,
                "topics": [TOPIC],
                "group_id": GROUP,
                "session_timeout": SESSION_TIMEOUT,
                "table": TABLE,
                "offset_commit_interval": "1s",
            }
        ],
    )
    return config


def _offsets(last: int) -> dict[str, str]:
    return {offsets_key(GROUP, TOPIC, p): f"0-{last}" for p in range(PARTITIONS)}


async def _wait_committed(config: Config, records: int, offsets: dict[str, str]) -> None:
    """Until the table holds ``records`` rows and ``offsets`` (read through pyiceberg, so
    Spark's JDBC connection never touches the SQLite catalog while the daemon commits)."""
    catalog = load_catalog(config.catalog.name, **config.catalog.properties())
    try:
        deadline = time.monotonic() + 60
        state: tuple[int, dict[str, str | None]] = (0, {})
        while time.monotonic() < deadline:
            table = await asyncio.to_thread(catalog.load_table, TABLE)
            snapshot = table.current_snapshot()
            count = int(snapshot.summary["total-records"]) if snapshot and snapshot.summary else 0
            state = (count, {k: table.metadata.properties.get(k) for k in offsets})
            if state == (records, offsets):
                return
            await asyncio.sleep(0.3)
        raise AssertionError(f"after 60 s: {state}, expected {(records, offsets)}")
    finally:
        catalog.engine.dispose()


def _consumed(service: Icespool) -> float:
    value = service.metrics.registry.get_sample_value(
        "icespool_kafka_records_consumed_total", {"topic": TOPIC}
    )
    return value or 0.0


async def _rewind_group(broker: Broker) -> dict[int, int | None]:
    """Join the daemon's consumer group (the daemon is stopped) and commit offset 0 for
    every partition; returns the offsets the group held before."""
    parts = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
    consumer = AIOKafkaConsumer(
        bootstrap_servers=broker.bootstrap,
        group_id=GROUP,
        enable_auto_commit=False,
        auto_offset_reset="none",
    )
    await consumer.start()
    try:
        consumer.subscribe([TOPIC])
        deadline = time.monotonic() + 30
        while consumer.assignment() != set(parts):
            assert time.monotonic() < deadline, consumer.assignment()
            await consumer.getmany(timeout_ms=200, max_records=1)
        before = {tp.partition: await consumer.committed(tp) for tp in parts}
        await consumer.commit(dict.fromkeys(parts, 0))
        assert {tp.partition: await consumer.committed(tp) for tp in parts} == dict.fromkeys(
            range(PARTITIONS), 0
        )
        return before
    finally:
        await consumer.stop()


def _properties(spark: Any, table: str) -> dict[str, str]:
    return {row.key: row.value for row in spark.sql(f"SHOW TBLPROPERTIES {table}").collect()}


def _values(spark: Any, table: str) -> list[tuple[Any, ...]]:
    got = spark.sql(
        f"SELECT id, kind, amount, price, unix_micros(ts), day, tags FROM {table} ORDER BY id"
    ).collect()
    return [tuple(row) for row in got]


async def test_spark_reads_a_kafka_fed_table_and_offsets_survive_expire_snapshots(
    make_config: Any, broker: Broker, spark: Any, register: Any, catalog_name: str
) -> None:
    await create_topic(broker.bootstrap, TOPIC, PARTITIONS)
    await produce(
        broker.bootstrap, TOPIC, [_record(i) for i in range(FIRST)], partitions=PARTITIONS
    )
    config = _config(make_config, broker, catalog_name)
    first_offsets = _offsets(FIRST // PARTITIONS - 1)
    async with Icespool(config) as service:
        await _wait_committed(config, FIRST, first_offsets)
        await asyncio.sleep(1.5)  # nothing more arrives
        assert _consumed(service) == FIRST

    name = register(config)
    table = f"{name}.{TABLE}"
    assert spark.table(table).count() == FIRST
    assert _values(spark, table) == [_expected(i) for i in range(FIRST)]
    # One row per record: Spark sees the list column as array<string>, absent as null.
    assert spark.sql(f"SELECT tags FROM {table} WHERE id = 13").first() == Row(tags=None)
    assert spark.sql(f"SELECT tags FROM {table} WHERE id = 4").first() == Row(tags=[])
    properties = _properties(spark, table)
    assert {k: v for k, v in properties.items() if k.startswith("icespool.kafka.")} == (
        first_offsets
    )
    assert properties[f"icespool.kafka.{GROUP}/{TOPIC}/0"] == "0-149"

    snapshots_before = spark.sql(f"SELECT count(*) FROM {table}.snapshots").first()[0]
    assert snapshots_before >= 1
    expired = spark.sql(
        f"CALL {name}.system.expire_snapshots(table => '{TABLE}', "
        "older_than => TIMESTAMP '2999-01-01 00:00:00', retain_last => 1)"
    ).first()
    assert expired.deleted_manifest_lists_count == snapshots_before - 1
    (kept,) = [
        r.snapshot_id for r in spark.sql(f"SELECT snapshot_id FROM {table}.snapshots").collect()
    ]
    # Expiry keeps the table's properties: the offset ranges (and the spool's mark of its
    # last commit) are still all there.
    ours = {k: v for k, v in properties.items() if k.startswith("icespool.")}
    assert any(k.endswith(".last-segments") for k in ours), ours
    assert {k: v for k, v in _properties(spark, table).items() if k.startswith("icespool.")} == ours

    # The group's Kafka offsets (kept for lag tooling) are rewound to 0: the restarted
    # daemon must resume from the table's ranges, which outlived the expired snapshots.
    before = await _rewind_group(broker)
    assert before == dict.fromkeys(range(PARTITIONS), FIRST // PARTITIONS)
    await produce(
        broker.bootstrap,
        TOPIC,
        [_record(i) for i in range(FIRST, FIRST + SECOND)],
        partitions=PARTITIONS,
    )
    second_offsets = _offsets((FIRST + SECOND) // PARTITIONS - 1)
    async with Icespool(config) as service:
        await _wait_committed(config, FIRST + SECOND, second_offsets)
        await asyncio.sleep(1.5)
        # The restarted daemon resumed from the table's ranges, not from the rewound group
        # offsets: it fetched only the new records (none of 0-149 again), so nothing had
        # to be dropped as a duplicate.
        assert _consumed(service) == SECOND
        dropped = service.metrics.registry.get_sample_value(
            "icespool_kafka_duplicates_dropped_total", {"table": TABLE}
        )
        assert (dropped or 0.0) == 0.0

    assert spark.table(table).count() == FIRST + SECOND
    assert _values(spark, table) == [_expected(i) for i in range(FIRST + SECOND)]
    properties = _properties(spark, table)
    assert {k: v for k, v in properties.items() if k.startswith("icespool.kafka.")} == (
        second_offsets
    )
    # The snapshots after the kept one added exactly the new records.
    added = spark.sql(
        f"SELECT sum(CAST(summary['added-records'] AS BIGINT)) FROM {table}.snapshots "
        f"WHERE snapshot_id != {kept}"
    ).first()[0]
    assert added == SECOND
    new_ids = spark.read.format("iceberg").option("start-snapshot-id", str(kept)).load(table)
    assert sorted(r.id for r in new_ids.select("id").collect()) == list(
        range(FIRST, FIRST + SECOND)
    )
