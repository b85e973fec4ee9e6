"""A hung or refusing catalog never wedges the daemon: real `icespool run` children, a
real PostgreSQL catalog (127.0.0.1:5432, a fresh database per test) behind a loopback
TCP proxy (the ``pg_proxy`` fixture) that refuses, goes silent or forwards on demand.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from support.daemon_harness import Daemon, DaemonDir
from support.proxy import TcpProxy

from icespool.app import AFTER_GRACE_SECONDS, EXIT_STUCK

_PG = ("127.0.0.1", 5432)
_BATCH = 200


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as client:
        yield client


def _daemon(tmp_path: Path, uri: str, batch_timeout: str = "60s", **timeouts: str) -> Daemon:
    """A daemon on the catalog ``uri`` with these ``[timeouts]``."""
    home = DaemonDir(tmp_path / "d", catalog_uri=uri)
    lines = "\n".join(f'{key} = "{value}"' for key, value in timeouts.items())
    home.write_config(batch_timeout=batch_timeout, extra=f"\n[timeouts]\n{lines}\n")
    return Daemon(home)


async def _ingest(daemon: Daemon, session: aiohttp.ClientSession, first: int) -> list[int]:
    ids = list(range(first, first + _BATCH))
    await daemon.ingest(session, [{"id": i, "v": f"r{i}"} for i in ids])
    return ids


async def _post(session: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, str], str]:
    async with session.post(url) as resp:
        return resp.status, dict(resp.headers), await resp.text()


async def _readyz(daemon: Daemon, session: aiohttp.ClientSession) -> tuple[int, str]:
    async with session.get(f"{daemon.url}/readyz") as resp:
        return resp.status, await resp.text()


async def _assert_reported_ready(
    daemon: Daemon, session: aiohttp.ClientSession, ready: bool
) -> None:
    async with session.get(f"{daemon.url}/v1/status") as resp:
        not_ready = (await resp.json())["not_ready"]
    if ready:
        assert not_ready is None, not_ready
    else:
        assert "catalog 'lake' unreachable" in not_ready, not_ready
    assert f"\nicespool_ready {float(ready)}" in await daemon.metrics(session)


async def _stop_and_check(daemon: Daemon, acked: list[int]) -> None:
    """SIGTERM with the catalog up: exit 0, every acked id committed exactly once."""
    daemon.signal(signal.SIGTERM)
    assert await daemon.wait_exit(within=30) == 0, daemon.tail()
    rows, _ = daemon.home.read_rows()
    ids = sorted(row["id"] for row in rows)
    assert len(ids) == len(set(ids)), "an id was committed twice"
    assert ids == sorted(acked), f"{len(acked)} acked, {len(ids)} committed"
    assert daemon.home.spool_files() == []
    assert daemon.home.quarantined() == []


async def test_silent_catalog_under_load_then_sigterm_exits_within_grace(
    pg_proxy: tuple[TcpProxy, str], tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    """The catalog accepts but never answers while records keep coming; SIGTERM ends the
    process within grace + AFTER_GRACE_SECONDS, naming the stuck call, exit 75 (the
    catalog timeout is set far above the grace, so a thread really is stuck); the
    next start with the catalog back commits every acked id exactly once."""
    proxy, uri = pg_proxy
    grace = 3.0
    daemon = _daemon(
        tmp_path, uri, batch_timeout="1s", catalog_request="120s", shutdown_grace=f"{grace:g}s"
    )
    try:
        daemon.start()
        await daemon.wait_ready()
        acked: list[int] = []
        for _ in range(5):  # steady load, some of it committed by the age trigger
            acked += await _ingest(daemon, session, len(acked))
            await asyncio.sleep(0.3)
        proxy.mode = "silent"
        # Acks go on while the catalog hangs (the spool holds them); the age trigger's
        # flush is now stuck in the catalog.
        for _ in range(8):
            acked += await _ingest(daemon, session, len(acked))
            await asyncio.sleep(0.3)
        started = time.monotonic()
        daemon.signal(signal.SIGTERM)
        code = await daemon.wait_exit(within=grace + AFTER_GRACE_SECONDS + 10)
        took = time.monotonic() - started
        log = daemon.log()
        assert code == EXIT_STUCK, daemon.tail()
        assert took < grace + AFTER_GRACE_SECONDS + 2.0, f"took {took:.1f}s\n{daemon.tail()}"
        assert "still running after" in log and "FlushJob." in log, daemon.tail()
        assert daemon.home.spool_files(), "the uncommitted records must stay in the spool"

        proxy.mode = "forward"
        daemon.start()
        await daemon.wait_ready()  # recovery committed the spool before ready
        await _stop_and_check(daemon, acked)
    finally:
        daemon.cleanup()


async def test_unreachable_catalog_flush_answers_503_and_acks_go_on(
    pg_proxy: tuple[TcpProxy, str], tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    """A catalog silent at start-up is retried until it answers (then ready by itself).
    Silent, refused, then resetting catalog while serving: flush answers 503 + Retry-After naming
    the catalog within the catalog timeout (+ margin), ingest keeps answering 200,
    /readyz says the catalog is unreachable; with the catalog back everything commits
    exactly once."""
    proxy, uri = pg_proxy
    daemon = _daemon(tmp_path, uri, catalog_connect="2s", catalog_request="2s")
    proxy.mode = "silent"
    try:
        daemon.start()
        await daemon.wait_log("retrying in", within=30)
        proxy.mode = "forward"
        await daemon.wait_ready()
        acked = await _ingest(daemon, session, 0)
        assert (await daemon.flush(session))["records"] == _BATCH

        for mode, limit in (("silent", 2.0 + 1.0 + 2.0), ("refuse", 2.0), ("reset", 2.0)):
            proxy.mode = mode  # type: ignore[assignment]
            acked += await _ingest(daemon, session, len(acked))
            started = time.monotonic()
            status, headers, text = await _post(session, daemon.flush_url())
            took = time.monotonic() - started
            assert status == 503, f"{mode}: {status} {text}\n{daemon.tail()}"
            assert int(headers["Retry-After"]) >= 1
            assert "catalog" in text, text
            assert took < limit, f"{mode}: 503 after {took:.1f}s"
            acked += await _ingest(daemon, session, len(acked))

        deadline = time.monotonic() + 15
        while True:
            status, text = await _readyz(daemon, session)
            if status == 503 and "unreachable" in text:
                break
            assert time.monotonic() < deadline, f"/readyz still says {status} {text}"
            await asyncio.sleep(0.2)
        assert "catalog 'lake'" in text, text
        # /v1/status and the icespool_ready gauge tell the same as /readyz.
        await _assert_reported_ready(daemon, session, False)

        proxy.mode = "forward"
        deadline = time.monotonic() + 15
        while (await _readyz(daemon, session))[0] != 200:
            assert time.monotonic() < deadline, "/readyz did not recover"
            await asyncio.sleep(0.2)
        await _assert_reported_ready(daemon, session, True)
        await daemon.flush(session)  # 200: the backlog is committed now
        await _stop_and_check(daemon, acked)
    finally:
        daemon.cleanup()


async def test_silent_catalog_at_start_sigterm_still_ends_it_within_grace(
    pg_proxy: tuple[TcpProxy, str], tmp_path: Path
) -> None:
    """A catalog that never answers at start-up: the daemon retries with backoff (never
    ready meanwhile) and SIGTERM ends it within grace, exit 0."""
    proxy, uri = pg_proxy
    grace = 2.0
    daemon = _daemon(
        tmp_path, uri, catalog_connect="1s", catalog_request="1s", shutdown_grace=f"{grace:g}s"
    )
    proxy.mode = "silent"
    try:
        daemon.start()
        await daemon.wait_log("retrying in", within=30, count=2)
        assert "icespool ready" not in daemon.log()
        started = time.monotonic()
        daemon.signal(signal.SIGTERM)
        code = await daemon.wait_exit(within=grace + AFTER_GRACE_SECONDS + 10)
        took = time.monotonic() - started
        assert code == 0, daemon.tail()
        assert took < grace + AFTER_GRACE_SECONDS, f"took {took:.1f}s\n{daemon.tail()}"
    finally:
        daemon.cleanup()


@pytest.mark.parametrize("back_within_grace", [True, False], ids=["blip", "down"])
async def test_catalog_down_during_sigterm_is_retried_within_the_grace(
    pg_proxy: tuple[TcpProxy, str],
    tmp_path: Path,
    session: aiohttp.ClientSession,
    back_within_grace: bool,
) -> None:
    """The catalog resets every connection as SIGTERM arrives. Back within the grace:
    the shutdown commit is retried, exit 0 with the spool empty and every acked id
    committed once (before: one attempt, then "stopped cleanly" with every record still
    spooled). Down for the whole grace: exit 0 within it, and the last line says the
    spool still holds segments (an operator draining a replica reads it before deleting
    the volume); the next start commits them once."""
    proxy, uri = pg_proxy
    grace = 10.0 if back_within_grace else 2.0
    daemon = _daemon(tmp_path, uri, batch_timeout="1h", shutdown_grace=f"{grace:g}s")
    try:
        daemon.start()
        await daemon.wait_ready()
        acked = await _ingest(daemon, session, 0)
        proxy.mode = "reset"
        started = time.monotonic()
        daemon.signal(signal.SIGTERM)
        if back_within_grace:
            await daemon.wait_log("shutdown commit failed", within=5)
            proxy.mode = "forward"
        assert await daemon.wait_exit(within=grace + 10) == 0, daemon.tail()
        assert time.monotonic() - started < grace + AFTER_GRACE_SECONDS, daemon.tail()
        log = daemon.log()
        if back_within_grace:
            assert "stopped cleanly" in log, daemon.tail()
            assert daemon.home.spool_files() == []
            rows, _ = daemon.home.read_rows()
            assert sorted(row["id"] for row in rows) == acked
            return
        assert "stopped with 1 segments still in the spool" in log, daemon.tail()
        assert "stopped cleanly" not in log, daemon.tail()
        proxy.mode = "forward"
        daemon.start()
        await daemon.wait_ready()
        await _stop_and_check(daemon, acked)
    finally:
        daemon.cleanup()
