"""Columns Debezium adds or widens, per the table's ``evolve`` policy: a real broker
(Apache Kafka), an in-process daemon, three upsert tables fed the same change values
whose Kafka Connect schemas grow mid-stream (a new text column, integer -> bigint).

- ``none``: the table keeps its schema; the new column is skipped, a value past the
  narrow column is a dead letter (``out_of_range``);
- ``add-columns``: the new column is added, the widening refused: the value past the
  narrow column is a ``schema_change`` dead letter naming the policy;
- ``add-and-widen``: both, and every change lands.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from support.connect_json import envelope
from support.kafka_harness import SESSION_TIMEOUT, Broker, create_topic, unique_name
from support.service_helpers import table_rows

from icespool.cdc import read_merged
from icespool.config import Config
from icespool.kafka._offsets import ranges_from_properties
from icespool.lifecycle.service import Icespool

MakeConfig = Callable[..., Config]
POLICIES = ("none", "add-columns", "add-and-widen")
NARROW = {"id": {"type": "int64", "optional": False}, "n": {"type": "int32"}}
WIDE = {**NARROW, "n": {"type": "int64"}, "note": {"type": "string"}}
VALUES = [
    envelope({"id": 1, "n": 5}, "r", fields=NARROW),
    envelope({"id": 2, "n": 7, "note": "added"}, fields=WIDE),  # after ADD COLUMN
    envelope({"id": 3, "n": 2**40, "note": None}, fields=WIDE),  # after integer -> bigint
    envelope({"id": 1, "n": -(2**31), "note": "x"}, "u", fields=WIDE),
]


async def _produce(bootstrap: str, topic: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for value in VALUES:
            await producer.send_and_wait(topic, value=value, key=b"{}")
    finally:
        await producer.stop()


async def _claimed(service: Icespool, table: str, group: str, topic: str) -> bool:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert service._catalog is not None
        loaded = await asyncio.to_thread(service._catalog.load_table, table)
        spans = list(ranges_from_properties(loaded.properties, group, topic, 0).spans)
        if spans == [(0, len(VALUES) - 1)]:
            return True
        await asyncio.sleep(0.3)
    return False


@pytest.mark.slow
async def test_debezium_columns_evolve_as_each_tables_policy_allows(
    make_config: MakeConfig, broker: Broker
) -> None:
    topics = {policy: unique_name(f"dbz-{policy}") for policy in POLICIES}
    for topic in topics.values():
        await create_topic(broker.bootstrap, topic, 1)
        await _produce(broker.bootstrap, topic)
    tables = {policy: f"evo.{policy.replace('-', '_')}" for policy in POLICIES}
    config = make_config(
        tables=[
            {
                "name": tables[policy],
                "create": True,
                "key": ["id"],
                "evolve": policy,
                "schema": [
                    {"name": "id", "type": "long", "required": True},
                    {"name": "n", "type": "int"},
                ],
            }
            for policy in POLICIES
        ],
        defaults={"batch_timeout": "1s"},
        kafka=[
            {
                "bootstrap_servers": broker.bootstrap,
                "topics": [topics[policy]],
                "group_id": f"g-{topics[policy]}",
                "session_timeout": SESSION_TIMEOUT,
                "offset_commit_interval": "1s",
                "table": tables[policy],
                "changes": "debezium",
            }
            for policy in POLICIES
        ],
    )
    results: dict[str, Any] = {}
    async with Icespool(config) as service:
        for policy in POLICIES:
            table, topic = tables[policy], topics[policy]
            assert await _claimed(service, table, f"g-{topic}", topic), policy
            assert service._catalog is not None
            loaded = await asyncio.to_thread(service._catalog.load_table, table)
            rows = await asyncio.to_thread(read_merged, loaded)
            dead_table = f"{table}_dead_letter"
            dead = (
                await asyncio.to_thread(table_rows, service, dead_table)
                if await asyncio.to_thread(service._catalog.table_exists, dead_table)
                else []
            )
            results[policy] = (
                {f.name: str(f.field_type) for f in loaded.schema().fields},
                sorted(rows.to_pylist(), key=lambda r: r["id"]),
                [(d["offset"], d["reason"], d["error"]) for d in dead],
            )

    schema, rows, dead = results["none"]
    assert schema == {"id": "long", "n": "int"}
    assert rows == [{"id": 1, "n": -(2**31)}, {"id": 2, "n": 7}]
    assert dead == [
        (2, "out_of_range", "column 'n': 1099511627776 (Kafka Connect int64) does not fit "
         "the column (int32)")
    ]  # fmt: skip

    schema, rows, dead = results["add-columns"]
    assert schema == {"id": "long", "n": "int", "note": "string"}
    assert rows == [{"id": 1, "n": -(2**31), "note": "x"}, {"id": 2, "n": 7, "note": "added"}]
    assert [(offset, reason) for offset, reason, _ in dead] == [(2, "schema_change")]
    assert 'evolve = "add-columns"; "add-and-widen" allows this promotion' in dead[0][2]

    schema, rows, dead = results["add-and-widen"]
    assert schema == {"id": "long", "n": "long", "note": "string"}
    assert rows == [
        {"id": 1, "n": -(2**31), "note": "x"},
        {"id": 2, "n": 7, "note": "added"},
        {"id": 3, "n": 2**40, "note": None},
    ]
    assert dead == []
