"""The log says "icespool ready" when /readyz does, and each retry is one line.

Real `icespool run` children: one whose Kafka source points at a closed port (started,
never ready), one on a PostgreSQL catalog behind a loopback proxy that refuses at start,
forwards, refuses again and forwards again (every transition one line).
"""

from __future__ import annotations

import signal
import socket
from pathlib import Path

import aiohttp
from support.daemon_harness import Daemon, DaemonDir
from support.proxy import TcpProxy

_TIMEOUT = aiohttp.ClientTimeout(total=30)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _readyz(url: str) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession(timeout=_TIMEOUT) as session,
        session.get(f"{url}/readyz") as resp,
    ):
        return resp.status, (await resp.json()).get("error", "")


async def test_started_with_kafka_unreachable_is_not_logged_ready(tmp_path: Path) -> None:
    port = _closed_port()
    home = DaemonDir(tmp_path / "d")
    home.write_config(
        extra=f'\n[[kafka]]\nbootstrap_servers = "127.0.0.1:{port}"\ntopics = ["ev"]\n'
        'table = "t.events"\n'
    )
    daemon = Daemon(home)
    try:
        daemon.start()
        await daemon.wait_listening()
        await daemon.wait_log("icespool started: http://127.0.0.1:", within=60)
        await daemon.wait_log("Kafka unavailable, retrying", within=30, count=3)
        assert await _readyz(daemon.url) == (
            503,
            "not ready: Kafka not connected (kafka[0]); retrying with backoff",
        )
        log = daemon.log()
        assert "icespool ready" not in log, daemon.tail()
        # One line per attempt: every line naming the broker is the source's warning
        # (aiokafka's own "Unable connect to" is kept at debug level).
        about_broker = [line for line in log.splitlines() if f"127.0.0.1:{port}" in line]
        cause = (
            f"kafka[0]: Kafka unavailable, retrying: cannot connect to Kafka (127.0.0.1:{port}: "
            "ConnectionRefusedError: [Errno 111] Connection refused)"
        )
        assert len(about_broker) >= 3, daemon.tail()
        assert all(cause in line for line in about_broker), about_broker
        started = [line for line in log.splitlines() if "icespool started: " in line]
        assert len(started) == 1, log
        assert (
            started[0]
            .split("] ", 1)[1]
            .startswith(
                f"icespool started: {daemon.url}, tables t.events, t.events_dead_letter, "
                f"spool {home.spool_dir} "
            )
        ), started
        daemon.signal(signal.SIGTERM)
        assert await daemon.wait_exit(within=40) == 0, daemon.tail()
        assert "icespool ready" not in daemon.log(), daemon.tail()
    finally:
        daemon.cleanup()


async def test_each_readiness_change_is_one_line(
    pg_proxy: tuple[TcpProxy, str], tmp_path: Path
) -> None:
    proxy, uri = pg_proxy
    proxy.mode = "refuse"
    home = DaemonDir(tmp_path / "d", catalog_uri=uri)
    home.write_config(extra='\n[timeouts]\ncatalog_connect = "1s"\ncatalog_request = "1s"\n')
    daemon = Daemon(home)
    try:
        daemon.start()
        await daemon.wait_listening()
        await daemon.wait_log("retrying in", within=30, count=2)
        # Each failed catalog attempt at start is one line.
        refused = [line for line in daemon.log().splitlines() if "Connection refused" in line]
        assert len(refused) >= 2, daemon.tail()
        assert all(
            "cannot load catalog 'lake' (OperationalError: (psycopg2.OperationalError) "
            "Connection refused); check the [catalog] settings"
            in line
            and "retrying in " in line
            for line in refused
        ), refused
        assert "icespool ready" not in daemon.log()

        proxy.mode = "forward"
        await daemon.wait_ready(within=90)
        assert daemon.log().count("icespool ready: ") == 1, daemon.tail()

        proxy.mode = "refuse"  # the catalog probe (every 5 s) finds it gone
        await daemon.wait_log("icespool not ready: ", within=30)
        status, error = await _readyz(daemon.url)
        assert status == 503, error
        reason = error.removeprefix("not ready: ")
        assert reason.startswith("catalog 'lake' unreachable ("), reason
        lines = daemon.log().splitlines()
        [unready] = [line for line in lines if "icespool not ready: " in line]
        # The reason as it was then (the probe's error text may differ from try to try).
        assert "[warning" in unready, unready
        assert "icespool not ready: catalog 'lake' unreachable (" in unready, unready

        proxy.mode = "forward"
        await daemon.wait_log("icespool ready again: ", within=30)
        assert (await _readyz(daemon.url))[0] == 200
        log = daemon.log()
        assert log.count("icespool ready: ") == 1, daemon.tail()
        assert log.count("icespool not ready: ") == 1, daemon.tail()
        assert log.count(f"icespool ready again: {daemon.url}") == 1, daemon.tail()
        assert (
            log.index("icespool ready: ")
            < log.index("icespool not ready: ")
            < log.index("icespool ready again: ")
        )
        daemon.signal(signal.SIGTERM)
        assert await daemon.wait_exit(within=40) == 0, daemon.tail()
    finally:
        daemon.cleanup()
