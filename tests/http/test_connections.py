"""Slow and idle connections and the per-IP cap, with raw sockets that trickle bytes or
sit idle: the server closes them within their bound while other clients are served, and
at the cap closes the ones without a request to admit whole requests, or parks the new
ones unread until a place frees."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from support.fixture_types import MakeConfig

from icespool.http import HttpServer, start_http
from icespool.http._conn import ConnectionLimits
from icespool.lifecycle.service import Icespool

HEADER_TIMEOUT = 0.6
IDLE_TIMEOUT = 0.8
PER_IP = 3
SLACK = 1.0  # timers on a loaded 2-core machine


@asynccontextmanager
async def _serving(
    make_config: MakeConfig, limits: ConnectionLimits
) -> AsyncIterator[tuple[Icespool, HttpServer]]:
    service = Icespool(make_config())
    await service.start()
    try:
        http = await start_http(service, "127.0.0.1", 0, max_body_bytes=2**20, limits=limits)
        try:
            yield service, http
        finally:
            await http.stop()
    finally:
        await service.stop()


@pytest.fixture
async def served(make_config: MakeConfig) -> AsyncIterator[tuple[Icespool, HttpServer]]:
    async with _serving(make_config, ConnectionLimits(HEADER_TIMEOUT, IDLE_TIMEOUT, PER_IP)) as s:
        yield s


@pytest.fixture
async def shared(make_config: MakeConfig) -> AsyncIterator[tuple[Icespool, HttpServer]]:
    """The per-IP cap alone: timeouts far beyond these tests, so only the cap closes."""
    async with _serving(make_config, ConnectionLimits(30.0, 30.0, PER_IP)) as s:
        yield s


async def _open(
    http: HttpServer, source: str = "127.0.0.1"
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", http.port, local_addr=(source, 0))


async def _answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], Any]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines[1:] if line)}
    body = await reader.readexactly(int(headers["content-length"]))
    return int(lines[0].split(" ")[1]), headers, json.loads(body)


async def _get(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    status, _, body = await _answer(reader)
    assert body == {"status": "ok"}
    return status


async def _closed_after(reader: asyncio.StreamReader, started: float) -> float:
    """Seconds from ``started`` until the server closed (EOF); fails past the bound."""
    rest = await asyncio.wait_for(reader.read(), 10)
    assert rest == b""
    return time.monotonic() - started


async def _served_meanwhile(http: HttpServer, rounds: int = 3) -> None:
    for _ in range(rounds):
        reader, writer = await _open(http, "127.0.0.2")
        assert await _get(reader, writer) == 200
        writer.close()
        await asyncio.sleep(0.1)


def _closed(service: Icespool, reason: str) -> float:
    value = service.metrics.registry.get_sample_value(
        "icespool_http_connections_closed_total", {"reason": reason}
    )
    return value or 0.0


async def test_a_client_trickling_headers_gets_408_and_is_closed(
    served: tuple[Icespool, HttpServer],
) -> None:
    service, http = served
    reader, writer = await _open(http)
    started = time.monotonic()

    async def trickle() -> None:
        writer.write(b"GET /healthz HTTP/1.1\r\n")
        for byte in b"X-Slow: " + b"a" * 1000:
            if writer.is_closing() or reader.at_eof():
                return
            writer.write(bytes([byte]))
            await asyncio.sleep(0.05)

    trickling = asyncio.create_task(trickle())
    await _served_meanwhile(http)
    status, headers, body = await _answer(reader)
    assert (status, headers["connection"], body) == (
        408,
        "close",
        {
            "error": f"the request line and headers did not arrive within {HEADER_TIMEOUT:g} s "
            "(http.header_timeout); send them at once"
        },
    )
    elapsed = await _closed_after(reader, started)
    assert HEADER_TIMEOUT * 0.9 <= elapsed <= HEADER_TIMEOUT + SLACK
    trickling.cancel()
    writer.close()
    assert _closed(service, "header_timeout") == 1


async def test_a_silent_connection_is_closed_within_the_header_timeout(
    served: tuple[Icespool, HttpServer],
) -> None:
    _, http = served
    reader, writer = await _open(http)
    started = time.monotonic()
    status, _, _ = await _answer(reader)
    assert status == 408
    assert await _closed_after(reader, started) <= HEADER_TIMEOUT + SLACK
    writer.close()


async def test_an_idle_keep_alive_is_closed_and_a_busy_one_kept(
    served: tuple[Icespool, HttpServer],
) -> None:
    service, http = served
    busy_reader, busy_writer = await _open(http)
    idle_reader, idle_writer = await _open(http)
    assert await _get(idle_reader, idle_writer) == 200
    started = time.monotonic()
    closing = asyncio.create_task(_closed_after(idle_reader, started))  # silently: no bytes
    # Requests every half idle timeout keep a connection open well past the timeout.
    for _ in range(5):
        assert await _get(busy_reader, busy_writer) == 200
        await asyncio.sleep(IDLE_TIMEOUT / 2)
    elapsed = await closing
    assert IDLE_TIMEOUT * 0.9 <= elapsed <= IDLE_TIMEOUT + SLACK
    assert time.monotonic() - started > IDLE_TIMEOUT * 2
    assert await _get(busy_reader, busy_writer) == 200
    busy_writer.close()
    idle_writer.close()
    assert _closed(service, "idle_timeout") == 1


SHED_AFTER = 0.5  # icespool.http._conn: how long a connection waits before it may be shed
PARK_PER_CAP = 64  # icespool.http._conn: connections one IP may park, per place under its cap
SHED = {
    "error": f"closed to make room: 127.0.0.1 opened more than {PER_IP} connections "
    "(http.max_connections_per_ip) and this one had not sent a whole request head; send "
    "requests at once, or retry shortly"
}


def _parked(service: Icespool) -> float:
    value = service.metrics.registry.get_sample_value("icespool_http_connections_parked")
    assert value is not None
    return value


async def _settle(http: HttpServer) -> None:
    """Let the loop run the callbacks of connections opened or closed just now."""
    for _ in range(5):
        await asyncio.sleep(0.01)
    assert http.connections.open_from("127.0.0.1") <= PER_IP


async def _unanswered(reader: asyncio.StreamReader, seconds: float) -> bool:
    """No byte of an answer (nor a close) comes within ``seconds``."""
    try:
        await asyncio.wait_for(reader.read(1), seconds)
    except TimeoutError:
        return True
    return False


async def _busy(
    http: HttpServer, count: int
) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """Connections that each sent a whole ingest request head, its body not yet."""
    held = [await _open(http) for _ in range(count)]
    for i, (_, writer) in enumerate(held):
        writer.write(
            b"POST /v1/tables/demo.events/records HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Content-Type: application/x-ndjson\r\nContent-Length: %d\r\n\r\n"
            % len(b'{"event_id": %d}\n' % i)
        )
    return held


async def _finish(held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]) -> None:
    """Send the bodies `_busy` left out: each is acked and closed."""
    for i, (reader, writer) in enumerate(held):
        writer.write(b'{"event_id": %d}\n' % i)
        assert (await _answer(reader))[::2] == (200, {"accepted": 1})
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()


async def test_when_every_connection_of_an_ip_is_busy_the_next_waits_unread_for_a_place(
    shared: tuple[Icespool, HttpServer],
) -> None:
    service, http = shared
    held = await _busy(http, PER_IP)
    await asyncio.sleep(SHED_AFTER + 0.2)  # old enough to be shed, were they not busy
    reader, writer = await _open(http)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert await _unanswered(reader, SHED_AFTER + 0.2)
    assert http.connections.open_from("127.0.0.1") == PER_IP
    assert (http.connections.parked_from("127.0.0.1"), _parked(service)) == (1, 1)
    # Another address is not held back.
    await _served_meanwhile(http)
    # The first busy connection closes after its answer: the waiting one takes its place.
    await _finish(held[:1])
    status, _, body = await _answer(reader)
    assert (status, body) == (200, {"status": "ok"})
    assert (http.connections.parked_from("127.0.0.1"), _parked(service)) == (0, 0)
    await _finish(held[1:])
    writer.close()
    assert (_closed(service, "per_ip_limit"), _closed(service, "per_ip_shed")) == (0, 0)


async def test_a_waiting_request_closes_the_longest_idle_keep_alive_once_it_may(
    shared: tuple[Icespool, HttpServer],
) -> None:
    service, http = shared
    kept = [await _open(http) for _ in range(PER_IP)]
    idle_since = time.monotonic()  # the first is idle from its answer on
    for connection in kept:
        assert await _get(*connection) == 200
    newcomer = await _open(http)
    assert await _get(*newcomer) == 200
    assert time.monotonic() - idle_since >= SHED_AFTER
    assert await asyncio.wait_for(kept[0][0].read(), 5) == b""  # closed without a word
    for connection in kept[1:]:
        assert await _get(*connection) == 200
    assert http.connections.open_from("127.0.0.1") == PER_IP
    for _, writer in (*kept, newcomer):
        writer.close()
    assert (_closed(service, "per_ip_limit"), _closed(service, "per_ip_shed")) == (0, 1)


async def test_a_connection_that_waits_the_header_timeout_for_a_place_gets_503(
    served: tuple[Icespool, HttpServer],
) -> None:
    service, http = served
    held = await _busy(http, PER_IP)  # busy: no header timer, the body has 60 s
    reader, writer = await _open(http)
    started = time.monotonic()
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    status, headers, body = await _answer(reader)
    assert (status, headers["retry-after"], headers["connection"], body) == (
        503,
        "1",
        "close",
        {
            "error": f"too many connections from 127.0.0.1: {PER_IP} are open already, all "
            f"in use, and this one waited {HEADER_TIMEOUT:g} s (http.header_timeout) for a "
            "place (http.max_connections_per_ip); reuse connections or retry shortly"
        },
    )
    assert HEADER_TIMEOUT * 0.9 <= await _closed_after(reader, started) <= HEADER_TIMEOUT + SLACK
    writer.close()
    assert _parked(service) == 0
    await _finish(held)
    assert (_closed(service, "per_ip_limit"), _closed(service, "per_ip_shed")) == (1, 0)


async def test_silent_and_trickling_connections_make_room_for_whole_requests(
    shared: tuple[Icespool, HttpServer],
) -> None:
    service, http = shared
    opened = time.monotonic()
    silent = await _open(http)
    trickling = await _open(http)
    trickling[1].write(b"GET /healthz HTTP/1.1\r\nHost")
    kept = await _open(http)
    assert await _get(*kept) == 200
    await _settle(http)
    # Just opened, they may still send their requests: a newcomer waits until the
    # oldest may be closed, then takes its place.
    newcomers = [await _open(http)]
    assert await _get(*newcomers[-1]) == 200
    assert time.monotonic() - opened >= SHED_AFTER
    status, headers, body = await _answer(silent[0])
    assert (status, headers["retry-after"], body) == (503, "1", SHED)
    await asyncio.sleep(SHED_AFTER + 0.2)
    # Later each newcomer closes the oldest without a whole head, then the longest idle.
    for victim in (trickling, kept):
        newcomers.append(await _open(http))
        assert await _get(*newcomers[-1]) == 200
        if victim is kept:
            assert await asyncio.wait_for(victim[0].read(), 5) == b""
        else:
            status, headers, body = await _answer(victim[0])
            assert (status, headers["retry-after"], body) == (503, "1", SHED)
        assert http.connections.open_from("127.0.0.1") == PER_IP
        await asyncio.sleep(SHED_AFTER + 0.2)  # the newcomer is an idle keep-alive now
    assert (_closed(service, "per_ip_limit"), _closed(service, "per_ip_shed")) == (0, 3)
    for _, other in (silent, trickling, kept, *newcomers):
        other.close()


async def test_one_client_opening_many_silent_connections_is_read_on_the_cap_and_parks_64x(
    shared: tuple[Icespool, HttpServer],
) -> None:
    service, http = shared
    bound = PARK_PER_CAP * PER_IP
    opened = [await _open(http) for _ in range(PER_IP + bound + 5)]
    await _settle(http)
    # Silent connections that wait make no room: nothing is closed for them.
    await asyncio.sleep(SHED_AFTER + 0.2)
    assert http.connections.open_from("127.0.0.1") == PER_IP
    assert (http.connections.parked_from("127.0.0.1"), _parked(service)) == (bound, bound)
    waiting = await asyncio.gather(*(_unanswered(reader, 0.3) for reader, _ in opened[:-5]))
    assert waiting == [True] * (PER_IP + bound)
    for reader, _ in opened[-5:]:
        status, headers, body = await _answer(reader)
        assert (status, headers["retry-after"], body) == (
            503,
            "1",
            {
                "error": f"too many connections from 127.0.0.1: {PER_IP} are open already, "
                f"all in use, and {bound} more wait for a place "
                "(http.max_connections_per_ip); reuse connections or retry shortly"
            },
        )
    assert (_closed(service, "per_ip_limit"), _closed(service, "per_ip_shed")) == (5, 0)
    # Another address is served meanwhile.
    await _served_meanwhile(http, 1)
    # The admitted ones hang up: the first parked ones take their places, in order.
    for _, writer in opened[:PER_IP]:
        writer.close()
    for connection in opened[PER_IP : 2 * PER_IP]:
        assert await _get(*connection) == 200
    assert http.connections.open_from("127.0.0.1") == PER_IP
    assert http.connections.parked_from("127.0.0.1") == bound - PER_IP
    for _, writer in opened:
        writer.close()
