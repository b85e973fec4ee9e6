"""The HTTP listener's connections: slow headers, idle keep-alives, per-IP caps.

aiohttp handles requests; this layer sits between the listening socket and aiohttp's
protocol (one `_Guarded` protocol per connection wrapping aiohttp's) and bounds what a
client can hold without sending requests:

- ``header_timeout``: once a connection opens, or the first byte of a next request
  arrives, the request line and headers must be complete within it; otherwise the
  client is answered 408 and the connection closed (a client trickling headers byte by
  byte cannot hold it for ever). The TLS handshake has the same bound.
- ``idle_timeout``: a kept-alive connection with no new request for that long is closed.
- ``max_per_ip``: open connections per client IP; one more is answered 503 with
  Retry-After and closed, before aiohttp sees it (0: no cap).

The request body has its own bound (the ingest route's ``body_timeout``, 408). The
middleware tells `Connections` when a request's headers are complete (`begin`) and
when its answer is ready (`end`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, cast

__all__ = ["ConnectionLimits", "Connections"]

_log = logging.getLogger("icespool.http")

_HEADERS, _BUSY, _IDLE = "headers", "busy", "idle"
# A refused connection is read (and dropped) this long after the answer, so the
# client's request bytes do not turn the close into a reset that hides the answer.
_LINGER: Final = 2.0
_REFUSED_RETRY_AFTER: Final = 1


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

    def admit(self, ip: str, guarded: _Guarded, transport: Any) -> bool:
        cap = self.limits.max_per_ip
        if cap and self._per_ip[ip] >= cap:
            return False
        self._per_ip[ip] += 1
        self._by_transport[transport] = guarded
        return True

    def release(self, ip: str, transport: Any) -> None:
        self._by_transport.pop(transport, None)
        self._per_ip[ip] -= 1
        if self._per_ip[ip] <= 0:
            del self._per_ip[ip]

    def closed(self, reason: str) -> None:
        self._on_close(reason)


class _Guarded(asyncio.Protocol):
    """aiohttp's protocol for one connection, behind the timers and the per-IP cap."""

    def __init__(self, owner: Connections, inner: asyncio.Protocol) -> None:
        self._owner = owner
        self._inner = inner
        self._transport: asyncio.Transport | None = None
        self._ip = ""
        self._admitted = False
        self._state = _HEADERS
        self._timer: asyncio.TimerHandle | None = None

    # ---------------------------------------------------------------- transport events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one.
        transport = cast(asyncio.Transport, transport)
        self._transport = transport
        peer = transport.get_extra_info("peername")
        self._ip = str(peer[0]) if isinstance(peer, tuple) and peer else "unknown"
        if not self._owner.admit(self._ip, self, transport):
            self._refuse(transport)
            return
        self._admitted = True
        self._arm(self._owner.limits.header_timeout)
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if not self._admitted:
            return  # a refused connection: its request is read and dropped
        if self._state == _IDLE:
            self._state = _HEADERS
            self._arm(self._owner.limits.header_timeout)
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        if not self._admitted:
            return None  # close
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        if not self._admitted:
            return
        self._admitted = False
        self._owner.release(self._ip, self._transport)
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
        self._cancel()

    def idle(self) -> None:
        self._state = _IDLE
        self._arm(self._owner.limits.idle_timeout)

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
        if self._state == _HEADERS:
            limit = self._owner.limits.header_timeout
            self._owner.closed("header_timeout")
            _log.debug("closing a connection from %s: no complete request headers", self._ip)
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

    def _refuse(self, transport: asyncio.Transport) -> None:
        cap = self._owner.limits.max_per_ip
        self._owner.closed("per_ip_limit")
        _log.debug("refusing a connection from %s: %d open already", self._ip, cap)
        transport.write(
            _raw_answer(
                503,
                "Service Unavailable",
                f"too many connections from {self._ip}: {cap} are open already "
                "(http.max_connections_per_ip); reuse connections or retry shortly",
                {"Retry-After": str(_REFUSED_RETRY_AFTER)},
            )
        )
        if transport.can_write_eof():
            transport.write_eof()
        # Closed once the client hangs up (eof_received) or after the linger.
        asyncio.get_running_loop().call_later(_LINGER, transport.close)
