"""Clients that share one address (an ingress or a mesh sidecar), against ONE real
``icespool run`` child with the default per-IP cap (256), over real sockets:

- 300 connections from 127.0.0.1 that send nothing or trickle a head do not lock out
  whole requests: 50 of them are all answered 200 and every record is committed once,
  and only the oldest silent connections are closed, as many as the places needed;
- a flood of 2,000 concurrent whole requests: each is answered 200 on its first try (those
  beyond the cap wait, unread, for a place), and every record goes in once;
- one client opening 1,000 idle connections: the daemon reads the cap's 256, the rest
  wait unread, nothing is closed for them;
- with a cap of 4 (so 256 may wait), one client opening 280: the 20 beyond get 503 at
  once, and the 260 held are all answered and closed by the header timeout.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from support.daemon_harness import Daemon, DaemonDir

CAP = 256  # http.max_connections_per_ip's default
SHED_AFTER = 0.5  # icespool.http._conn: how long a connection waits before it may be shed
PARK_PER_CAP = 64  # icespool.http._conn: connections one IP may park, per place under its cap
SHED = (
    f'{{"error": "closed to make room: 127.0.0.1 opened more than {CAP} connections '
    "(http.max_connections_per_ip) and this one had not sent a whole request head; send "
    'requests at once, or retry shortly"}'
)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    home = DaemonDir(tmp_path_factory.mktemp("shared") / "d")
    home.write_config()
    running = Daemon(home)
    # Header timeouts far beyond these tests: only the cap closes connections here.
    running.start(env={"ICESPOOL__HTTP__HEADER_TIMEOUT": "60s"})
    try:
        asyncio.run(running.wait_ready())
        yield running
    finally:
        running.kill()
        running.cleanup()


def _request(ids: range) -> bytes:
    body = b"".join(b'{"id": %d}\n' % i for i in ids)
    head = (
        b"POST /v1/tables/t.events/records HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/x-ndjson\r\nConnection: close\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    )
    return head + body


def _parse(answer: bytes) -> tuple[int, dict[str, str], str]:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines[1:])}
    return int(lines[0].split(" ")[1]), headers, body.decode()


async def _whole(port: int, ids: range) -> tuple[int, dict[str, str], str]:
    """One request on a new connection, sent at once; the answer to the close."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(_request(ids))
        await writer.drain()
        return _parse(await asyncio.wait_for(reader.read(), 60))
    finally:
        writer.close()


def _elsewhere() -> aiohttp.ClientSession:
    """A session from another address (as Prometheus or an operator would come): its
    connections do not count against 127.0.0.1's cap, nor make room in it."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=("127.0.0.2", 0)))


async def _closures(daemon: Daemon) -> dict[str, float]:
    async with _elsewhere() as session:
        text = await daemon.metrics(session)
    found = re.findall(
        r'^icespool_http_connections_closed_total\{reason="(\w+)"\} (\S+)$', text, re.M
    )
    return {reason: float(value) for reason, value in found}


async def _parked(daemon: Daemon) -> float:
    async with _elsewhere() as session:
        text = await daemon.metrics(session)
    found = re.findall(r"^icespool_http_connections_parked (\S+)$", text, re.M)
    assert len(found) == 1, text
    return float(found[0])


def _delta(after: dict[str, float], before: dict[str, float], reason: str) -> float:
    return after.get(reason, 0.0) - before.get(reason, 0.0)


async def _flushed_ids(daemon: Daemon) -> list[int]:
    async with _elsewhere() as session:
        await daemon.flush(session)
    rows, _ = await asyncio.to_thread(daemon.home.read_rows)
    return sorted(row["id"] for row in rows)


async def _ended(reader: asyncio.StreamReader) -> bytes | None:
    """What the daemon sent before closing, or None while it keeps the connection."""
    try:
        return await asyncio.wait_for(reader.read(), 1.0)
    except TimeoutError:
        return None


async def test_idle_and_trickling_connections_do_not_lock_out_whole_requests(
    daemon: Daemon,
) -> None:
    port = daemon.port or 0
    before = await _closures(daemon)
    silent = [await asyncio.open_connection("127.0.0.1", port) for _ in range(200)]
    trickling = [await asyncio.open_connection("127.0.0.1", port) for _ in range(100)]

    async def trickle(writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(b"GET /healthz HTTP/1.1\r\nX-Slow: ")
            while not writer.is_closing():
                await asyncio.sleep(0.2)
                writer.write(b"a")
                await writer.drain()
        except ConnectionError:
            return  # closed to make room

    tasks = [asyncio.create_task(trickle(writer)) for _, writer in trickling]
    try:
        await asyncio.sleep(SHED_AFTER + 0.5)  # as hogs do, they have held their places a while
        answers = await asyncio.gather(*(_whole(port, range(i, i + 1)) for i in range(50)))
        assert [(status, body) for status, _, body in answers] == [(200, '{"accepted":1}')] * 50
        assert await _flushed_ids(daemon) == list(range(50))
        # Every hog closed was answered as the cap says, and only as many were closed as
        # the cap needed: those beyond it, and one per request that found it full.
        for task in tasks:
            task.cancel()
        ends = await asyncio.gather(*(_ended(reader) for reader, _ in silent + trickling))
        # The 44 tricklers beyond the cap waited, their bytes unread, and each closed a
        # silent connection once it was 0.5 s old; a whole request closed one more, or
        # took the place of one answered before it: the oldest silent ones were closed.
        closed = [_parse(end)[::2] for end in ends if end is not None]
        assert closed == [(503, SHED)] * len(closed)
        assert 300 - CAP <= len(closed) <= 300 - CAP + 50
        assert ends[: len(closed)] == [end for end in ends if end is not None]  # the oldest
        after = await _closures(daemon)
        assert _delta(after, before, "per_ip_shed") == len(closed)
        assert _delta(after, before, "per_ip_limit") == 0
    finally:
        for _, writer in silent + trickling:
            writer.close()


async def test_a_flood_of_whole_requests_is_answered_and_every_record_goes_in_once(
    daemon: Daemon,
) -> None:
    port = daemon.port or 0
    await asyncio.sleep(SHED_AFTER)  # the last test's connections are gone
    first = 1000

    before = await _closures(daemon)
    answers = await asyncio.gather(
        *(_whole(port, range(i, i + 1)) for i in range(first, first + 2000))
    )
    assert [(status, body) for status, _, body in answers] == [(200, '{"accepted":1}')] * 2000
    after = await _closures(daemon)
    assert _delta(after, before, "per_ip_limit") == _delta(after, before, "per_ip_shed") == 0
    assert await _parked(daemon) == 0
    ids = await _flushed_ids(daemon)
    assert [i for i in ids if i >= first] == list(range(first, first + 2000))


def _established(pid: int, port: int, peers: set[int] | None = None) -> int:
    """TCP connections on ``port`` the process holds open and established (with
    ``peers``: only those from these client ports, not another test's or the harness's)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    # Counted by inode: /proc's table is read in several reads while other tests' sockets
    # come and go, and a line can then be listed twice.
    found: set[str] = set()
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local_port, state, inode = int(fields[1].split(":")[1], 16), fields[3], fields[9]
        peer = int(fields[2].split(":")[1], 16)
        ours = peers is None or peer in peers
        if local_port == port and state == "01" and inode in inodes and ours:
            found.add(inode)
    return len(found)


async def test_one_client_opening_1000_idle_connections_is_read_on_the_cap_only(
    daemon: Daemon,
) -> None:
    port, pid = daemon.port or 0, daemon.pid or 0
    await asyncio.sleep(SHED_AFTER)
    assert _established(pid, port) == 0
    before = await _closures(daemon)
    opened: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        for _ in range(10):
            opened += [await asyncio.open_connection("127.0.0.1", port) for _ in range(100)]
        # Silent connections that wait make no room: nothing is closed for them.
        await asyncio.sleep(SHED_AFTER)
        ends = await asyncio.gather(*(_ended(reader) for reader, _ in opened))
        assert ends == [None] * 1000
        peers = {writer.get_extra_info("sockname")[1] for _, writer in opened}
        assert (_established(pid, port, peers), await _parked(daemon)) == (1000, 1000 - CAP)
        after = await _closures(daemon)
        assert _delta(after, before, "per_ip_limit") == _delta(after, before, "per_ip_shed") == 0
    finally:
        for _, writer in opened:
            writer.close()


SMALL_CAP = 4
SMALL_TIMEOUT = 3.0


@pytest.fixture
def small_cap(tmp_path: Path) -> Iterator[Daemon]:
    home = DaemonDir(tmp_path / "small")
    home.write_config()
    running = Daemon(home)
    running.start(
        env={
            "ICESPOOL__HTTP__MAX_CONNECTIONS_PER_IP": str(SMALL_CAP),
            "ICESPOOL__HTTP__HEADER_TIMEOUT": f"{SMALL_TIMEOUT:g}s",
        }
    )
    try:
        asyncio.run(running.wait_ready())
        yield running
    finally:
        running.kill()
        running.cleanup()


async def test_an_unbounded_opener_gets_503_beyond_the_queue_and_is_closed_in_time(
    small_cap: Daemon,
) -> None:
    port, pid = small_cap.port or 0, small_cap.pid or 0
    bound = PARK_PER_CAP * SMALL_CAP
    opened = [
        await asyncio.open_connection("127.0.0.1", port) for _ in range(SMALL_CAP + bound + 20)
    ]
    started = time.monotonic()
    try:
        full = (
            f'{{"error": "too many connections from 127.0.0.1: {SMALL_CAP} are open already, '
            f"all in use, and {bound} more wait for a place (http.max_connections_per_ip); "
            'reuse connections or retry shortly"}'
        )
        refused = await asyncio.gather(*(_ended(reader) for reader, _ in opened[-20:]))
        assert [_parse(end)[::2] if end else None for end in refused] == [(503, full)] * 20
        # The 20 refused linger a moment after their answer: count the ones held.
        peers = {writer.get_extra_info("sockname")[1] for _, writer in opened[:-20]}
        held = _established(pid, port, peers)
        assert (held, await _parked(small_cap)) == (SMALL_CAP + bound, bound)
        # Then the header timeout answers every one held: 408 for those read, 503 for
        # those still waiting (a place freed by a 408 admits one more, read anew).
        held = await asyncio.gather(
            *(asyncio.wait_for(reader.read(), 2 * SMALL_TIMEOUT + 10) for reader, _ in opened[:-20])
        )
        assert time.monotonic() - started >= SMALL_TIMEOUT * 0.9
        answers = Counter(_parse(end)[::2] for end in held)
        waited = (
            f'{{"error": "too many connections from 127.0.0.1: {SMALL_CAP} are open already, '
            f"all in use, and this one waited {SMALL_TIMEOUT:g} s (http.header_timeout) for a "
            'place (http.max_connections_per_ip); reuse connections or retry shortly"}'
        )
        late = (
            f'{{"error": "the request line and headers did not arrive within {SMALL_TIMEOUT:g} '
            's (http.header_timeout); send them at once"}'
        )
        assert set(answers) == {(503, waited), (408, late)}
        assert sum(answers.values()) == SMALL_CAP + bound
        assert SMALL_CAP <= answers[(408, late)] <= 2 * SMALL_CAP
        closures = await _closures(small_cap)
        assert closures.get("per_ip_limit") == 20 + answers[(503, waited)]
        assert closures.get("header_timeout") == answers[(408, late)]
        assert await _parked(small_cap) == 0
    finally:
        for _, writer in opened:
            writer.close()
