"""Spark reads what real Debezium wrote: the workload of tests/cdc/test_debezium_real.py
(support/debezium_workload.py: PostgreSQL -> Debezium with its default settings -> Apache
Kafka -> a real ``icespool run`` child with a kill -9 -> three upsert tables with schema
changes), smaller, then ONE Spark read per table: Spark's merged state (its own
equality-delete handling) equals ``SELECT *`` of the source table row by row, typed
values compared exactly.

Timestamps leave Spark as text (``timestamp``, Spark's TIMESTAMP_NTZ) and as epoch
microseconds (``timestamptz``), and dates as text, so years 1 and 9999 reach the
comparison without PySpark's local-time conversions.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest
from support.debezium import DebeziumPostgres
from support.debezium_workload import NAMESPACE, Rows, run_debezium, typed
from support.kafka_harness import Broker

from icespool.config import load_config
from icespool.spark.session import register_catalog

pytestmark = pytest.mark.slow

UTC = datetime.UTC
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=UTC)


def _select(catalog: str, table: str, kinds: dict[str, str], names: list[str]) -> str:
    columns = []
    for name in names:
        kind = kinds[name]
        if kind == "timestamptz":
            columns.append(f"unix_micros(`{name}`)")
        elif kind in ("timestamp", "date"):
            columns.append(f"CAST(`{name}` AS STRING)")
        else:
            columns.append(f"`{name}`")
    return f"SELECT {', '.join(columns)} FROM {catalog}.{NAMESPACE}.{table}"


def _value(kind: str, value: Any) -> Any:
    if value is None:
        return None
    if kind == "timestamptz":
        return EPOCH + datetime.timedelta(microseconds=value)
    if kind == "timestamp":
        return datetime.datetime.fromisoformat(value)
    if kind == "date":
        return datetime.date.fromisoformat(value)
    return value


async def test_spark_reads_the_debezium_tables_as_the_source_holds_them(
    spark: Any, broker: Broker, debezium: DebeziumPostgres, tmp_path: Path
) -> None:
    outcome = await run_debezium(broker, debezium, tmp_path / "d", statements=1200, kills=(0.5,))
    config = load_config(outcome.home.config_path)
    name = register_catalog(spark, config)
    assert name == outcome.catalog
    for table, (names, expected) in outcome.expected.items():
        kinds = {f.name: str(f.field_type) for f in outcome.tables[table].schema().fields}
        rows = spark.sql(_select(name, table, kinds, names)).collect()
        got: Rows = sorted(
            (
                tuple(typed(_value(kinds[n], v)) for n, v in zip(names, row, strict=True))
                for row in rows
            ),
            key=repr,
        )
        assert len(got) == len(expected), table
        assert got == expected, table
    print(f"\n{outcome.summary}")
