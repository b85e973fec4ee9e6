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
from pathlib import Path

from pyiceberg.catalog.sql import SqlCatalog

from daemon.catalog_health import CatalogHealth

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
