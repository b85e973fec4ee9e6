"""A topic deleted and re-created under the same name is read again, never skipped.

A real `icespool run` child consumes a topic of the Apache Kafka broker into its table
and stops; then the topic is deleted and created again under the same name, with other
records from offset 0. The new topic holds fewer records than the tables' offsets (its
end is below them), or more (only the record at the tables' marked offset tells it
apart). Every record of both
topics is in the table exactly once, and the daemon says what it found.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from pathlib import Path

import aiohttp
import pytest
from support.daemon_harness import TABLE, Daemon, DaemonDir
from support.kafka_harness import Broker, create_topic, delete_topic, produce, unique_name

PARTITIONS = 2


def _config(home: DaemonDir, bootstrap: str, topic: str) -> None:
    home.write_config(
        batch_timeout="300ms",
        extra=f"""
[[kafka]]
bootstrap_servers = "{bootstrap}"
group_id = "g-{topic}"
topics = ["{topic}"]
table = "{TABLE}"
offset_commit_interval = "1s"
session_timeout = "4s"
""",
    )


def _records(ids: range) -> list[dict[str, object]]:
    return [{"id": i, "v": f"r{i}"} for i in ids]


async def _table_ids(home: DaemonDir) -> Counter[int]:
    rows, _ = await asyncio.to_thread(home.read_rows)
    return Counter(int(r["id"]) for r in rows)


async def _until_ids(home: DaemonDir, daemon: Daemon, expected: set[int], within: float) -> None:
    deadline = time.monotonic() + within
    while True:
        ids = await _table_ids(home)
        if set(ids) >= expected:
            return
        if time.monotonic() > deadline:
            missing = sorted(expected - set(ids))
            raise AssertionError(
                f"{len(missing)} ids never reached the table (first {missing[:10]})\n"
                f"{daemon.tail()}"
            )
        await asyncio.sleep(0.3)


async def _metric(daemon: Daemon, kind: str, topic: str) -> float:
    async with aiohttp.ClientSession() as session:
        text = await daemon.metrics(session)
    pattern = rf'^icespool_kafka_partition_changes_total\{{kind="{kind}",topic="{topic}"\}} (\S+)$'
    found = re.search(pattern, text, re.M)
    return float(found.group(1)) if found else 0.0


@pytest.mark.parametrize("new_count", [500, 3000], ids=["fewer-records", "more-records"])
async def test_a_recreated_topic_is_read_from_its_start(
    broker: Broker, tmp_path: Path, new_count: int
) -> None:
    topic = unique_name("life")
    home = DaemonDir(tmp_path / "d")
    _config(home, broker.bootstrap, topic)
    daemon = Daemon(home)
    old = range(2000)
    new = range(100_000, 100_000 + new_count)
    try:
        await create_topic(broker.bootstrap, topic, PARTITIONS)
        await produce(broker.bootstrap, topic, _records(old), partitions=PARTITIONS)
        daemon.start()
        await daemon.wait_ready()
        await _until_ids(home, daemon, set(old), within=60)
        daemon.signal(15)
        assert await daemon.wait_exit(60) == 0
        # The topic goes away and comes back with other records at the same offsets.
        await delete_topic(broker.bootstrap, topic)
        await create_topic(broker.bootstrap, topic, PARTITIONS)
        await produce(broker.bootstrap, topic, _records(new), partitions=PARTITIONS)
        daemon.start()
        await daemon.wait_ready()
        await _until_ids(home, daemon, set(old) | set(new), within=90)
        await daemon.wait_log("changed under the tables", within=10)
        assert await _metric(daemon, "recreated", topic) >= 1
        log = daemon.all_logs()
        assert "the topic was re-created" in log, daemon.tail()
        if new_count < len(old) / PARTITIONS:
            assert "but the partition ends at" in log and "has no record at offset" in log
        else:
            assert "is not the one the tables hold" in log
        daemon.signal(15)
        assert await daemon.wait_exit(60) == 0
    finally:
        daemon.cleanup()
    ids = await _table_ids(home)
    assert set(ids) == set(old) | set(new)
    assert [i for i, n in ids.items() if n > 1] == []


async def test_an_unchanged_topic_is_resumed_not_reread(broker: Broker, tmp_path: Path) -> None:
    """The check costs a restart nothing: the same topic resumes where the tables are."""
    topic = unique_name("life")
    home = DaemonDir(tmp_path / "d")
    _config(home, broker.bootstrap, topic)
    daemon = Daemon(home)
    try:
        await create_topic(broker.bootstrap, topic, PARTITIONS)
        await produce(broker.bootstrap, topic, _records(range(1000)), partitions=PARTITIONS)
        daemon.start()
        await daemon.wait_ready()
        await _until_ids(home, daemon, set(range(1000)), within=60)
        daemon.signal(15)
        assert await daemon.wait_exit(60) == 0
        await produce(broker.bootstrap, topic, _records(range(1000, 1500)), partitions=PARTITIONS)
        daemon.start()
        await daemon.wait_ready()
        await _until_ids(home, daemon, set(range(1500)), within=60)
        assert await _metric(daemon, "recreated", topic) == 0
        assert "changed under the tables" not in daemon.all_logs()
        assert "resuming at 500" in daemon.log() or "resuming at 50" in daemon.log()
        daemon.signal(15)
        assert await daemon.wait_exit(60) == 0
    finally:
        daemon.cleanup()
    ids = await _table_ids(home)
    assert set(ids) == set(range(1500)) and max(ids.values()) == 1
