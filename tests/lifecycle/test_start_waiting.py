"""A start that waits for the catalog is visible: real `icespool run` children on a real
PostgreSQL catalog behind a loopback TCP proxy (the ``pg_proxy`` fixture) that refuses
or stays silent from the first connection, then forwards.

The daemon listens before the catalog answers: /healthz 200, /readyz 503 naming the
catalog and its last error, /metrics (``icespool_ready 0``), /v1/status and
`icespool status` with the waiting state, and the record endpoints of a table whose
schema is not known yet (``infer = true``, nothing spooled) 503 + Retry-After accepting
nothing (tables of known schema ack meanwhile: test_start_waiting_acks.py). Clients
that retry through the outage have every record acked once the catalog is back, and
each is committed exactly once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from support.daemon_harness import NDJSON, Daemon, DaemonDir, daemon_command, ndjson
from support.proxy import Mode, TcpProxy

_BATCH = 50
_WAITING = "starting: waiting for the catalog 'lake' (unreachable for "


def _daemon(tmp_path: Path, uri: str) -> Daemon:
    home = DaemonDir(tmp_path / "d", catalog_uri=uri)
    home.write_config(
        batch_timeout="60s",
        extra='\n[timeouts]\ncatalog_connect = "1s"\ncatalog_request = "1s"\n',
        # Created from its first records: no schema is known while the catalog is down.
        table="create = true\ninfer = true",
    )
    return Daemon(home)


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with session.get(url) as resp:
        return resp.status, await resp.text()


async def _cli_status(url: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ICESPOOL")}
    proc = await asyncio.create_subprocess_exec(
        *daemon_command(),
        "status",
        "--url",
        url,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


class _RetryingClient:
    """Posts batches of ids in order, each again after a 503 (as its Retry-After says, cut
    to 0.2 s) until it is acked: what a well-behaved producer does through the outage."""

    def __init__(self, daemon: Daemon, session: aiohttp.ClientSession) -> None:
        self.daemon = daemon
        self.session = session
        self.acked: list[int] = []
        self.refused = 0
        self.refusals: set[str] = set()

    async def send(self, batches: int) -> None:
        for _ in range(batches):
            ids = list(range(len(self.acked), len(self.acked) + _BATCH))
            body = ndjson({"id": i, "v": f"v{i}"} for i in ids)
            while True:
                async with self.session.post(
                    self.daemon.records_url(), data=body, headers={"Content-Type": NDJSON}
                ) as resp:
                    text = await resp.text()
                    if resp.status == 200:
                        assert (await resp.json()) == {"accepted": _BATCH}, text
                        self.acked += ids
                        break
                    assert resp.status == 503, f"{resp.status} {text}\n{self.daemon.tail()}"
                    assert 1 <= int(resp.headers["Retry-After"]) <= 30, resp.headers
                    self.refused += 1
                    self.refusals.add((await resp.json())["error"].split(":", 1)[0])
                await asyncio.sleep(0.2)


@pytest.mark.parametrize(
    ("mode", "causes"),
    [
        (
            "refuse",
            (
                "cannot load catalog 'lake' (OperationalError: (psycopg2.OperationalError) "
                "Connection refused)",
            ),
        ),
        # Accepted, never answered: start-up's bound (connect + request timeout) ends an
        # attempt, or the driver's connect timeout does first.
        (
            "silent",
            (
                "catalog 'lake' did not answer within 2 s "
                "(timeouts.catalog_connect + timeouts.catalog_request)",
                "cannot load catalog 'lake' (OperationalError: (psycopg2.OperationalError) "
                "the catalog database did not connect within 1 s",
            ),
        ),
    ],
)
async def test_a_start_waiting_for_the_catalog_listens_says_why_and_then_serves(
    pg_proxy: tuple[TcpProxy, str], tmp_path: Path, mode: Mode, causes: tuple[str, ...]
) -> None:
    proxy, uri = pg_proxy
    proxy.mode = mode
    daemon = _daemon(tmp_path, uri)
    timeout = aiohttp.ClientTimeout(total=30)
    try:
        daemon.start()
        await daemon.wait_listening(within=60)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            assert await _get(session, f"{daemon.url}/healthz") == (200, '{"status":"ok"}')
            await daemon.wait_log("retrying in", within=30)

            status, text = await _get(session, f"{daemon.url}/readyz")
            assert status == 503, text
            error = (await _json(session, f"{daemon.url}/readyz", 503))["error"]
            assert error.startswith(f"not ready: {_WAITING}"), error
            assert any(c in error for c in causes) and "retrying in " in error, error

            state = await _json(session, f"{daemon.url}/v1/status", 200)
            assert state["ready"] is False
            assert state["not_ready"].startswith(_WAITING), state["not_ready"]
            waiting = state["waiting_for"]
            assert waiting["dependency"] == "the catalog 'lake'"
            assert waiting["error"].startswith(causes), waiting
            assert waiting["attempts"] >= 1 and waiting["waiting_seconds"] >= 0, waiting
            assert state["tables"] == {}

            metrics = await daemon.metrics(session)
            assert "\nicespool_ready 0.0\n" in metrics, metrics

            async with session.post(
                daemon.records_url(), data=ndjson([{"id": -1}]), headers={"Content-Type": NDJSON}
            ) as resp:
                assert resp.status == 503
                assert 1 <= int(resp.headers["Retry-After"]) <= 30, resp.headers
                refused = (await resp.json())["error"]
            assert refused.startswith(f"the daemon cannot take requests yet: {_WAITING}"), refused
            assert any(c in refused for c in causes), refused
            assert "nothing was accepted" in refused, refused
            async with session.post(daemon.flush_url()) as resp:
                assert resp.status == 503
                assert (await resp.json())["error"].startswith(
                    f"the daemon cannot take requests yet: {_WAITING}"
                )

            code, out, err = await _cli_status(daemon.url)
            assert (code, err) == (0, ""), out
            headline = f"icespool at {daemon.url}: NOT READY: {_WAITING}"
            assert out.startswith(headline), out
            assert any(c in out.splitlines()[0] for c in causes), out

            # Producers retry through the outage; the catalog comes back while they do.
            client = _RetryingClient(daemon, session)
            sending = asyncio.ensure_future(client.send(batches=12))
            deadline = time.monotonic() + 30
            while client.refused < 3:
                assert not sending.done(), sending
                assert time.monotonic() < deadline, "the client was never refused"
                await asyncio.sleep(0.05)
            assert client.acked == []
            proxy.mode = "forward"
            await daemon.wait_ready(within=90)  # the retry backoff is at most 30 s
            await asyncio.wait_for(sending, 60)
            assert len(client.acked) == 12 * _BATCH
            assert client.refusals == {"the daemon cannot take requests yet"}

            assert (await _get(session, f"{daemon.url}/readyz"))[0] == 200
            state = await _json(session, f"{daemon.url}/v1/status", 200)
            assert (state["ready"], state["not_ready"], state["waiting_for"]) == (True, None, None)
            assert "\nicespool_ready 1.0\n" in await daemon.metrics(session)
            log = daemon.log()
            assert "catalog 'lake' answered after " in log, daemon.tail()
            assert "Traceback" not in log, daemon.tail()

        daemon.signal(signal.SIGTERM)
        assert await daemon.wait_exit(within=40) == 0, daemon.tail()
        rows, _ = daemon.home.read_rows()
        counts = Counter(row["id"] for row in rows)
        assert sorted(counts) == client.acked, "an acked id is missing or one was never sent"
        assert set(counts.values()) == {1}, "an id was committed twice"
        assert all(row["v"] == f"v{row['id']}" for row in rows)
        assert daemon.home.spool_files() == []
        assert daemon.home.quarantined() == []
    finally:
        daemon.cleanup()


async def test_sigterm_while_waiting_for_the_catalog_stops_the_listener_too(
    pg_proxy: tuple[TcpProxy, str], tmp_path: Path
) -> None:
    """SIGTERM before the catalog ever answered: exit 0 promptly, the port closed."""
    proxy, uri = pg_proxy
    proxy.mode = "refuse"
    daemon = _daemon(tmp_path, uri)
    try:
        daemon.start()
        port = await daemon.wait_listening(within=60)
        await daemon.wait_log("retrying in", within=30)
        started = time.monotonic()
        daemon.signal(signal.SIGTERM)
        assert await daemon.wait_exit(within=20) == 0, daemon.tail()
        assert time.monotonic() - started < 10, daemon.tail()
        assert "icespool ready" not in daemon.log()
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection("127.0.0.1", port)
    finally:
        daemon.cleanup()


async def _json(session: aiohttp.ClientSession, url: str, expected: int) -> Any:
    async with session.get(url) as resp:
        assert resp.status == expected, await resp.text()
        return await resp.json()
