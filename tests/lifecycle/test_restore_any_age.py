"""Disaster recovery at any age: a snapshot of a spool volume, restored after every snapshot
of the tables older than now was expired, commits exactly what the tables lack.

A real `icespool run` on PostgreSQL writes four tables: append and upsert, from HTTP and
from Kafka. Its spool is copied while segments of every table are open (the volume
snapshot); the daemon then commits those segments and more, and every snapshot but the
current one is expired, so neither a snapshot summary nor the spool's last-segments
property names the copied segments any more. The daemon is killed and its disk lost
(with the records it acked after its last commit); the snapshot is restored in a new
place and started. Every record is in its table exactly once, the upsert tables hold the
last change of each key (a change committed again would bring an older value back), and
the Kafka records the lost disk held are read again from the topics.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
from aiokafka import AIOKafkaProducer
from pyiceberg.catalog import Catalog, load_catalog
from support.apache_kafka import KafkaBroker
from support.daemon_harness import CATALOG_NAME, NDJSON, Daemon, DaemonDir, ndjson
from support.kafka_harness import SESSION_TIMEOUT, create_topic, unique_name
from support.table_reader import append_ids, merged_rows

EVENTS, USERS, STREAM, KEYED = "t.events", "t.users", "t.stream", "t.keyed"
TABLES = (EVENTS, USERS, STREAM, KEYED)
COLUMNS = '{ name = "id", type = "long", required = true }, { name = "v", type = "string" }'


def _config(home: DaemonDir, stream: str, keyed: str, bootstrap: str) -> None:
    source = f"""bootstrap_servers = "{bootstrap}"
session_timeout = "{SESSION_TIMEOUT}"
offset_commit_interval = "1s"
"""
    home.write_config(
        batch_timeout="1h",
        max_batch_records=10_000_000,
        table=f"create = true\nschema = [{COLUMNS}]",
        extra=f"""
[[tables]]
name = "{USERS}"
create = true
key = ["id"]
schema = [{COLUMNS}]

[[tables]]
name = "{STREAM}"
create = true
schema = [{COLUMNS}]

[[tables]]
name = "{KEYED}"
create = true
key = ["id"]
schema = [{COLUMNS}]

[[kafka]]
{source}group_id = "g-{stream}"
topics = ["{stream}"]
table = "{STREAM}"

[[kafka]]
{source}group_id = "g-{keyed}"
topics = ["{keyed}"]
table = "{KEYED}"
changes = "keyed"
key_format = "string"

[maintenance]
enabled = false
""",
    )


class Writes:
    """What the test sends, and the state each table must end in."""

    def __init__(self, bootstrap: str, stream: str, keyed: str) -> None:
        self.bootstrap, self.stream, self.keyed = bootstrap, stream, keyed
        self.events: list[int] = []
        self.users: dict[int, str] = {}
        self.stream_ids: list[int] = []
        self.keyed_state: dict[int, str] = {}

    async def round(self, daemon: Daemon, n: int, acked: int, keys: int = 50) -> None:
        """Round ``n``: 200 events, a change of each of ``keys`` user keys, and 240
        Kafka records; returns once the daemon's process acked ``acked`` Kafka records."""
        ids = range(n * 1000, n * 1000 + 200)
        changes = [{"id": k, "v": f"round {n}", "_op": "upsert"} for k in range(keys)]
        async with aiohttp.ClientSession() as session:
            for path, body in ((f"{EVENTS}/records", _rows(ids)), (f"{USERS}/changes", changes)):
                async with session.post(
                    f"{daemon.url}/v1/tables/{path}",
                    data=ndjson(body),
                    headers={"Content-Type": NDJSON},
                ) as answer:
                    assert answer.status == 200, await answer.text()
        self.events += ids
        self.users.update(dict.fromkeys(range(keys), f"round {n}"))
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all")
        await producer.start()
        try:
            for i in ids:
                await producer.send(self.stream, json.dumps({"id": i, "v": "s"}).encode())
            for k in range(40):
                value = json.dumps({"id": k, "v": f"round {n}"}).encode()
                await producer.send(self.keyed, value, key=str(k).encode(), partition=k % 2)
            await producer.flush()
        finally:
            await producer.stop()
        self.stream_ids += ids
        self.keyed_state.update(dict.fromkeys(range(40), f"round {n}"))
        await _acked(daemon, acked)

    def lose(self, n: int) -> None:
        """Round ``n``'s HTTP writes are lost with the disk (acked, never committed)."""
        self.events = [i for i in self.events if not n * 1000 <= i < n * 1000 + 200]
        self.users.update(dict.fromkeys(range(50), f"round {n - 1}"))


def _rows(ids: range) -> list[dict[str, Any]]:
    return [{"id": i, "v": f"r{i}"} for i in ids]


async def _acked(daemon: Daemon, kafka_records: int) -> None:
    """Until the daemon acked ``kafka_records`` Kafka records (its spool holds them)."""
    deadline = time.monotonic() + 60
    async with aiohttp.ClientSession() as session:
        while True:
            text = await daemon.metrics(session)
            acked = sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("icespool_records_acked_total{")
                and (f'table="{STREAM}"' in line or f'table="{KEYED}"' in line)
            )
            if acked >= kafka_records:
                return
            assert time.monotonic() < deadline, f"{acked} of {kafka_records} Kafka records acked"
            await asyncio.sleep(0.2)


async def _flush(daemon: Daemon) -> None:
    async with aiohttp.ClientSession() as session:
        for table in TABLES:
            async with session.post(f"{daemon.url}/v1/tables/{table}/flush") as answer:
                assert answer.status == 200, await answer.text()


def _expire_all_but_current(catalog: Catalog) -> None:
    for name in TABLES:
        table = catalog.load_table(name)
        current = table.current_snapshot()
        assert current is not None
        old = [s.snapshot_id for s in table.snapshots() if s.snapshot_id != current.snapshot_id]
        table.maintenance.expire_snapshots().by_ids(old).commit()
        assert len(catalog.load_table(name).snapshots()) == 1


async def test_a_volume_snapshot_restored_after_every_snapshot_expired(
    tmp_path: Path, postgres_uri: str, broker: KafkaBroker
) -> None:
    stream, keyed = unique_name("restore-stream"), unique_name("restore-keyed")
    await create_topic(broker.bootstrap, stream, 2)
    await create_topic(broker.bootstrap, keyed, 2)
    warehouse = tmp_path / "warehouse"
    original_home = DaemonDir(tmp_path / "original", postgres_uri, warehouse)
    restored_home = DaemonDir(tmp_path / "restored", postgres_uri, warehouse)
    for home in (original_home, restored_home):
        _config(home, stream, keyed, broker.bootstrap)
    writes = Writes(broker.bootstrap, stream, keyed)
    original, restored = Daemon(original_home), Daemon(restored_home)
    snapshot = tmp_path / "volume-snapshot"
    try:
        original.start()
        await original.wait_ready()
        await writes.round(original, 1, 1 * 240)
        await _flush(original)
        await writes.round(original, 2, 2 * 240)  # open segments of every table
        shutil.copytree(original_home.spool_dir, snapshot)  # the volume snapshot
        await writes.round(original, 3, 3 * 240)  # the same segments grow
        await _flush(original)
        for n in (4, 5):
            await writes.round(original, n, n * 240)
            await _flush(original)
        catalog = load_catalog(CATALOG_NAME, **original_home.catalog_properties)
        await asyncio.to_thread(_expire_all_but_current, catalog)
        await writes.round(original, 6, 6 * 240)  # acked, never committed: lost with the disk
        writes.lose(6)
        original.kill()
        shutil.rmtree(original_home.spool_dir)

        shutil.copytree(snapshot, restored_home.spool_dir)
        restored.start()
        await restored.wait_ready()  # recovery committed what the tables lacked
        log = restored.log()
        assert "spool recovery: 4 segments" in log, restored.tail()
        assert log.count("(expired since; the table's properties say so)") == 4, restored.tail()
        # Round 6's Kafka records again (the lost disk held them), and round 7's.
        await writes.round(restored, 7, 2 * 240, keys=25)
        await _flush(restored)
        restored.signal(signal.SIGTERM)
        assert await restored.wait_exit(60) == 0, restored.tail()
    finally:
        original.cleanup()
        restored.cleanup()

    assert await asyncio.to_thread(append_ids, catalog, EVENTS) == Counter(writes.events)
    assert await asyncio.to_thread(append_ids, catalog, STREAM) == Counter(writes.stream_ids)
    for name, expected in ((USERS, writes.users), (KEYED, writes.keyed_state)):
        merged = await asyncio.to_thread(merged_rows, catalog, name)
        assert merged.doubled == []
        assert {k: row["v"] for k, row in merged.rows.items()} == expected, name
    assert restored_home.spool_files() == []
