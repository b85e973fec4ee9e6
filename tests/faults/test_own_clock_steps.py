"""A daemon whose own clock was hours off, restarted with the right one.

A real `icespool run` child commits under libfaketime (its wall clock hours ahead or
behind, its monotonic clock true) with maintenance every second, then runs again
without it on the same spool, catalog and table. Every acked id is readable exactly
once with a full scan, and the table's metadata stays loadable by the other Iceberg
implementations: Java (Spark, Trino, Flink), Go and Rust refuse metadata whose
snapshot log or metadata log runs backwards by more than a minute, or whose
``last-updated-ms`` is more than a minute before its last snapshot log entry.
"""

from __future__ import annotations

import itertools
import json
import signal
from collections import Counter
from pathlib import Path

import aiohttp
import pytest
from support.daemon_harness import Daemon, DaemonDir

FAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
ONE_MINUTE_MS = 60_000


def _java_rejects(metadata: dict[str, object]) -> list[str]:
    """What Iceberg's Java `TableMetadata` constructor refuses in ``metadata`` (the same
    checks as iceberg-go's and iceberg-rust's)."""
    problems = []
    log = metadata.get("snapshot-log") or []
    assert isinstance(log, list)
    for before, after in itertools.pairwise(log):
        if after["timestamp-ms"] - before["timestamp-ms"] < -ONE_MINUTE_MS:
            problems.append(f"snapshot log unsorted: {before} then {after}")
    last_updated = metadata["last-updated-ms"]
    assert isinstance(last_updated, int)
    if log and last_updated - log[-1]["timestamp-ms"] < -ONE_MINUTE_MS:
        problems.append(f"last-updated-ms {last_updated} before the last snapshot log entry")
    files = metadata.get("metadata-log") or []
    assert isinstance(files, list)
    for before, after in itertools.pairwise(files):
        if after["timestamp-ms"] - before["timestamp-ms"] < -ONE_MINUTE_MS:
            problems.append(f"metadata log unsorted: {before} then {after}")
    if files and last_updated - files[-1]["timestamp-ms"] < -ONE_MINUTE_MS:
        problems.append(f"last-updated-ms {last_updated} before the last metadata log entry")
    return problems


async def _round(daemon: Daemon, ids: range) -> None:
    await daemon.wait_ready()
    async with aiohttp.ClientSession() as session:
        for start in range(ids.start, ids.stop, 1000):
            chunk = range(start, min(start + 1000, ids.stop))
            await daemon.ingest(session, [{"id": i, "v": f"r{i}"} for i in chunk])
            await daemon.flush(session)
    await daemon.wait_log("; orphans: listed", within=60)


@pytest.mark.parametrize("offset", ["+3h", "-3h"], ids=["ahead", "behind"])
async def test_a_daemon_restarted_after_its_clock_was_off(
    tmp_path: Path, postgres_uri: str, offset: str
) -> None:
    if not FAKETIME.exists():
        raise AssertionError(f"{FAKETIME} is missing: `make test-deps` installs faketime")
    home = DaemonDir(tmp_path / "d", catalog_uri=postgres_uri)
    home.write_config(
        batch_timeout="1h",
        extra='\n[maintenance]\ninterval = "1s"\norphan_older_than = "1s"\n',
    )
    daemon = Daemon(home)
    skewed = {"LD_PRELOAD": str(FAKETIME), "FAKETIME": offset, "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
    try:
        daemon.start()  # the right clock first: the table has history by it
        await _round(daemon, range(3000))
        daemon.signal(signal.SIGTERM)
        assert await daemon.wait_exit(60) == 0, daemon.tail()
        daemon.start(env=skewed)
        await _round(daemon, range(3000, 6000))
        async with aiohttp.ClientSession() as session:
            await daemon.ingest(session, [{"id": i, "v": "x"} for i in range(6000, 6500)])
        daemon.kill()  # leaves its lease, its claim and a segment behind
        daemon.start()
        await _round(daemon, range(6500, 9000))
        daemon.signal(signal.SIGTERM)
        assert await daemon.wait_exit(60) == 0, daemon.tail()
    finally:
        daemon.cleanup()
    rows, table = home.read_rows()  # a full scan: fails if a data file is missing
    ids = Counter(int(r["id"]) for r in rows)
    assert sorted(ids) == list(range(9000)) and max(ids.values()) == 1
    metadata = json.loads(Path(table.metadata_location.removeprefix("file://")).read_text())
    assert _java_rejects(metadata) == []
