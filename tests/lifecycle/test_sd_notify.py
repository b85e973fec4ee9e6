"""systemd notify protocol: a real AF_UNIX datagram socket, in-process and with `icespool run`."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from support.daemon_harness import Daemon, DaemonDir

from icespool.lifecycle.sd_notify import Notifier, SystemdNotifier, watchdog_interval

WATCHDOG_USEC = 1_000_000  # pings expected every 0.5 s


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    """A bound datagram socket standing in for systemd, and its NOTIFY_SOCKET value."""
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.setblocking(False)
    try:
        yield sock, str(path)
    finally:
        sock.close()


@pytest.fixture
def abstract_receiver() -> Iterator[tuple[socket.socket, str]]:
    name = f"icespool-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.setblocking(False)
    try:
        yield sock, f"@{name}"
    finally:
        sock.close()


async def _recv(sock: socket.socket, within: float) -> tuple[float, list[str]] | None:
    """The next datagram as (monotonic arrival, its KEY=value lines), or None on timeout."""
    loop = asyncio.get_running_loop()
    try:
        data = await asyncio.wait_for(loop.sock_recv(sock, 4096), within)
    except TimeoutError:
        return None
    return time.monotonic(), data.decode().split("\n")


async def _collect(sock: socket.socket, seconds: float) -> list[tuple[float, list[str]]]:
    out: list[tuple[float, list[str]]] = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        message = await _recv(sock, left)
        if message is not None:
            out.append(message)
    return out


# ------------------------------------------------------------------ in-process


def test_watchdog_interval_is_half_of_watchdog_usec_and_respects_watchdog_pid() -> None:
    assert watchdog_interval({"WATCHDOG_USEC": "30000000"}, 42) == 15.0
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "42"}, 42) == 15.0
    # Meant for another process: we must not ping in its name.
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "7"}, 42) is None
    assert watchdog_interval({}, 42) is None
    assert watchdog_interval({"WATCHDOG_USEC": "0"}, 42) is None
    assert watchdog_interval({"WATCHDOG_USEC": "soon"}, 42) is None


async def test_abstract_namespace_socket_gets_one_datagram_per_call(
    abstract_receiver: tuple[socket.socket, str],
) -> None:
    sock, address = abstract_receiver
    notifier = Notifier(address)
    assert notifier.enabled
    assert notifier.send("READY=1", "STATUS=hello")
    message = await _recv(sock, 2)
    assert message is not None and message[1] == ["READY=1", "STATUS=hello"]
    notifier.close()
    assert not notifier.send("STATUS=after close")


def test_without_notify_socket_everything_is_a_no_op() -> None:
    assert not Notifier(None).enabled
    assert not Notifier(None).send("READY=1")
    assert not Notifier("relative/path").enabled  # not a valid NOTIFY_SOCKET
    notifier = SystemdNotifier(lambda: "x", env={})
    assert not notifier.enabled and notifier.watchdog is None


def test_a_vanished_receiver_does_not_raise(tmp_path: Path) -> None:
    notifier = Notifier(str(tmp_path / "nobody-listens.sock"))
    assert notifier.enabled
    assert notifier.send("WATCHDOG=1") is False
    notifier.close()


@pytest.mark.parametrize(("owner", "pings"), [("self", True), ("other", False)])
async def test_watchdog_pings_only_for_our_pid(
    abstract_receiver: tuple[socket.socket, str], owner: str, pings: bool
) -> None:
    sock, address = abstract_receiver
    pid = os.getpid()
    env = {
        "NOTIFY_SOCKET": address,
        "WATCHDOG_USEC": "200000",
        "WATCHDOG_PID": str(pid if owner == "self" else pid + 1),
    }
    notifier = SystemdNotifier(lambda: "steady", env=env, pid=pid)
    notifier.start()
    try:
        messages = await _collect(sock, 0.75)
    finally:
        await notifier.stop()
    watchdogs = [t for t, lines in messages if lines == ["WATCHDOG=1"]]
    statuses = [lines for _, lines in messages if lines != ["WATCHDOG=1"]]
    if pings:
        assert 5 <= len(watchdogs) <= 8, messages  # every 0.1 s
        # STATUS is sent when it changes, not at every tick.
        assert statuses == [["STATUS=steady"]]
    else:
        # No watchdog: the tick is the 5 s STATUS refresh, so nothing within 0.75 s.
        assert watchdogs == [] and statuses == []


# ------------------------------------------------------------------ a real daemon


async def test_icespool_run_speaks_the_notify_protocol(
    tmp_path: Path, receiver: tuple[socket.socket, str]
) -> None:
    sock, address = receiver
    home = DaemonDir(tmp_path / "d")
    home.write_config()
    daemon = Daemon(home)
    daemon.start(env={"NOTIFY_SOCKET": address, "WATCHDOG_USEC": str(WATCHDOG_USEC)})
    try:
        before_ready: list[list[str]] = []
        while True:
            message = await _recv(sock, 60)
            assert message is not None, f"no READY=1 within 60 s\n{daemon.tail()}"
            if "READY=1" in message[1]:
                ready_lines = message[1]
                break
            before_ready.append(message[1])
        # READY=1 means started: after recovery, with HTTP listening (no Kafka source
        # here, so /readyz answers 200 too, and the log says "icespool ready" after it).
        assert "icespool started: http://127.0.0.1:" in daemon.log()
        port = await daemon.wait_ready(within=5)
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/readyz") as resp:
                assert resp.status == 200
            assert ready_lines[0] == "READY=1"
            assert (
                ready_lines[1] == "STATUS=serving 1 tables: 0 records acked, 0 committed, spool 0 B"
            )
            for lines in before_ready:  # during start-up: watchdog and the starting status
                assert lines in (
                    ["WATCHDOG=1"],
                    ["STATUS=starting: recovering the spool, loading the catalog and tables"],
                ), before_ready

            # Watchdog pings at half of WATCHDOG_USEC, from the running event loop.
            messages = await _collect(sock, 2.6)
            pings = [t for t, lines in messages if lines == ["WATCHDOG=1"]]
            assert 4 <= len(pings) <= 6, messages
            gaps = [b - a for a, b in itertools.pairwise(pings)]
            assert all(0.3 < gap < 0.8 for gap in gaps), gaps

            # STATUS follows live figures.
            await daemon.ingest(session, [{"id": i, "v": "x"} for i in range(3)])
            deadline = time.monotonic() + 5
            seen: list[list[str]] = []
            while time.monotonic() < deadline:
                message = await _recv(sock, deadline - time.monotonic())
                if message is None:
                    break
                seen.append(message[1])
                if "STATUS=serving 1 tables: 3 records acked, 0 committed" in message[1][0]:
                    break
            assert any(
                lines[0].startswith("STATUS=serving 1 tables: 3 records acked, 0 committed, spool ")
                for lines in seen
            ), seen

        daemon.signal(signal.SIGTERM)
        stopping: list[str] | None = None
        deadline = time.monotonic() + 30
        while stopping is None and time.monotonic() < deadline:
            message = await _recv(sock, deadline - time.monotonic())
            if message is not None and "STOPPING=1" in message[1]:
                stopping = message[1]
        assert stopping == ["STOPPING=1", "STATUS=draining: committing 3 pending records"]
        assert await daemon.wait_exit(30) == 0
        rows, _ = home.read_rows()
        assert sorted(r["id"] for r in rows) == [0, 1, 2]
    finally:
        daemon.cleanup()
