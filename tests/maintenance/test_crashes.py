"""kill -9 in the middle of maintenance and of a manifest merge, over HTTP and from Kafka.

A real `icespool run` child, maintained every second (compaction of every two small
files, expiry, an orphan sweep of files older than one second), its table merging
manifests every three (``commit.manifest.min-count-to-merge``). Each round it SIGKILLs
itself at one crash seam (tests/support/crash_seams): a compaction that wrote an output
file and committed nothing, a compaction whose replace snapshot just landed, a merge
append that wrote its merged manifest and sent nothing (HTTP: all three; Kafka: the last
two). After a clean restart every acked id (every produced record) is in the table
exactly once, and no data file is left that no snapshot references: the orphan sweep
removes what the crashes left.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from urllib.parse import urlparse

import aiohttp
from support.daemon_harness import (
    NDJSON,
    TABLE,
    Daemon,
    DaemonDir,
    DaemonError,
    crash_seam_env,
    ndjson,
)
from support.kafka_harness import Broker, create_topic, produce, unique_name

from icespool.maintenance import FileOwner, remove_orphans

SEAMS = ("during-compaction-rewrite", "after-compaction-commit", "during-manifest-merge")
# The [[tables]] entry's properties (write_config's `extra` follows it), then the section.
EXTRA = """\
[tables.properties]
"commit.manifest-merge.enabled" = "true"
"commit.manifest.min-count-to-merge" = "3"

[maintenance]
interval = "1s"
lease_ttl = "30s"
compaction_min_files = 2
orphan_older_than = "1s"
min_snapshots = 3
max_snapshot_age = "1s"
"""
PARTITIONS = 3
Feed = Callable[[], Awaitable[None]]
Done = Callable[[], Awaitable[bool]]


def _local(uri: str) -> str:
    return urlparse(uri).path


def _unreferenced(home: DaemonDir) -> tuple[set[str], set[str]]:
    """(data files, manifests and manifest lists) under the table's location that no
    snapshot in its metadata references (deleted manifest entries count as references,
    as they do for the orphan sweep: expiry removes those with their snapshots)."""
    table, catalog = home.load_table()
    try:
        data: set[str] = set()
        meta: set[str] = set()
        for snapshot in table.metadata.snapshots:
            meta.add(_local(snapshot.manifest_list))
            for manifest in snapshot.manifests(table.io):
                meta.add(_local(manifest.manifest_path))
                for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
                    data.add(_local(entry.data_file.file_path))
        root = Path(_local(table.metadata.location))
    finally:
        catalog.engine.dispose()
    on_disk_data = {str(p) for p in (root / "data").rglob("*.parquet")}
    on_disk_meta = {str(p) for p in (root / "metadata").glob("*.avro")}
    return on_disk_data - data, on_disk_meta - meta


def _assert_exactly_once(home: DaemonDir, acked: set[int], sent: set[int]) -> int:
    rows, _ = home.read_rows()
    ids = Counter(row["id"] for row in rows)
    twice = sorted(i for i, n in ids.items() if n > 1)
    assert not twice, f"{len(twice)} ids twice, e.g. {twice[:5]}"
    missing = sorted(acked - set(ids))
    assert not missing, f"{len(missing)} acked ids missing, e.g. {missing[:5]}"
    assert set(ids) <= sent
    return len(ids)


async def _crash_at(daemon: Daemon, seam: str, feed: Feed) -> None:
    """Start the daemon with ``seam`` armed, keep ``feed``ing it until it kills itself."""
    daemon.start(env=crash_seam_env(seam))
    try:
        await daemon.wait_ready()
    except DaemonError:
        # Reached while starting: recovery committing what the last crash left spooled.
        if f"crash seam: SIGKILL at {seam}" not in daemon.log():
            raise
    deadline = time.monotonic() + 60
    while daemon.running:
        assert time.monotonic() < deadline, f"{seam} never reached\n{daemon.tail()}"
        await feed()
    assert await daemon.wait_exit(5) == -signal.SIGKILL, daemon.tail()
    assert f"crash seam: SIGKILL at {seam}" in daemon.log(), daemon.tail()


async def _maintained_and_stopped(daemon: Daemon, feed: Feed, done: Done | None = None) -> None:
    """A clean start maintains the table (its first run sweeps orphans: the crashes'
    files are older than orphan_older_than by then) and is fed until ``done()``, then
    stops."""
    daemon.start()
    await daemon.wait_ready()
    deadline = time.monotonic() + 60
    while ": ok in" not in daemon.log() or (done is not None and not await done()):
        assert time.monotonic() < deadline, daemon.tail()
        await feed()
    daemon.signal(signal.SIGTERM)
    assert await daemon.wait_exit(30) == 0, daemon.tail()


async def test_kill_9_in_compaction_and_manifest_merge_over_http(tmp_path: Path) -> None:
    home = DaemonDir(tmp_path / "d")
    home.write_config(extra=EXTRA)
    daemon = Daemon(home)
    counter = itertools.count()
    sent: set[int] = set()
    acked: set[int] = set()
    left: dict[str, int] = {}

    async def feed() -> None:
        ids = [next(counter) for _ in range(10)]
        sent.update(ids)
        records = [{"id": i, "v": f"r{i}"} for i in ids]
        try:
            async with session.post(
                daemon.records_url(), data=ndjson(records), headers={"Content-Type": NDJSON}
            ) as resp:
                if resp.status == 200:
                    acked.update(ids)
            async with session.post(daemon.flush_url()):
                pass
        except (aiohttp.ClientError, OSError):
            await asyncio.sleep(0.05)  # the daemon is dying

    try:
        async with aiohttp.ClientSession() as session:
            for seam in SEAMS:
                await _crash_at(daemon, seam, feed)
                data, meta = await asyncio.to_thread(_unreferenced, home)
                left[seam] = len(data)
                left[f"{seam} (metadata)"] = len(meta)
            assert left["during-compaction-rewrite"] >= 1  # the output it wrote
            await _maintained_and_stopped(daemon, feed)
    finally:
        daemon.cleanup()
    # The daemon's own sweep keeps files younger than the commit window its [timeouts]
    # allow another replica (minutes), whatever orphan_older_than says; with the daemon
    # stopped, nothing is in flight, so the same sweep with a 1 s age must find every
    # file the crashes left.
    table, catalog = home.load_table()
    # Every process that ran on the spool is one of its recorded incarnations.
    incarnations = frozenset((home.spool_dir / "incarnations").read_text().split())
    try:
        swept = await asyncio.to_thread(
            remove_orphans,
            table,
            owner=FileOwner("", incarnations),
            is_spooled=lambda _: False,
        )
    finally:
        catalog.engine.dispose()
    data, meta = await asyncio.to_thread(_unreferenced, home)
    assert not data, (sorted(data), swept)
    rows = await asyncio.to_thread(_assert_exactly_once, home, acked, sent)
    print(
        f"{rows} rows, {len(acked)} acked; unreferenced files after each crash {left}; after "
        f"the sweep: {len(data)} data files, {len(meta)} manifests/lists (not the daemon's "
        "to sweep: Spark's remove_orphan_files)"
    )


async def test_kill_9_in_compaction_and_manifest_merge_from_kafka(
    broker: Broker, tmp_path: Path
) -> None:
    topic = unique_name("maintenance-crashes")
    await create_topic(broker.bootstrap, topic, PARTITIONS)
    home = DaemonDir(tmp_path / "d")
    home.write_config(
        batch_timeout="200ms",
        extra=EXTRA
        + f"""
[[kafka]]
bootstrap_servers = "{broker.bootstrap}"
group_id = "g-{topic}"
topics = ["{topic}"]
table = "{TABLE}"
offset_commit_interval = "1s"
session_timeout = "2s"
""",
    )
    daemon = Daemon(home)
    produced = 0
    total = 0

    async def feed() -> None:
        nonlocal produced
        if total and produced >= total:
            await asyncio.sleep(0.2)  # all produced: wait for the daemon to commit them
            return
        records = [{"id": i, "v": f"r{i}"} for i in range(produced, produced + 50)]
        await produce(broker.bootstrap, topic, records, partitions=PARTITIONS)
        produced += len(records)
        await asyncio.sleep(0.1)

    async def all_committed() -> bool:
        rows, _ = await asyncio.to_thread(home.read_rows)
        return len(rows) >= produced

    try:
        # The HTTP test has the rewrite's orphans; here the Kafka offsets in the table's
        # properties across a crash right after a replace commit, and in a merge.
        for seam in ("after-compaction-commit", "during-manifest-merge"):
            await _crash_at(daemon, seam, feed)
        total = produced + 200
        await _maintained_and_stopped(daemon, feed, all_committed)
    finally:
        daemon.cleanup()
    everything = set(range(produced))
    rows = await asyncio.to_thread(_assert_exactly_once, home, everything, everything)
    data, meta = await asyncio.to_thread(_unreferenced, home)
    assert not data, sorted(data)
    print(f"{rows} rows of {produced} produced; {len(meta)} unreferenced manifests/lists")
