"""Keyed Kafka changes into one upsert table from three `icespool run` replicas in one
consumer group (shared PostgreSQL catalog and warehouse), while the group rebalances:
a replica joins, one is killed with SIGKILL, one stops. A key's changes stay in its
partition, so its rows are written by whichever replica held the partition then; the
replica that gets it next finds those rows through its own key index (synced to the
others' commits) and deletes them by position. At the end the merged state equals the
last change of every key in its partition's order, no key is live twice, and no
equality delete is left.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path

import pytest
from support.daemon_harness import TABLE, Daemon, DaemonDir
from support.kafka_harness import Broker, create_topic, unique_name

from icespool.cdc import live_files, read_merged

PARTITIONS = 6
KEYS = 600
State = dict[int, str]


def _section(broker: Broker, topic: str) -> str:
    return f"""key = ["id"]

[[kafka]]
bootstrap_servers = "{broker.bootstrap}"
group_id = "g-{topic}"
topics = ["{topic}"]
table = "{TABLE}"
changes = "keyed"
key_format = "string"
offset_commit_interval = "1s"
session_timeout = "6s"

[maintenance]
interval = "2s"
"""


async def _round(broker: Broker, topic: str, state: State, rng: random.Random, tag: str) -> None:
    """Changes of random keys (30 % deletes: a null value), each in its key's partition."""
    changes: list[tuple[int, str | None]] = []
    for n in range(900):
        key = rng.randrange(KEYS)
        value = None if rng.random() < 0.3 else f"{tag}-{n}"
        changes.append((key, value))
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
    await _send(broker, topic, changes)


async def _send(broker: Broker, topic: str, changes: list[tuple[int, str | None]]) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=5)
    await producer.start()
    try:
        sent = [
            await producer.send(
                topic,
                key=str(key).encode(),
                value=None if value is None else json.dumps({"id": key, "v": value}).encode(),
                partition=key % PARTITIONS,
            )
            for key, value in changes
        ]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


def _merged(home: DaemonDir) -> tuple[State, int, int]:
    """The merged state, the rows live twice, and the live equality deletes."""
    table, catalog = home.load_table()
    try:
        rows = read_merged(table).to_pylist()
        snapshot = table.metadata.current_snapshot()
        live = live_files(table.io, table.metadata, snapshot) if snapshot else None
        equality = sum(1 for d in live.deletes if d.is_equality) if live else 0
    finally:
        catalog.engine.dispose()
    return {r["id"]: r["v"] for r in rows}, len(rows) - len({r["id"] for r in rows}), equality


async def _converged(home: DaemonDir, state: State, daemons: list[Daemon], within: float) -> None:
    deadline = time.monotonic() + within
    got: tuple[State, int, int] = ({}, 0, 0)
    while time.monotonic() < deadline:
        got = await asyncio.to_thread(_merged, home)
        if got == (state, 0, 0):
            return
        await asyncio.sleep(1)
    differ = sorted(k for k in set(state) | set(got[0]) if state.get(k) != got[0].get(k))
    tails = "\n".join(d.tail(15) for d in daemons if d.log_path)
    raise AssertionError(
        f"{len(differ)} keys differ (e.g. {differ[:5]}), {got[1]} rows live twice, "
        f"{got[2]} equality deletes live\n{tails}"
    )


@pytest.mark.slow
async def test_keys_moving_between_replicas_are_deleted_by_position_exactly(
    broker: Broker, tmp_path: Path, postgres_uri: str
) -> None:
    topic = unique_name("upsert-replicas")
    await create_topic(broker.bootstrap, topic, PARTITIONS)
    warehouse = tmp_path / "warehouse"
    warehouse.mkdir()
    homes = [
        DaemonDir(tmp_path / f"r{i}", catalog_uri=postgres_uri, shared_warehouse=warehouse)
        for i in range(3)
    ]
    for home in homes:
        home.write_config(batch_timeout="1s", extra=_section(broker, topic))
    daemons = [Daemon(h) for h in homes]
    rng = random.Random(3434)
    state: State = {}
    try:
        # Replica 0 alone writes every key.
        daemons[0].start()
        await daemons[0].wait_ready()
        await _send(broker, topic, [(k, f"a-{k}") for k in range(KEYS)])
        state.update({k: f"a-{k}" for k in range(KEYS)})
        await _converged(homes[0], state, daemons, 60)
        # Two more join: their partitions' keys were written by replica 0.
        daemons[1].start()
        daemons[2].start()
        await _round(broker, topic, state, rng, "b")
        for daemon in daemons[1:]:
            await daemon.wait_ready()
        await _round(broker, topic, state, rng, "c")
        await asyncio.sleep(3)
        # Replica 0 killed: its partitions move once its session times out.
        assert daemons[0].kill() == -9
        await _round(broker, topic, state, rng, "d")
        await asyncio.sleep(4)
        # Back, and replica 1 leaves for good.
        daemons[0].start()
        await daemons[0].wait_ready()
        daemons[1].signal(15)
        assert await daemons[1].wait_exit(60) == 0, daemons[1].tail()
        await _round(broker, topic, state, rng, "e")
        await _converged(homes[0], state, daemons, 120)
    finally:
        for daemon in daemons:
            daemon.cleanup()
    assert not homes[1].spool_files(), "the stopped replica left changes in its spool"
    logs = "".join(d.all_logs() for d in daemons)
    # Each replica's commits deleted by position (none fell back to keys for good).
    assert logs.count("key index ready at snapshot") >= len(daemons), logs[-3000:]
    assert "commits delete by key until" not in logs, logs[-3000:]
