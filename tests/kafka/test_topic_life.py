"""What happens to a topic under the daemon: it is re-created, grows partitions, or
loses records to retention before they are read.

A real `icespool run` child consumes a topic of the Apache Kafka broker into its table.
Then the topic is deleted and created again under the same name, with other records
from offset 0 (while the daemon is stopped, or while it consumes): the new topic holds
fewer records than the tables' offsets (its end is below them), or more (only the
record at the tables' marked offset tells it apart). Every record of both topics is in
the table exactly once, and the daemon says what it found. Partitions added while it
consumes are read within its metadata refresh. Records deleted before they were read
(while it is stopped, or while it is frozen with the partition assigned) are reported
with their offsets and counted, and reading goes on at the first kept offset.
"""

from __future__ import annotations

import asyncio
import re
import signal
import time
from collections import Counter
from pathlib import Path

import aiohttp
import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, RecordsToDelete
from support.daemon_harness import TABLE, Daemon, DaemonDir
from support.kafka_harness import Broker, create_topic, delete_topic, produce, unique_name

PARTITIONS = 2


def _config(home: DaemonDir, bootstrap: str, topic: str, extra: str = "") -> None:
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
{extra}""",
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


async def _admin(bootstrap: str) -> AIOKafkaAdminClient:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    return admin


async def _delete_before(bootstrap: str, topic: str, offset: int) -> None:
    """Delete every partition's records before ``offset`` (as retention would)."""
    admin = await _admin(bootstrap)
    try:
        done = await admin.delete_records(
            {TopicPartition(topic, p): RecordsToDelete(offset) for p in range(PARTITIONS)},
            timeout_ms=10_000,
        )
        assert done == {TopicPartition(topic, p): offset for p in range(PARTITIONS)}
    finally:
        await admin.close()


async def test_partitions_added_while_consuming_are_read(broker: Broker, tmp_path: Path) -> None:
    """Two partitions become four: the daemon's metadata refresh (metadata_max_age)
    finds them, the group rebalances, and every record of all four is read once."""
    topic = unique_name("life")
    home = DaemonDir(tmp_path / "d")
    _config(home, broker.bootstrap, topic, 'metadata_max_age = "3s"')
    daemon = Daemon(home)
    try:
        await create_topic(broker.bootstrap, topic, PARTITIONS)
        await produce(broker.bootstrap, topic, _records(range(1000)), partitions=PARTITIONS)
        daemon.start()
        await daemon.wait_ready()
        await _until_ids(home, daemon, set(range(1000)), within=60)
        admin = await _admin(broker.bootstrap)
        try:
            await admin.create_partitions({topic: NewPartitions(total_count=4)})
            while True:
                (described,) = await admin.describe_topics([topic])
                if len([p for p in described["partitions"] if p["leader"] >= 0]) == 4:
                    break
                await asyncio.sleep(0.1)
        finally:
            await admin.close()
        added = time.monotonic()
        await produce(broker.bootstrap, topic, _records(range(1000, 3000)), partitions=4)
        await _until_ids(home, daemon, set(range(3000)), within=60)
        took = time.monotonic() - added
        log = daemon.all_logs()
        for p in (2, 3):
            assert f"assigned {topic}[{p}], resuming at 0 (no table knows it" in log, daemon.tail()
        # Within the metadata refresh, a rebalance and a table commit.
        assert took < 30, took
        daemon.signal(15)
        assert await daemon.wait_exit(60) == 0
    finally:
        daemon.cleanup()
    ids = await _table_ids(home)
    assert set(ids) == set(range(3000)) and max(ids.values()) == 1


async def test_records_deleted_while_stopped_are_reported(broker: Broker, tmp_path: Path) -> None:
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
        # Each partition ends at 500; 500 more each, then 500-699 deleted unread.
        await produce(broker.bootstrap, topic, _records(range(1000, 2000)), partitions=PARTITIONS)
        await _delete_before(broker.bootstrap, topic, 700)
        daemon.start()
        await daemon.wait_ready()
        await _until_ids(home, daemon, set(range(1400, 2000)), within=60)
        await daemon.wait_log("changed under the tables", within=10, count=PARTITIONS)
        log = daemon.all_logs()
        for p in range(PARTITIONS):
            assert (
                f"{topic}[{p}] changed under the tables: offsets 500-699 were deleted before "
                "they were read; those records are lost to the tables; reading on at 700"
            ) in log, daemon.tail()
        assert await _metric(daemon, "retention", topic) == PARTITIONS
        assert await _metric(daemon, "recreated", topic) == 0
        daemon.signal(15)
        assert await daemon.wait_exit(60) == 0
        # The tables' ranges now reach over the deleted offsets: reported once only.
        daemon.start()
        await daemon.wait_ready()
        for p in range(PARTITIONS):
            await daemon.wait_log(f"assigned {topic}[{p}], resuming at 1000", within=30)
        assert "changed under the tables" not in daemon.log(), daemon.tail()
        assert await _metric(daemon, "retention", topic) == 0
        daemon.signal(15)
        assert await daemon.wait_exit(60) == 0
    finally:
        daemon.cleanup()
    ids = await _table_ids(home)
    # Records 1000-1399 sat at offsets 500-699 of the two partitions.
    assert set(ids) == set(range(1000)) | set(range(1400, 2000))
    assert max(ids.values()) == 1


async def test_records_deleted_while_frozen_are_reported(broker: Broker, tmp_path: Path) -> None:
    """The daemon keeps its partitions (its session outlasts the freeze) but its fetch
    position is deleted under it: the fetch's OffsetOutOfRange is logged with the lost
    offsets and counted, and reading goes on at the first kept offset, not the end."""
    topic = unique_name("life")
    home = DaemonDir(tmp_path / "d")
    _config(home, broker.bootstrap, topic)
    home.config_path.write_text(
        home.config_path.read_text().replace('session_timeout = "4s"', 'session_timeout = "60s"')
    )
    daemon = Daemon(home)
    try:
        await create_topic(broker.bootstrap, topic, PARTITIONS)
        await produce(broker.bootstrap, topic, _records(range(1000)), partitions=PARTITIONS)
        daemon.start()
        await daemon.wait_ready()
        await _until_ids(home, daemon, set(range(1000)), within=60)
        daemon.signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(1.5)  # a fetch in flight returns empty meanwhile
            await produce(
                broker.bootstrap, topic, _records(range(1000, 2000)), partitions=PARTITIONS
            )
            await _delete_before(broker.bootstrap, topic, 700)
        finally:
            daemon.signal(signal.SIGCONT)
        thawed = time.monotonic()
        await _until_ids(home, daemon, set(range(1400, 2000)), within=60)
        await daemon.wait_log("changed while read", within=10, count=PARTITIONS)
        took = time.monotonic() - thawed
        log = daemon.all_logs()
        for p in range(PARTITIONS):
            assert (
                f"{topic}[{p}] changed while read: offsets 500-699 were deleted before they "
                "were read; those records are lost to the tables; reading on at 700"
            ) in log, daemon.tail()
        assert "changed under the tables" not in log  # no rebalance: the fetch saw it
        assert await _metric(daemon, "retention", topic) == PARTITIONS
        assert took < 30, took
        daemon.signal(15)
        assert await daemon.wait_exit(60) == 0
    finally:
        daemon.cleanup()
    ids = await _table_ids(home)
    assert set(ids) == set(range(1000)) | set(range(1400, 2000))
    assert max(ids.values()) == 1


@pytest.mark.parametrize("new_count", [500, 3000], ids=["fewer-records", "more-records"])
async def test_a_topic_recreated_while_consumed_is_read_again(
    broker: Broker, tmp_path: Path, new_count: int
) -> None:
    topic = unique_name("life")
    home = DaemonDir(tmp_path / "d")
    _config(home, broker.bootstrap, topic, 'metadata_max_age = "3s"')
    daemon = Daemon(home)
    old = range(2000)
    new = range(100_000, 100_000 + new_count)
    try:
        await create_topic(broker.bootstrap, topic, PARTITIONS)
        await produce(broker.bootstrap, topic, _records(old), partitions=PARTITIONS)
        daemon.start()
        await daemon.wait_ready()
        await _until_ids(home, daemon, set(old), within=60)
        await delete_topic(broker.bootstrap, topic)
        await create_topic(broker.bootstrap, topic, PARTITIONS)
        recreated = time.monotonic()
        await produce(broker.bootstrap, topic, _records(new), partitions=PARTITIONS)
        await _until_ids(home, daemon, set(old) | set(new), within=90)
        took = time.monotonic() - recreated
        log = daemon.all_logs()
        assert "the topic was re-created" in log, daemon.tail()
        assert await _metric(daemon, "recreated", topic) >= 1
        assert took < 60, took
        daemon.signal(15)
        assert await daemon.wait_exit(60) == 0
    finally:
        daemon.cleanup()
    ids = await _table_ids(home)
    assert set(ids) == set(old) | set(new)
    assert [i for i, n in ids.items() if n > 1] == []


@pytest.mark.parametrize("new_count", [500, 3000], ids=["fewer-records", "more-records"])
async def test_a_topic_recreated_while_frozen_is_read_again(
    broker: Broker, tmp_path: Path, new_count: int
) -> None:
    """The daemon keeps its partitions and its metadata through the deletion (frozen,
    its session outlasts it), so no rebalance tells it. A new topic shorter than its
    fetch position makes the fetch out of range (unless the topic id check on the
    offset tick comes first); a longer one is fetched without an error, and only its
    topic id tells it apart. Either way the new topic is read from its start, once,
    and each partition's change is counted once."""
    topic = unique_name("life")
    home = DaemonDir(tmp_path / "d")
    _config(home, broker.bootstrap, topic)
    home.config_path.write_text(
        home.config_path.read_text().replace('session_timeout = "4s"', 'session_timeout = "60s"')
    )
    daemon = Daemon(home)
    old = range(2000)
    new = range(100_000, 100_000 + new_count)
    try:
        await create_topic(broker.bootstrap, topic, PARTITIONS)
        await produce(broker.bootstrap, topic, _records(old), partitions=PARTITIONS)
        daemon.start()
        await daemon.wait_ready()
        await _until_ids(home, daemon, set(old), within=60)
        daemon.signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(1.5)  # a fetch in flight returns empty meanwhile
            await delete_topic(broker.bootstrap, topic)
            await create_topic(broker.bootstrap, topic, PARTITIONS)
            await produce(broker.bootstrap, topic, _records(new), partitions=PARTITIONS)
        finally:
            daemon.signal(signal.SIGCONT)
        thawed = time.monotonic()
        await _until_ids(home, daemon, set(old) | set(new), within=60)
        took = time.monotonic() - thawed
        await daemon.wait_log("changed while read", within=10, count=PARTITIONS)
        log = daemon.all_logs()
        for p in range(PARTITIONS):
            found = re.search(
                rf"{re.escape(topic)}\[{p}\] changed while read: (.*?); the topic was "
                r"re-created \(or its log truncated\): reading it from its start, offset 0",
                log,
            )
            assert found is not None, daemon.tail()
            by_id = re.fullmatch(
                r"its topic's id changed from [0-9a-f]{32} to [0-9a-f]{32}", found.group(1)
            )
            if new_count < len(old) / PARTITIONS:
                # Whichever comes first after the thaw: the fetch, or the offset tick.
                fetch = "the partition ends at offset 250 but was being read at 1000"
                assert by_id or found.group(1) == fetch, found.group(1)
            else:
                assert by_id, found.group(1)
        assert "changed under the tables" not in log
        assert await _metric(daemon, "recreated", topic) == PARTITIONS
        assert took < 30, took
        daemon.signal(15)
        assert await daemon.wait_exit(60) == 0
    finally:
        daemon.cleanup()
    ids = await _table_ids(home)
    assert set(ids) == set(old) | set(new)
    assert [i for i, n in ids.items() if n > 1] == []


async def test_a_topic_recreated_while_its_records_wait_in_the_spool(
    broker: Broker, tmp_path: Path
) -> None:
    """The old topic's records are acked into the spool, not committed, when the topic
    is deleted and re-created with other records at the same offsets."""
    topic = unique_name("pending")
    home = DaemonDir(tmp_path / "d")
    _config(home, broker.bootstrap, topic)
    text = home.config_path.read_text().replace('batch_timeout = "300ms"', 'batch_timeout = "1h"')
    home.config_path.write_text(text)
    daemon = Daemon(home)
    old = range(2000)
    new = range(100_000, 103_000)
    try:
        await create_topic(broker.bootstrap, topic, PARTITIONS)
        await produce(broker.bootstrap, topic, _records(range(1000)), partitions=PARTITIONS)
        daemon.start()
        await daemon.wait_ready()
        async with aiohttp.ClientSession() as session:
            # The first half committed (the tables have marks), the second only spooled.
            deadline = asyncio.get_running_loop().time() + 60
            while not set(await _table_ids(home)) >= set(range(1000)):
                assert asyncio.get_running_loop().time() < deadline, daemon.tail()
                await daemon.flush(session)
                await asyncio.sleep(0.3)
            await produce(
                broker.bootstrap, topic, _records(range(1000, 2000)), partitions=PARTITIONS
            )
            await asyncio.sleep(3)  # consumed into the spool
            await delete_topic(broker.bootstrap, topic)
            await asyncio.sleep(2)
            await create_topic(broker.bootstrap, topic, PARTITIONS)
            await produce(broker.bootstrap, topic, _records(new), partitions=PARTITIONS)
            deadline = asyncio.get_running_loop().time() + 120
            while not set(await _table_ids(home)) >= set(old) | set(new):
                assert asyncio.get_running_loop().time() < deadline, daemon.tail()
                await daemon.flush(session)
                await asyncio.sleep(1)
            await asyncio.sleep(3)
            await daemon.flush(session)
        daemon.signal(15)
        assert await daemon.wait_exit(60) == 0
    finally:
        daemon.cleanup()
    ids = await _table_ids(home)
    missing = sorted((set(old) | set(new)) - set(ids))
    assert not missing and set(ids) == set(old) | set(new), f"missing {missing[:10]}"
    assert [i for i, n in ids.items() if n > 1] == []
