"""Exactly-once from Kafka under real faults: `icespool run` child processes killed
with SIGKILL, several replicas in one consumer group on a shared PostgreSQL
catalog, and a catalog that stalls while the spool is tiny (backpressure).

Every test ends by reading the table back and asserting every produced id is
present exactly once.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sqlite3
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from support.daemon_harness import TABLE, Daemon, DaemonDir
from support.fixture_types import rest_catalog_server
from support.kafka_harness import Broker, create_topic, produce, unique_name

PARTITIONS = 6


def _kafka_section(broker: Broker, topic: str, group: str, extra: str = "") -> str:
    return f"""
[[kafka]]
bootstrap_servers = "{broker.bootstrap}"
group_id = "{group}"
topics = ["{topic}"]
table = "{TABLE}"
offset_commit_interval = "1s"
session_timeout = "6s"
{extra}
"""


def _assert_exactly(home: DaemonDir, n: int) -> None:
    rows, _ = home.read_rows()
    ids = Counter(r["id"] for r in rows)
    twice = [i for i, c in ids.items() if c > 1]
    missing = n - len(ids)
    assert not twice, f"{len(twice)} ids twice, e.g. {twice[:5]}"
    assert missing == 0 and set(ids) == set(range(n)), f"{missing} ids missing"
    assert len(rows) == n


async def _wait_count(home: DaemonDir, n: int, within: float, daemons: list[Daemon]) -> None:
    deadline = time.monotonic() + within
    count = -1
    while time.monotonic() < deadline:
        rows, _ = await asyncio.to_thread(home.read_rows)
        count = len(rows)
        if count >= n:
            return
        await asyncio.sleep(1)
    tails = "\n".join(d.tail() for d in daemons if d.log_path)
    raise AssertionError(f"{count} of {n} rows after {within}s\n{tails}")


async def _produce_slowly(broker: Broker, topic: str, n: int, chunk: int, pause: float) -> None:
    for start in range(0, n, chunk):
        records = [{"id": i, "v": f"r{i}"} for i in range(start, min(n, start + chunk))]
        await produce(broker.bootstrap, topic, records, partitions=PARTITIONS)
        await asyncio.sleep(pause)


@dataclass(frozen=True)
class Backend:
    """Where the replicas commit: ``sql`` (SQLite / a shared PostgreSQL, local warehouse)
    or ``rest-s3`` (SeaweedFS's REST catalog and S3, shared by every replica) or
    ``rest-iceberg`` (Apache Iceberg's reference REST server on that S3). The REST
    runs are smaller: the suite's time budget, and REST + S3 faults have their own tests."""

    name: str
    records: int
    kills: int
    catalog: dict[str, str] | None = None


def _backend(name: str, request: pytest.FixtureRequest, records: int, kills: int) -> Backend:
    if name == "sql":
        return Backend(name, records, kills)
    store = rest_catalog_server(name, request)
    rounds = int(os.environ.get("ICESPOOL_REST_KILL_ROUNDS", "2"))
    catalog = store.catalog_properties(store.warehouse())
    return Backend(name, 30_000, min(kills, rounds), catalog)


@pytest.mark.slow
@pytest.mark.parametrize("backend_name", ["sql", "rest-s3"])
async def test_kill_9_at_random_moments_loses_and_duplicates_nothing(
    backend_name: str, broker: Broker, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # ICESPOOL_KILL_ROUNDS (default 6, the CI budget) kills while the producer runs.
    backend = _backend(
        backend_name, request, 200_000, int(os.environ.get("ICESPOOL_KILL_ROUNDS", "6"))
    )
    n = backend.records
    topic = unique_name(f"kills-{backend.name}")
    await create_topic(broker.bootstrap, topic, PARTITIONS)
    home = DaemonDir(tmp_path / "d", catalog=backend.catalog)
    home.write_config(
        batch_timeout="1s",
        max_batch_records=30_000,
        extra=_kafka_section(broker, topic, f"g-{topic}"),
    )
    daemon = Daemon(home)
    rng = random.Random(4)
    chunk = min(10_000, n // 10)
    producer = asyncio.create_task(_produce_slowly(broker, topic, n, chunk, 0.6))
    try:
        for _ in range(backend.kills):
            daemon.start()
            await daemon.wait_ready()
            await asyncio.sleep(rng.uniform(0.5, 4.0))
            assert daemon.kill() == -9
        await producer
        daemon.start()
        await daemon.wait_ready()
        await _wait_count(home, n, 120, [daemon])
        await asyncio.sleep(2)  # nothing more may arrive
        _assert_exactly(home, n)
    finally:
        producer.cancel()
        daemon.cleanup()


@pytest.mark.slow
@pytest.mark.parametrize("backend_name", ["sql", "rest-s3", "rest-iceberg"])
async def test_three_replicas_one_killed_one_stopped_drain_everything_once(
    backend_name: str, broker: Broker, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Three replicas in one group on one shared catalog; one is killed, one stopped for
    good, so the group rebalances twice while records keep coming."""
    backend = _backend(backend_name, request, 200_000, 1)
    n = backend.records
    chunk = min(10_000, n // 10)
    topic = unique_name(f"replicas-{backend.name}")
    await create_topic(broker.bootstrap, topic, PARTITIONS)
    warehouse = tmp_path / "warehouse"
    warehouse.mkdir()
    if backend.catalog is None:
        postgres_uri = request.getfixturevalue("postgres_uri")
        homes = [
            DaemonDir(tmp_path / f"r{i}", catalog_uri=postgres_uri, shared_warehouse=warehouse)
            for i in range(3)
        ]
    else:
        homes = [DaemonDir(tmp_path / f"r{i}", catalog=backend.catalog) for i in range(3)]
    for home in homes:
        home.write_config(
            batch_timeout="1s",
            max_batch_records=30_000,
            extra=_kafka_section(broker, topic, f"g-{topic}"),
        )
    daemons = [Daemon(h) for h in homes]
    producer = asyncio.create_task(_produce_slowly(broker, topic, n, chunk, 0.5))
    # The REST runs produce fewer records in the same number of chunks: the kill and
    # the stop land while records still arrive.
    pause = 4 if backend.catalog is None else 2
    try:
        for d in daemons:
            d.start()
        for d in daemons:
            await d.wait_ready()
        await asyncio.sleep(pause)
        assert daemons[0].kill() == -9  # killed mid-run, restarted below
        await asyncio.sleep(pause * 3 / 4)
        daemons[1].signal(15)  # stopped for good: drains its spool, leaves the group
        assert await daemons[1].wait_exit(60) == 0
        daemons[0].start()
        await daemons[0].wait_ready()
        await producer
        await _wait_count(homes[0], n, 150, daemons)
        await asyncio.sleep(2)
        _assert_exactly(homes[0], n)
        assert not homes[1].spool_files(), "the stopped replica left records in its spool"
        # Every partition is drained: the offsets the table holds cover the topic.
        _, table = homes[0].read_rows()
        props = table.metadata.properties
        covered = [props.get(f"icespool.kafka.g-{topic}/{topic}/{p}") for p in range(PARTITIONS)]
        # produce() spreads each chunk round-robin from partition 0.
        sizes = Counter(i % PARTITIONS for s in range(0, n, chunk) for i in range(chunk))
        for p, ranges in enumerate(covered):
            expected_last = sizes[p] - 1
            assert ranges is not None and ranges.endswith(f"-{expected_last}"), (p, ranges)
            assert ranges.startswith("0-"), (p, ranges)
    finally:
        producer.cancel()
        for d in daemons:
            d.cleanup()


def _hold_sqlite_lock(path: Path, locked: threading.Event, release: threading.Event) -> None:
    """Keep an exclusive lock on the catalog database until ``release`` (at most 120 s):
    every catalog write waits (and times out) meanwhile, like a stalled catalog service."""
    connection = sqlite3.connect(path, timeout=30, isolation_level=None)
    try:
        connection.execute("BEGIN EXCLUSIVE")
        locked.set()
        release.wait(120)
        connection.execute("COMMIT")
    finally:
        connection.close()


async def _get(daemon: Daemon, path: str) -> str:
    async with aiohttp.ClientSession() as http, http.get(daemon.url + path) as response:
        assert response.status == 200, response.status
        return await response.text()


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.slow
async def test_backpressure_pauses_partitions_and_loses_nothing(
    broker: Broker, tmp_path: Path
) -> None:
    n = 150_000
    topic = unique_name("pressure")
    await create_topic(broker.bootstrap, topic, PARTITIONS)
    home = DaemonDir(tmp_path / "d")
    home.write_config(
        batch_timeout="1s",
        max_batch_records=20_000,
        extra=_kafka_section(broker, topic, f"g-{topic}"),
        spool_extra='max_bytes = "3MiB"\nsegment_max_bytes = "1MiB"',
    )
    daemon = Daemon(home)
    try:
        daemon.start()
        await daemon.wait_ready()
        # Stall the catalog only once the partitions are assigned (assignment reads
        # the tables' offsets, and waits for the catalog, by design).
        deadline = time.monotonic() + 30
        while len(json.loads(await _get(daemon, "/v1/status"))["kafka"]["assignments"]) < 6:
            assert time.monotonic() < deadline, "partitions were not assigned"
            await asyncio.sleep(0.3)
        locked, release = threading.Event(), threading.Event()
        holder = threading.Thread(
            target=_hold_sqlite_lock, args=(home.catalog_db, locked, release), daemon=True
        )
        holder.start()
        assert locked.wait(10)
        # Watched from before the first record until the stall ends: the spool stays
        # within spool.max_bytes, some partition gets paused, RSS stays bounded.
        paused_seen = 0.0
        peak_rss = 0.0
        peak_spool = 0

        async def watch() -> None:
            nonlocal paused_seen, peak_rss, peak_spool
            while not release.is_set():
                metrics = await _get(daemon, "/metrics")
                for line in metrics.splitlines():
                    if line.startswith("icespool_kafka_paused_partitions "):
                        paused_seen = max(paused_seen, float(line.split()[1]))
                status = json.loads(await _get(daemon, "/v1/status"))
                peak_spool = max(peak_spool, status["spool"]["bytes"])
                assert daemon.pid is not None
                peak_rss = max(peak_rss, _rss_mib(daemon.pid))
                await asyncio.sleep(0.3)

        watcher = asyncio.create_task(watch())
        try:
            await produce(
                broker.bootstrap,
                topic,
                [{"id": i, "v": "x" * 40} for i in range(n)],
                partitions=PARTITIONS,
            )
            # The catalog stays stalled until a partition was paused, and then for a few
            # seconds more with every record produced (the RSS peak is taken meanwhile).
            deadline = time.monotonic() + 60
            while paused_seen < 1:
                assert time.monotonic() < deadline, "no partition was paused while stalled"
                assert not watcher.done(), watcher
                await asyncio.sleep(0.3)
            await asyncio.sleep(5)
        finally:
            release.set()
            await watcher
        assert peak_spool <= 3 * 2**20, peak_spool
        holder.join(30)
        await _wait_count(home, n, 120, [daemon])
        await asyncio.sleep(2)
        _assert_exactly(home, n)
        assert peak_rss < 400, f"RSS reached {peak_rss:.0f} MiB"
        print(
            f"backpressure: paused partitions seen {paused_seen:.0f}, peak RSS {peak_rss:.0f} MiB"
        )
    finally:
        daemon.cleanup()
