"""The catalog health check stops when asked, whatever moment the request lands on.

Python 3.11's ``asyncio.wait_for`` swallows a cancellation that arrives in the same
loop step as its inner future's result (it returns the result instead). The health
task then went on probing forever, so `Icespool.stop` never returned: `icespool
replay` hung about once in six runs, and `icespool run` spent its whole shutdown grace
waiting and skipped closing the spool. A probe that answers at once makes the race
frequent; a few hundred start/stop rounds hit it reliably.
"""

from __future__ import annotations

import asyncio
import gc
import sqlite3
from pathlib import Path

from pyiceberg.catalog.sql import SqlCatalog

from icespool.iceberg._health import CatalogHealth

_ROUNDS = 200


async def test_stop_ends_the_probe_loop_in_every_round(tmp_path: Path) -> None:
    catalog = SqlCatalog(
        "lake", uri=f"sqlite:///{tmp_path / 'c.db'}", warehouse=(tmp_path / "w").as_uri()
    )
    catalog.create_namespace("t")
    try:
        for round_ in range(_ROUNDS):
            health = CatalogHealth(catalog, "lake", timeout=5.0, interval=0.0)
            health.start()
            await asyncio.sleep(0.001 * (round_ % 5))
            # Not asyncio.timeout: stop() suppresses the CancelledError it would send.
            stopping = asyncio.ensure_future(health.stop())
            done, _ = await asyncio.wait({stopping}, timeout=2.0)
            assert done, f"stop() did not return in round {round_}"
            assert health.problem is None
    finally:
        catalog.engine.dispose()


async def test_a_probe_that_fails_after_its_timeout_is_not_logged_as_never_retrieved(
    tmp_path: Path,
) -> None:
    """A probe outliving its timeout (catalog locked) and failing later is not left for
    asyncio to log as "Task exception was never retrieved" with a traceback."""
    db = tmp_path / "c.db"
    catalog = SqlCatalog("lake", uri=f"sqlite:///{db}?timeout=0.3", warehouse=tmp_path.as_uri())
    unhandled: list[dict[str, object]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: unhandled.append(ctx))
    lock = sqlite3.connect(db, isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")  # list_namespaces waits 0.3 s, then fails
    health = CatalogHealth(catalog, "lake", timeout=0.1, interval=0.6)
    try:
        health.start()
        await asyncio.sleep(1.5)  # several probes time out, then fail in their threads
        assert health.problem is not None and "did not answer" in health.problem
    finally:
        await health.stop()
        lock.execute("ROLLBACK")
        lock.close()
        catalog.engine.dispose()
    gc.collect()
    await asyncio.sleep(0)
    assert unhandled == []
