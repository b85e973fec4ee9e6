"""Real Debezium into upsert tables: PostgreSQL -> Debezium's PostgreSQL connector (Kafka
Connect standalone, Debezium's default settings) -> Apache Kafka -> a real ``icespool run``
child -> Iceberg; at the end each Iceberg table's merged state (pyiceberg,
`icespool.cdc.read_merged`) equals ``SELECT *`` of its source table row by row, typed
values compared exactly (support/debezium_workload.py).

Debezium's defaults are kept: JSON with Kafka Connect schemas, decimal.handling.mode
precise (base64 unscaled integers, scale and precision in the field schema),
time.precision.mode adaptive (MicroTimestamp, ZonedTimestamp, Date as days), tombstones
after deletes, a key change as a delete and a create. The workload (seeded) inserts,
updates, deletes and changes primary keys in three tables (one with a composite key),
alters them mid-stream (ADD COLUMN, integer -> bigint, numeric(12,3) -> numeric(18,3))
and the daemon is killed -9 twice while it runs. Values reach the edges: negative and
zero decimals, the most digits the column holds, years 1 and 9999, epoch -1, nulls.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.debezium import DebeziumPostgres
from support.debezium_workload import run_debezium
from support.kafka_harness import Broker

pytestmark = pytest.mark.slow


async def test_debezium_postgres_into_upsert_tables_equals_the_source(
    broker: Broker, debezium: DebeziumPostgres, tmp_path: Path
) -> None:
    outcome = await run_debezium(
        broker, debezium, tmp_path / "d", statements=3000, kills=(1 / 3, 2 / 3)
    )
    # The evolved schemas: new columns added, types widened as the source's.
    schemas = {
        table: {f.name: str(f.field_type) for f in loaded.schema().fields}
        for table, loaded in outcome.tables.items()
    }
    assert schemas["events"] == {
        "id": "long",
        "kind": "string",
        "at": "timestamp",
        "at_tz": "timestamptz",
        "amount": "decimal(12, 3)",
        "day": "date",
        "flag": "boolean",
        "extra": "string",
        "score": "decimal(10, 2)",
        "big": "long",
    }
    assert (schemas["accounts"]["n"], schemas["orders"]["amount"]) == ("long", "decimal(18, 3)")
    print(f"\n{outcome.summary}")
