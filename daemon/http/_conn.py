"""The HTTP listener's connections: slow headers, idle keep-alives, per-IP caps.

aiohttp handles requests; this layer sits between the listening socket and aiohttp's
protocol (one `_Guarded` protocol per connection wrapping aiohttp's) and bounds what a
client can hold without sending requests:

- ``header_timeout``: once a connection opens, or the first byte of a next request
  arrives, the request line and headers must be complete within it; otherwise the
  client is answered 408 and the connection closed (a client trickling headers byte by
  byte cannot hold it for ever). The TLS handshake has the same bound.
- ``idle_timeout``: a kept-alive connection with no new request for that long is closed.
- ``max_per_ip``: open connections per client IP (0: no cap). Behind an ingress or a
  mesh sidecar every client has one address, so a connection that would pass the cap
  first makes room: the oldest of that IP's connections still without a whole request
  head is closed (answered 503), else its longest-idle keep-alive; only when every one
  is busy with a whole request is the new one answered 503 with Retry-After and closed,
  before aiohttp sees it. Open sockets per IP never pass the cap either way.

The request body has its own bound (the ingest route's ``body_timeout``, 408). The
middleware tells `Connections` when a request's headers are complete (`begin`) and
when its answer is ready (`end`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import select
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, cast

__all__ = ["ConnectionLimits", "Connections"]

_log = logging.getLogger("icespool.http")

# HEADERS: no whole request head yet; ARRIVED: one arrived, its handler not started;
# BUSY: a request is handled; IDLE: kept alive, waiting for the next request.
_HEADERS, _ARRIVED, _BUSY, _IDLE = "headers", "arrived", "busy", "idle"
_HEAD_END: Final = b"\r\n\r\n"
# A refused connection is read (and dropped) this long after the answer, so the
# client's request bytes do not turn the close into a reset that hides the answer.
_LINGER: Final = 2.0
_REFUSED_RETRY_AFTER: Final = 1
# A connection is closed to make room only once it has waited this long for a request
# head: a client that just connected may be sending its request now (it is then the
# newcomer that is refused). For a keep-alive it is also time for aiohttp to write the
# answer `end` came before.
_SHED_AFTER: Final = 0.5
# Candidates looked at (oldest first) when making room: bounds the work a new
# connection at the cap costs.
_SHED_SCAN: Final = 32


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """``http.header_timeout``, ``http.idle_timeout``, ``http.max_connections_per_ip``."""

    header_timeout: float = 10.0
    idle_timeout: float = 60.0
    max_per_ip: int = 256


def _raw_answer(status: int, reason: str, message: str, headers: dict[str, str]) -> bytes:
    body = json.dumps({"error": message}).encode()
    lines = [f"HTTP/1.1 {status} {reason}", "Content-Type: application/json; charset=utf-8"]
    lines += [f"{key}: {value}" for key, value in headers.items()]
    lines += [f"Content-Length: {len(body)}", "Connection: close", "", ""]
    return "\r\n".join(lines).encode() + body


class Connections:
    """Every connection of one listener; ``protocol`` is the factory to listen with."""

    def __init__(
        self,
        limits: ConnectionLimits,
        inner: Callable[[], asyncio.Protocol],
        on_close: Callable[[str], None],
    ) -> None:
        self.limits = limits
        self._inner = inner
        self._on_close = on_close  # called with the reason of each connection we close
        self._per_ip: Counter[str] = Counter()
        self._by_transport: dict[Any, _Guarded] = {}
        # Per IP, oldest first, the connections that may be closed to make room (->
        # since when they wait): without a whole request head, and kept-alive idle.
        self._headless: dict[str, dict[_Guarded, float]] = {}
        self._idle: dict[str, dict[_Guarded, float]] = {}

    def protocol(self) -> asyncio.Protocol:
        return _Guarded(self, self._inner())

    def open_from(self, ip: str) -> int:
        """Connections ``ip`` holds open now."""
        return self._per_ip[ip]

    def begin(self, transport: Any) -> None:
        """A request's headers are complete: its handler runs (no header timer)."""
        guarded = self._by_transport.get(transport)
        if guarded is not None:
            guarded.busy()

    def end(self, transport: Any) -> None:
        """A request's answer is ready: the connection is idle until the next one."""
        guarded = self._by_transport.get(transport)
        if guarded is not None:
            guarded.idle()

    # ---------------------------------------------------------------- for _Guarded

    def admit(self, guarded: _Guarded, transport: Any) -> bool:
        """Count ``guarded`` against its IP's cap, first closing one of the IP's
        connections that holds a place without a request if the cap is reached;
        False (refuse it) when every one is in use."""
        ip = guarded.ip
        cap = self.limits.max_per_ip
        if cap and self._per_ip[ip] >= cap:
            victim = self._victim(ip)
            if victim is None:
                return False
            victim.shed()  # gives its place back now, before the socket is gone
        self._per_ip[ip] += 1
        self._by_transport[transport] = guarded
        return True

    def release(self, guarded: _Guarded, transport: Any) -> None:
        ip = guarded.ip
        self.waiting(guarded, None)
        self._by_transport.pop(transport, None)
        self._per_ip[ip] -= 1
        if self._per_ip[ip] <= 0:
            del self._per_ip[ip]

    def waiting(self, guarded: _Guarded, state: str | None) -> None:
        """Where ``guarded`` stands in the queues of connections that may be shed:
        HEADERS (no whole head), IDLE, or None (neither)."""
        ip = guarded.ip
        for queue in (self._headless, self._idle):
            held = queue.get(ip)
            if held is not None and held.pop(guarded, None) is not None and not held:
                del queue[ip]
        if state == _HEADERS:
            self._headless.setdefault(ip, {})[guarded] = time.monotonic()
        elif state == _IDLE:
            self._idle.setdefault(ip, {})[guarded] = time.monotonic()

    def closed(self, reason: str) -> None:
        self._on_close(reason)

    def _victim(self, ip: str) -> _Guarded | None:
        """The oldest connection of ``ip`` without a whole request head, else its
        longest-idle keep-alive; never one whose socket holds bytes not read yet (a
        request that arrived while the loop was busy, not a silent client)."""
        now = time.monotonic()
        for queue in (self._headless, self._idle):
            candidates = []
            for guarded, since in itertools.islice(queue.get(ip, {}).items(), _SHED_SCAN):
                if now - since < _SHED_AFTER:
                    break  # the rest have waited less still
                if guarded.flushed():
                    candidates.append(guarded)
            arriving = _unread(candidates)
            for guarded in candidates:
                if guarded not in arriving:
                    return guarded
        return None


def _unread(connections: list[_Guarded]) -> set[_Guarded]:
    """Those of ``connections`` whose socket has bytes the loop has not read yet."""
    if not connections:
        return set()
    poller = select.poll()
    by_fd: dict[int, _Guarded] = {}
    for guarded in connections:
        fd = guarded.fileno()
        if fd >= 0:
            by_fd[fd] = guarded
            poller.register(fd, select.POLLIN)
    return {by_fd[fd] for fd, _ in poller.poll(0) if fd in by_fd}


class _Guarded(asyncio.Protocol):
    """aiohttp's protocol for one connection, behind the timers and the per-IP cap."""

    def __init__(self, owner: Connections, inner: asyncio.Protocol) -> None:
        self._owner = owner
        self._inner = inner
        self._transport: asyncio.Transport | None = None
        self.ip = ""
        self._admitted = False  # aiohttp's protocol has the connection
        self._counted = False  # it holds a place under the per-IP cap
        self._state = _HEADERS
        self._timer: asyncio.TimerHandle | None = None
        self._head_started = False  # a byte other than CR/LF arrived for this request
        self._head_tail = b""  # the last bytes of the head so far (its end may straddle)

    # ---------------------------------------------------------------- transport events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one.
        transport = cast(asyncio.Transport, transport)
        self._transport = transport
        peer = transport.get_extra_info("peername")
        self.ip = str(peer[0]) if isinstance(peer, tuple) and peer else "unknown"
        if not self._owner.admit(self, transport):
            self._refuse(transport)
            return
        self._admitted = self._counted = True
        self._owner.waiting(self, _HEADERS)
        self._arm(self._owner.limits.header_timeout)
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if not self._counted:
            return  # refused or shed: its bytes are read and dropped
        if self._state == _IDLE:
            self._state = _HEADERS
            self._head_started, self._head_tail = False, b""
            self._owner.waiting(self, _HEADERS)
            self._arm(self._owner.limits.header_timeout)
        if self._state == _HEADERS and self._head_complete(data):
            # A whole head: aiohttp dispatches it, so the connection is no longer one
            # to shed (the header timer stays until `begin`: a head aiohttp refuses
            # is answered and closed by aiohttp itself).
            self._state = _ARRIVED
            self._owner.waiting(self, None)
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        if not self._admitted or not self._counted:
            return None  # close
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        if self._counted:
            self._counted = False
            self._owner.release(self, self._transport)
        if self._admitted:
            self._admitted = False
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._admitted:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._admitted:
            self._inner.resume_writing()

    # ---------------------------------------------------------------- request events

    def busy(self) -> None:
        self._state = _BUSY
        self._owner.waiting(self, None)
        self._cancel()

    def idle(self) -> None:
        self._state = _IDLE
        self._owner.waiting(self, _IDLE)
        self._arm(self._owner.limits.idle_timeout)

    # ---------------------------------------------------------------- making room

    def fileno(self) -> int:
        """The socket's descriptor, or -1 when it is gone."""
        transport = self._transport
        sock = None if transport is None else transport.get_extra_info("socket")
        try:
            return -1 if sock is None else int(sock.fileno())
        except OSError:
            return -1

    def flushed(self) -> bool:
        """Nothing of an answer is still waiting to be sent."""
        transport = self._transport
        return transport is not None and transport.get_write_buffer_size() == 0

    def shed(self) -> None:
        """Closed to make room for a newer connection from the same IP: its place is
        given back now; aiohttp's protocol still learns of the close (connection_lost)."""
        transport = self._transport
        self._cancel()
        self._counted = False
        self._owner.release(self, transport)
        if transport is None or transport.is_closing():
            return
        self._owner.closed("per_ip_shed")
        if self._state == _HEADERS:
            cap = self._owner.limits.max_per_ip
            _log.debug("closing a connection from %s without a request head: %d open", self.ip, cap)
            transport.write(
                _raw_answer(
                    503,
                    "Service Unavailable",
                    f"closed to make room: {self.ip} opened more than {cap} connections "
                    "(http.max_connections_per_ip) and this one had not sent a whole request "
                    "head; send requests at once, or retry shortly",
                    {"Retry-After": str(_REFUSED_RETRY_AFTER)},
                )
            )
        transport.close()

    # ---------------------------------------------------------------- timers

    def _arm(self, seconds: float) -> None:
        self._cancel()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(seconds, self._expired)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if self._state in (_HEADERS, _ARRIVED):
            limit = self._owner.limits.header_timeout
            self._owner.closed("header_timeout")
            _log.debug("closing a connection from %s: no complete request headers", self.ip)
            transport.write(
                _raw_answer(
                    408,
                    "Request Timeout",
                    f"the request line and headers did not arrive within {limit:g} s "
                    "(http.header_timeout); send them at once",
                    {},
                )
            )
            transport.close()
        elif self._state == _IDLE:
            self._owner.closed("idle_timeout")
            transport.close()

    # ---------------------------------------------------------------- helpers

    def _head_complete(self, data: bytes) -> bool:
        """Whether the request's head is now whole: its blank line arrived after a
        byte other than CR/LF (blank lines before a request line are no request)."""
        if not self._head_started:
            data = data.lstrip(b"\r\n")
            if not data:
                return False
            self._head_started = True
        if _HEAD_END in data or _HEAD_END in self._head_tail + data[:3]:
            return True
        self._head_tail = (self._head_tail + data[-3:])[-3:]
        return False

    def _refuse(self, transport: asyncio.Transport) -> None:
        cap = self._owner.limits.max_per_ip
        self._owner.closed("per_ip_limit")
        _log.debug("refusing a connection from %s: %d open already", self.ip, cap)
        transport.write(
            _raw_answer(
                503,
                "Service Unavailable",
                f"too many connections from {self.ip}: {cap} are open already, all in use "
                "(http.max_connections_per_ip); reuse connections or retry shortly",
                {"Retry-After": str(_REFUSED_RETRY_AFTER)},
            )
        )
        if transport.can_write_eof():
            transport.write_eof()
        # Closed once the client hangs up (eof_received) or after the linger.
        asyncio.get_running_loop().call_later(_LINGER, transport.close)
