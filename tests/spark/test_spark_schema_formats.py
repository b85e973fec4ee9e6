"""Spark reads the tables the daemon wrote from Kafka formats "protobuf" and "json-schema":
records written by Confluent's own serializers (schemas registered in the real Apicurio
Registry), through the real Apache Kafka broker, into an in-process daemon, then read by a
real local Spark session on the same SQLite catalog. Every nested type comes back as
written, and the column the producer's second schema version adds (by evolution) too.

(Exactly once through kill -9: tests/kafka/test_kafka_schema_formats.py.)
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from typing import Any

import pytest
from pyiceberg.catalog import load_catalog
from support.apicurio import PASSWORD, USERNAME, ApicurioRegistry
from support.kafka_harness import SESSION_TIMEOUT, Broker, create_topic, produce_values, unique_name
from support.schema_formats import FORMATS, Writer, expected, normalized, table_schema

from icespool.config import Config
from icespool.lifecycle.service import Icespool

TABLE = "k.events"
RECORDS = 60  # version 1 for the first half, version 2 (with `note`) after
PARTITIONS = 2
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _values(fmt: str, registry: ApicurioRegistry, topic: str) -> list[bytes | None]:
    with Writer(fmt, registry, topic) as writer:
        return [writer.value(i, 1 if i < RECORDS // 2 else 2) for i in range(RECORDS)]


async def _wait_rows(config: Config, records: int) -> None:
    """Until the table holds ``records`` rows (read through pyiceberg, so Spark's JDBC
    connection never touches the SQLite catalog while the daemon commits)."""
    catalog = load_catalog(config.catalog.name, **config.catalog.properties())
    try:
        deadline = time.monotonic() + 120
        count = 0
        while time.monotonic() < deadline:
            table = await asyncio.to_thread(catalog.load_table, TABLE)
            snapshot = table.current_snapshot()
            count = int(snapshot.summary["total-records"]) if snapshot and snapshot.summary else 0
            if count >= records:
                return
            await asyncio.sleep(0.3)
        raise AssertionError(f"after 120 s: {count} rows, expected {records}")
    finally:
        catalog.engine.dispose()


@pytest.mark.parametrize("fmt", FORMATS)
async def test_spark_reads_protobuf_and_json_schema_fed_tables(
    fmt: str,
    make_config: Any,
    broker: Broker,
    schema_registry: ApicurioRegistry,
    spark: Any,
    register: Any,
    catalog_name: str,
) -> None:
    topic = unique_name(f"spark-{fmt}")
    await create_topic(broker.bootstrap, topic, PARTITIONS)
    values = await asyncio.to_thread(_values, fmt, schema_registry, topic)
    await produce_values(broker.bootstrap, topic, values)
    config: Config = make_config(
        catalog={"name": catalog_name},
        tables=[
            {"name": TABLE, "create": True, "evolve": "add-columns", "schema": table_schema(fmt)}
        ],
        defaults={"batch_timeout": "1s"},
        kafka=[
            {
                "bootstrap_servers": broker.bootstrap,
                "topics": [topic],
                "group_id": f"g-{topic}",
                "session_timeout": SESSION_TIMEOUT,
                "table": TABLE,
                "format": fmt,
                "schema_registry_url": schema_registry.url,
                "schema_registry_username": USERNAME,
                "schema_registry_password": PASSWORD,
                # A loaded machine's registry may answer slower than the default 2 s.
                "schema_registry_timeout": "30s",
            }
        ],
    )
    async with Icespool(config):
        await _wait_rows(config, RECORDS)

    table = f"{register(config)}.{TABLE}"
    assert "note" in spark.table(table).columns  # evolved for version 2
    # Timestamps as microseconds since the epoch: Spark's own datetimes are naive, in the
    # session's time zone.
    got = spark.sql(f"SELECT *, unix_micros(ts) AS ts_micros FROM {table} ORDER BY id").collect()
    assert len(got) == RECORDS
    for i, row in enumerate(got):
        want = expected(fmt, i, 1 if i < RECORDS // 2 else 2)
        values_of = row.asDict(recursive=True)
        values_of["ts"] = EPOCH + dt.timedelta(microseconds=values_of.pop("ts_micros"))
        assert normalized(fmt, {k: values_of[k] for k in want}) == want, (i, values_of)
