"""Acks do not wait for a flush (issue #17): a real daemon, a 2M-row flush running,
small HTTP requests meanwhile answered without waiting for its encode or commit.

The flush's encode and commit run in threads of their own at a lower priority
(icespool.write.encode_pool) and the segment's checksums are verified off the event loop
(spool.read). A request that waited for the encode, the commit or a stalled loop
would take most of the flush (1-3 s here); the bound is far below that and far above
what this machine's noise produced (p99 37-97 ms at load average 6-10 on 2 cores).
"""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pytest
from support.daemon_harness import NDJSON, Daemon, DaemonDir, ndjson

_FLUSH_ROWS = 2_000_000
_BODY_ROWS = 250_000
_SMALL_ROWS = 20
_ARROW = {"Content-Type": "application/vnd.apache.arrow.stream"}
# p99 of the small requests answered while the flush ran (p50 is 2-6 ms).
_P99_BOUND_MS = 250.0


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[DaemonDir, Daemon]]:
    home = DaemonDir(tmp_path / "d")
    home.write_config(batch_timeout="600s", max_batch_records=10_000_000)
    made = Daemon(home)
    yield home, made
    made.cleanup()


def _arrow_body(first: int, rows: int) -> bytes:
    ids = pa.array(range(first, first + rows), pa.int64())
    values = pa.array([f"value-{i:012d}-abcdefghijklmnop" for i in range(first, first + rows)])
    batch = pa.record_batch([ids, values], names=["id", "v"])
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue())


async def test_acks_are_not_delayed_by_a_running_flush(
    daemon: tuple[DaemonDir, Daemon],
) -> None:
    home, proc = daemon
    proc.start()
    await proc.wait_ready()
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for first in range(0, _FLUSH_ROWS, _BODY_ROWS):
            body = _arrow_body(first, _BODY_ROWS)
            async with session.post(
                proc.records_url(), data=io.BytesIO(body), headers=_ARROW
            ) as resp:
                assert resp.status == 200, await resp.text()
        flush = asyncio.create_task(proc.flush(session))
        during: list[float] = []
        after = 0
        next_id = _FLUSH_ROWS
        while not flush.done() or len(during) + after < 200:
            records = [{"id": i, "v": "small"} for i in range(next_id, next_id + _SMALL_ROWS)]
            next_id += _SMALL_ROWS
            running = not flush.done()
            began = time.perf_counter()
            async with session.post(
                proc.records_url(), data=ndjson(records), headers={"Content-Type": NDJSON}
            ) as resp:
                assert resp.status == 200, await resp.text()
            latency = time.perf_counter() - began
            if running and not flush.done():
                during.append(latency)
            else:
                after += 1
        result = await flush
        assert result["records"] >= _FLUSH_ROWS
        await proc.flush(session)
    assert len(during) >= 50, f"only {len(during)} requests overlapped the flush"
    during.sort()
    p99 = during[int(0.99 * len(during))] * 1e3
    assert p99 < _P99_BOUND_MS, (
        f"p99 {p99:.1f} ms of {len(during)} acks during a {_FLUSH_ROWS:,}-row flush "
        f"(p50 {during[len(during) // 2] * 1e3:.1f} ms, max {during[-1] * 1e3:.1f} ms)"
    )
    table, catalog = home.load_table()
    try:
        ids = table.scan(selected_fields=("id",)).to_arrow().column("id")
    finally:
        catalog.engine.dispose()
    assert len(ids) == next_id
    assert len(ids.unique()) == next_id  # every id once
    assert pc.min(ids).as_py() == 0 and pc.max(ids).as_py() == next_id - 1
    print(
        f"{len(during)} acks during the flush: p50 {during[len(during) // 2] * 1e3:.1f} ms, "
        f"p99 {p99:.1f} ms, max {during[-1] * 1e3:.1f} ms"
    )
