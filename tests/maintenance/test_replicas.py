"""Maintenance across real daemon processes: two replicas sharing one PostgreSQL catalog
and warehouse never maintain a table at once (a holder killed -9 is replaced once its
lease lapses, a stopped one at once), and kill -9 in the middle of an expiry loses and
duplicates nothing acked."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pyiceberg.catalog import load_catalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType
from support.daemon_harness import (
    CATALOG_NAME,
    NDJSON,
    TABLE,
    Daemon,
    DaemonDir,
    crash_seam_env,
    ndjson,
)

TTL = 6.0
MAINTENANCE = f"""\
interval = "1s"
lease_ttl = "{TTL:g}s"
min_snapshots = 1
max_snapshots = 2
"""
_RUN = re.compile(
    r"maintenance of (?P<table>\S+) by (?P<owner>\S+): (?P<outcome>\w+) in .*?"
    r"held=(?P<start>\d+\.\d+)\.\.(?P<end>\d+\.\d+)"
)


def _runs(logs: list[str], table: str) -> list[tuple[str, float, float]]:
    """(owner, held from, held until) of every run that held the lease, from daemon logs."""
    found = []
    for log in logs:
        for match in _RUN.finditer(log):
            if match["table"] == table:
                found.append((match["owner"], float(match["start"]), float(match["end"])))
    return sorted(found, key=lambda run: run[1])


def _assert_one_maintainer_at_a_time(runs: list[tuple[str, float, float]]) -> None:
    for (owner_a, start_a, end_a), (owner_b, start_b, end_b) in itertools.combinations(runs, 2):
        if owner_a != owner_b:
            assert end_a <= start_b or end_b <= start_a, (owner_a, owner_b, runs)


def _write_config(home: DaemonDir, table: str) -> None:
    home.root.mkdir(parents=True, exist_ok=True)
    home.warehouse.mkdir(parents=True, exist_ok=True)
    home.config_path.write_text(f"""\
[catalog]
name = "{CATALOG_NAME}"
type = "sql"
uri = {json.dumps(home.catalog_properties["uri"])}
warehouse = {json.dumps(home.warehouse.as_uri())}

[spool]
dir = {json.dumps(str(home.spool_dir))}

[http]
listen = "127.0.0.1:0"

[encode]
workers = 2

[timeouts]
shutdown_grace = "10s"

[maintenance]
{MAINTENANCE}
[[tables]]
name = "{table}"
create = true
schema = [
  {{ name = "id", type = "long", required = true }},
  {{ name = "v", type = "string" }},
]
""")


async def _feed(
    session: aiohttp.ClientSession, daemon: Daemon, table: str, ids: list[int]
) -> list[int]:
    """POST ``ids`` and flush; returns the ids acked (none if the daemon did not answer 200)."""
    records = [{"id": i, "v": f"r{i}"} for i in ids]
    try:
        async with session.post(
            daemon.records_url(table), data=ndjson(records), headers={"Content-Type": NDJSON}
        ) as resp:
            if resp.status != 200:
                return []
        async with session.post(daemon.flush_url(table)):
            pass
    except (aiohttp.ClientError, OSError):
        return []
    return ids


async def _skipped(session: aiohttp.ClientSession, daemon: Daemon, table: str) -> float:
    async with session.get(f"{daemon.url}/metrics") as resp:
        text = await resp.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if (
                sample.name == "icespool_maintenance_runs_total"
                and labels.get("table") == table
                and labels.get("outcome") == "skipped"
            ):
                return float(sample.value)
    return 0.0


def _ids(home: DaemonDir, table: str) -> Counter[int]:
    catalog = load_catalog(CATALOG_NAME, **home.catalog_properties)
    try:
        loaded = catalog.load_table(table)
        return Counter(loaded.scan().to_arrow().column("id").to_pylist())
    finally:
        engine = getattr(catalog, "engine", None)
        if engine is not None:
            engine.dispose()


@pytest.fixture
def pg_table(tmp_path: Path, postgres_uri: str) -> Iterator[tuple[str, str]]:
    """(catalog URI, table): a table in a fresh PostgreSQL database, dropped afterwards."""
    namespace = f"maint_{uuid.uuid4().hex[:12]}"
    name = f"{namespace}.events"
    props = {"type": "sql", "uri": postgres_uri, "warehouse": (tmp_path / "warehouse").as_uri()}
    catalog = load_catalog(CATALOG_NAME, **props)
    catalog.create_namespace(namespace)
    schema = Schema(
        NestedField(1, "id", LongType(), required=True), NestedField(2, "v", StringType())
    )
    (tmp_path / "warehouse").mkdir()
    catalog.create_table(name, schema)
    try:
        yield postgres_uri, name
    finally:
        catalog.drop_table(name)
        catalog.drop_namespace(namespace)
        catalog.engine.dispose()  # type: ignore[attr-defined]


async def test_two_replicas_never_maintain_a_table_at_once(
    tmp_path: Path, pg_table: tuple[str, str]
) -> None:
    uri, table = pg_table
    homes = [
        DaemonDir(tmp_path / name, catalog_uri=uri, shared_warehouse=tmp_path / "warehouse")
        for name in ("a", "b")
    ]
    for home in homes:
        _write_config(home, table)
    daemons = [Daemon(home) for home in homes]
    sent: list[int] = []
    acked: list[int] = []
    counter = itertools.count()

    async def feed(session: aiohttp.ClientSession, targets: list[Daemon], seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for daemon in targets:
                ids = [next(counter) for _ in range(10)]
                sent.extend(ids)
                acked.extend(await _feed(session, daemon, table, ids))
            await asyncio.sleep(0.1)

    def logs() -> list[str]:
        return [d.all_logs() for d in daemons]

    try:
        for daemon in daemons:
            daemon.start()
        await asyncio.gather(*(d.wait_ready() for d in daemons))
        async with aiohttp.ClientSession() as session:
            # Both replicas ingest and both try to maintain: one does, the other skips.
            await feed(session, daemons, 5.0)
            runs = _runs(logs(), table)
            maintaining = [i for i, d in enumerate(daemons) if _runs([d.log()], table)]
            assert len(maintaining) == 1, runs
            holder, other = daemons[maintaining[0]], daemons[1 - maintaining[0]]
            assert len(runs) >= 2
            assert await _skipped(session, other, table) >= 2

            # kill -9 the holder: the other takes over once the lease lapsed.
            last_held = max(end for _, _, end in runs)
            holder.kill()
            killed_at = time.time()
            deadline = time.monotonic() + TTL + 15
            while not _runs([other.log()], table):
                assert time.monotonic() < deadline, other.tail()
                await feed(session, [other], 0.5)
            _, took_over, _ = _runs([other.log()], table)[0]
            assert took_over >= last_held
            assert took_over - killed_at < TTL + 5, (took_over - killed_at, other.tail())
            print(f"takeover after kill -9: {took_over - killed_at:.1f}s (lease TTL {TTL:g}s)")

            # The killed replica restarts (same spool: same owner id) and skips...
            holder.start()
            await holder.wait_ready()
            await feed(session, daemons, 3.0)
            assert not _runs([holder.log()], table), holder.tail()
            assert await _skipped(session, holder, table) >= 1
            # ... until the other stops cleanly and releases the lease: taken at once,
            # not after its TTL.
            other.signal(signal.SIGTERM)
            assert await other.wait_exit(30) == 0
            stopped_at = time.time()
            deadline = time.monotonic() + TTL + 15
            while not _runs([holder.log()], table):
                assert time.monotonic() < deadline, holder.tail()
                await feed(session, [holder], 0.3)
            _, took_over, _ = _runs([holder.log()], table)[0]
            assert took_over - stopped_at < TTL - 2, took_over - stopped_at
            print(f"takeover after a clean stop: {took_over - stopped_at:.1f}s")
            holder.signal(signal.SIGTERM)
            assert await holder.wait_exit(30) == 0

        runs = _runs(logs(), table)
        _assert_one_maintainer_at_a_time(runs)
        print(
            f"{len(runs)} maintenance runs by {len({r[0] for r in runs})} owners, none overlapping"
        )
        ids = await asyncio.to_thread(_ids, homes[0], table)
        assert set(ids.values()) == {1}, [i for i, n in ids.items() if n > 1]
        assert set(acked) <= set(ids) <= set(sent)
        assert len(acked) > 200
    finally:
        for daemon in daemons:
            daemon.cleanup()


async def test_kill_9_during_expiry_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    """The daemon is killed right after an expiry commit (nothing of its garbage
    deleted) and halfway through deleting it; every acked id is in the table once,
    and the table reads (no file a snapshot reaches was deleted)."""
    home = DaemonDir(tmp_path / "d")
    home.write_config(extra=f"\n[maintenance]\n{MAINTENANCE}")
    daemon = Daemon(home)
    sent: list[int] = []
    acked: list[int] = []
    counter = itertools.count()
    try:
        async with aiohttp.ClientSession() as session:
            for seam in ("after-expiry-commit", "during-expiry-delete"):
                daemon.start(env=crash_seam_env(seam))
                await daemon.wait_ready()
                deadline = time.monotonic() + 30
                while daemon.running:
                    assert time.monotonic() < deadline, daemon.tail()
                    ids = [next(counter) for _ in range(10)]
                    sent.extend(ids)
                    acked.extend(await _feed(session, daemon, TABLE, ids))
                assert await daemon.wait_exit(5) == -signal.SIGKILL
                assert f"crash seam: SIGKILL at {seam}" in daemon.log()
            daemon.start()
            await daemon.wait_ready()
            await daemon.wait_log("maintenance of t.events by", 20)
            for _ in range(5):
                ids = [next(counter) for _ in range(10)]
                sent.extend(ids)
                acked.extend(await _feed(session, daemon, TABLE, ids))
            await daemon.wait_log(": ok in", 20, count=2)
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait_exit(30) == 0
        ids = await asyncio.to_thread(_ids, home, TABLE)
        assert set(ids.values()) == {1}, [i for i, n in ids.items() if n > 1]
        assert set(acked) <= set(ids) <= set(sent)
        assert len(acked) >= 50
    finally:
        daemon.cleanup()
