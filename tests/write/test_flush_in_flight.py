"""Records a running flush is committing are no reason for another flush: the next one
starts when the oldest record nobody is committing yet is ``batch_timeout`` old (in-
process daemon, its PostgreSQL catalog behind a loopback proxy that holds the commit)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
from support.proxy import TcpProxy
from support.service_helpers import metric, table_rows

from icespool.config import Config
from icespool.lifecycle.service import Icespool

MakeConfig = Callable[..., Config]
TABLE = "t.events"
TIMEOUT = 4.0  # batch_timeout; the age trigger ticks every second


def _batch(ids: range) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(list(ids), pa.int64())})


def _config(make_config: MakeConfig, uri: str, tmp_path: Path, catalog_request: str) -> Config:
    return make_config(
        catalog={"name": "lake", "type": "sql", "uri": uri, "warehouse": tmp_path.as_uri()},
        tables=[{"name": TABLE, "create": True, "schema": [{"name": "id", "type": "long"}]}],
        defaults={"batch_timeout": f"{TIMEOUT:g}s"},
        timeouts={"catalog_request": catalog_request},
    )


async def _until(condition: Callable[[], bool], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within}s: {what}")
        await asyncio.sleep(0.02)


async def test_a_commit_in_flight_does_not_start_another_for_its_own_records(
    make_config: MakeConfig, pg_proxy: tuple[TcpProxy, str], tmp_path: Path
) -> None:
    proxy, uri = pg_proxy
    config = _config(make_config, uri, tmp_path, catalog_request="20s")
    async with Icespool(config) as service:
        writer = service.tables.writer(TABLE)
        await writer.append(_batch(range(100)))
        first = time.monotonic()
        await asyncio.sleep(TIMEOUT - 0.5)
        proxy.mode = "silent"  # the age flush of the first batch hangs at the catalog
        await _until(lambda: writer.flush_busy, 2.0, "the first batch's age flush started")
        await asyncio.sleep(0.1)
        await writer.append(_batch(range(100, 200)))
        second = time.monotonic()
        # Two ticks of the age trigger while the first flush is held: each saw its
        # records older than batch_timeout, still pending.
        await asyncio.sleep(2.2)
        assert writer.pending_records == 200
        proxy.mode = "forward"
        await _until(lambda: writer.committed_records == 100, 15.0, "the first commit")
        assert writer.last_commit is not None and writer.last_commit.records == 100
        assert writer.last_commit.reason == "age"
        assert time.monotonic() - first < TIMEOUT + 4.5
        # The second batch is not yet batch_timeout old: it waits for its own turn.
        await asyncio.sleep(0.5)
        assert time.monotonic() < second + TIMEOUT - 0.3, "too slow to tell"
        assert writer.pending_records == 100
        assert metric(service, "icespool_commits_total", table=TABLE, reason="age") == 1
        await _until(lambda: writer.committed_records == 200, TIMEOUT + 5, "the second commit")
        assert writer.last_commit_at - second >= TIMEOUT
        assert metric(service, "icespool_commits_total", table=TABLE, reason="age") == 2
        rows = await asyncio.to_thread(table_rows, service, TABLE)
        assert sorted(r["id"] for r in rows) == list(range(200))


async def test_records_a_failed_flush_had_taken_are_committed_once_the_catalog_is_back(
    make_config: MakeConfig, pg_proxy: tuple[TcpProxy, str], tmp_path: Path
) -> None:
    """The flush holding the first batch fails (the catalog stops answering, then
    refuses): what it had taken is a reason for a flush again, so once the catalog
    answers, the age trigger commits it (and what came meanwhile) exactly once."""
    proxy, uri = pg_proxy
    config = _config(make_config, uri, tmp_path, catalog_request="2s")
    async with Icespool(config) as service:
        writer = service.tables.writer(TABLE)
        await writer.append(_batch(range(100)))
        proxy.mode = "silent"  # the age flush of the first batch hangs, then fails
        await _until(lambda: writer.flush_busy, TIMEOUT + 2, "the first batch's age flush")
        await writer.append(_batch(range(100, 200)))
        await _until(lambda: writer.degraded is not None, 15.0, "the flush failed")
        assert writer.committed_records == 0
        proxy.mode = "refuse"
        await asyncio.sleep(TIMEOUT)  # retries fail fast; nothing is dropped
        assert writer.pending_records == 200 and writer.committed_records == 0
        proxy.mode = "forward"
        await _until(lambda: writer.committed_records == 200, 3 * TIMEOUT + 10, "every record")
        assert writer.degraded is None and writer.pending_records == 0
        assert metric(service, "icespool_commit_failures_total", table=TABLE) >= 1
        rows = await asyncio.to_thread(table_rows, service, TABLE)
        assert sorted(r["id"] for r in rows) == list(range(200))
