"""Slow and idle connections and the per-IP cap, with raw sockets that trickle bytes or
sit idle: the server closes them within their bound while other clients are served."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from support.fixture_types import MakeConfig

from daemon.http import HttpServer, start_http
from daemon.http._conn import ConnectionLimits
from daemon.service import Icespool

HEADER_TIMEOUT = 0.6
IDLE_TIMEOUT = 0.8
PER_IP = 3
SLACK = 1.0  # timers on a loaded 2-core machine


@pytest.fixture
async def served(make_config: MakeConfig) -> AsyncIterator[tuple[Icespool, HttpServer]]:
    service = Icespool(make_config())
    await service.start()
    try:
        http = await start_http(
            service,
            "127.0.0.1",
            0,
            max_body_bytes=2**20,
            limits=ConnectionLimits(HEADER_TIMEOUT, IDLE_TIMEOUT, PER_IP),
        )
        try:
            yield service, http
        finally:
            await http.stop()
    finally:
        await service.stop()


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


async def test_connections_beyond_the_per_ip_cap_get_503_and_others_are_served(
    served: tuple[Icespool, HttpServer],
) -> None:
    service, http = served
    held = [await _open(http) for _ in range(PER_IP)]
    for reader, writer in held:
        assert await _get(reader, writer) == 200
    reader, writer = await _open(http)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    status, headers, body = await _answer(reader)
    assert (status, headers["retry-after"], headers["connection"]) == (503, "1", "close")
    assert body == {
        "error": f"too many connections from 127.0.0.1: {PER_IP} are open already "
        "(http.max_connections_per_ip); reuse connections or retry shortly"
    }
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    # Another address is not held back, and the held connections still work.
    await _served_meanwhile(http)
    for reader, writer in held:
        assert await _get(reader, writer) == 200
    assert http.connections.open_from("127.0.0.1") == PER_IP
    # One closed frees a place.
    held[0][1].close()
    await held[0][1].wait_closed()
    for _ in range(50):
        if http.connections.open_from("127.0.0.1") < PER_IP:
            break
        await asyncio.sleep(0.02)
    reader, writer = await _open(http)
    assert await _get(reader, writer) == 200
    writer.close()
    for _, other in held[1:]:
        other.close()
    assert _closed(service, "per_ip_limit") == 1
