"""A topic changed under a daemon that keeps consuming it (no restart).

A real `icespool run` child consumes a topic of the Apache Kafka broker. While it runs,
the topic is deleted and re-created under the same name with fewer or more records, also
while records of the old topic wait in the spool. Every record of every version of the
topic is in the table exactly once. (Apache Kafka revokes a deleted topic's partitions and
assigns the new topic's, so the tables' marks are checked at that assignment.)
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
from support.daemon_harness import Daemon, DaemonDir
from support.kafka_harness import Broker, create_topic, delete_topic, produce, unique_name
from test_topic_life import PARTITIONS, _config, _records, _table_ids, _until_ids


@pytest.mark.parametrize("new_count", [500, 3000], ids=["fewer-records", "more-records"])
async def test_a_topic_recreated_while_consumed(
    broker: Broker, tmp_path: Path, new_count: int
) -> None:
    topic = unique_name("live")
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
        await delete_topic(broker.bootstrap, topic)
        await asyncio.sleep(2)
        await create_topic(broker.bootstrap, topic, PARTITIONS)
        await produce(broker.bootstrap, topic, _records(new), partitions=PARTITIONS)
        await _until_ids(home, daemon, set(old) | set(new), within=120)
        await asyncio.sleep(3)  # anything read twice would have landed by now
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
