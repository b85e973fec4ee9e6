"""The HTTP listener's connections: slow headers, idle keep-alives, per-IP caps.

aiohttp handles requests; this layer sits between the listening socket and aiohttp's
protocol (one `_Guarded` protocol per connection wrapping aiohttp's) and bounds what a
client can hold without sending requests:

- ``header_timeout``: once a connection opens, or the first byte of a next request
  arrives, the request line and headers must be complete within it; otherwise the
  client is answered 408 and the connection closed (a client trickling headers byte by
  byte cannot hold it for ever). The TLS handshake has the same bound.
- ``idle_timeout``: a kept-alive connection with no new request for that long is closed.
- ``max_per_ip``: open connections per client IP (0: no cap). A connection that would
  pass the cap is parked: accepted but not read (aiohttp has not seen it), it waits in
  its IP's queue and is admitted, first come first served, when one of the IP's
  connections closes. Behind an ingress or a mesh sidecar every client has one address,
  so connections that hold a place without a request make room for parked ones whose
  request bytes have arrived: the IP's oldest connection still without a whole request
  head (after 0.5 s) is closed (answered 503), else its longest-idle keep-alive. A
  parked connection that waits ``header_timeout``, or finds the queue full
  (``_PARK_PER_CAP`` x the cap per IP; for all IPs together ``_PARK_TOTAL``, at most
  half the open-files limit), is answered 503 with Retry-After and closed. Sockets read
  per IP never pass the cap; sockets held per IP never pass the cap plus its queue.

The request body has its own bound (the ingest route's ``body_timeout``, 408). The
middleware tells `Connections` when a request's headers are complete (`begin`) and
when its answer is ready (`end`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import resource
import select
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, cast

__all__ = ["ConnectionLimits", "Connections"]

_log = logging.getLogger("icespool.http")

# PARKED: accepted, not read, waiting for a place under the cap; HEADERS: no whole
# request head yet; ARRIVED: one arrived, its handler not started; BUSY: a request is
# handled; IDLE: kept alive, waiting for the next request.
_PARKED, _HEADERS, _ARRIVED, _BUSY, _IDLE = "parked", "headers", "arrived", "busy", "idle"
_HEAD_END: Final = b"\r\n\r\n"
# A refused connection is read (and dropped) this long after the answer, so the
# client's request bytes do not turn the close into a reset that hides the answer.
_LINGER: Final = 2.0
_RETRY_AFTER: Final = 1
# A connection is closed to make room only once it has waited this long for a request
# head: a client that just connected may be sending its request now (it is then the
# newcomer that is refused). For a keep-alive it is also time for aiohttp to write the
# answer `end` came before.
_SHED_AFTER: Final = 0.5
# Candidates looked at (oldest first) when making room: bounds the work a new
# connection at the cap costs.
_SHED_SCAN: Final = 32
# Parked connections per IP, as a multiple of the cap, and for all IPs together. A
# parked connection costs a descriptor and its socket's buffers (about 2 KiB of the
# daemon's memory besides), no aiohttp protocol. The total stays at most half the
# open-files limit (the daemon raises it to the hard one at start, icespool.app): spool
# segments and the catalog need descriptors too.
_PARK_PER_CAP: Final = 64
_PARK_TOTAL: Final = 16384
# The least wait before the queue of parked connections looks for room again, while
# the IP's connections that could make room are too young or have bytes unread, or no
# parked one has sent bytes yet (a parked socket is not read: no event says so).
_RETRY_ROOM: Final = 0.02


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """``http.header_timeout``, ``http.idle_timeout``, ``http.max_connections_per_ip``."""

    header_timeout: float = 10.0
    idle_timeout: float = 60.0
    max_per_ip: int = 256


def _park_total() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return _PARK_TOTAL if soft == resource.RLIM_INFINITY else min(_PARK_TOTAL, soft // 2)


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
        # Per IP, first in first out, the connections waiting for a place.
        self._parked: dict[str, dict[_Guarded, None]] = {}
        self._parked_total = 0
        self._park_total = _park_total()
        self._room_timers: dict[str, asyncio.TimerHandle] = {}

    def protocol(self) -> asyncio.Protocol:
        return _Guarded(self, self._inner)

    def open_from(self, ip: str) -> int:
        """Connections ``ip`` holds open and read now (parked ones aside)."""
        return self._per_ip[ip]

    def parked_from(self, ip: str) -> int:
        """Connections of ``ip`` accepted and waiting for a place under the cap."""
        return len(self._parked.get(ip, ()))

    @property
    def parked(self) -> int:
        """Parked connections of every IP."""
        return self._parked_total

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

    def close(self) -> None:
        """Close the parked connections (the listener stops; aiohttp closes the rest)."""
        for timer in self._room_timers.values():
            timer.cancel()
        self._room_timers.clear()
        for queue in list(self._parked.values()):
            for guarded in list(queue):
                self.unpark(guarded)
                guarded.abandon()

    # ---------------------------------------------------------------- for _Guarded

    def arrive(self, guarded: _Guarded) -> None:
        """A new connection: admitted under its IP's cap, else parked (and admitted at
        once if its request bytes are there and a place can be made), else refused
        (the queue is full)."""
        ip = guarded.ip
        if ip not in self._parked and self._has_room(ip):
            self._admit(guarded)
            return
        queue = self._parked.get(ip, {})
        if len(queue) >= _PARK_PER_CAP * self.limits.max_per_ip:
            guarded.refuse(
                f"too many connections from {ip}: {self.limits.max_per_ip} are open already, "
                f"all in use, and {len(queue)} more wait for a place "
                "(http.max_connections_per_ip); reuse connections or retry shortly"
            )
            return
        if self._parked_total >= self._park_total:
            guarded.refuse(
                f"too many connections: {self._parked_total} from clients at their "
                "http.max_connections_per_ip wait for a place already; retry shortly"
            )
            return
        self._parked.setdefault(ip, {})[guarded] = None
        self._parked_total += 1
        guarded.park()
        self._unqueue(ip, make_room=True)

    def unpark(self, guarded: _Guarded) -> None:
        """``guarded`` no longer waits (admitted, refused or gone)."""
        queue = self._parked.get(guarded.ip)
        if queue is not None and queue.pop(guarded, 0) is None:
            self._parked_total -= 1
            if not queue:
                del self._parked[guarded.ip]

    def release(self, guarded: _Guarded, transport: Any, *, admit_next: bool = True) -> None:
        """``guarded`` gives its place back; the IP's first parked connection takes it,
        unless the caller makes room for a parked one itself (``admit_next`` False)."""
        ip = guarded.ip
        self.waiting(guarded, None)
        self._by_transport.pop(transport, None)
        self._per_ip[ip] -= 1
        if self._per_ip[ip] <= 0:
            del self._per_ip[ip]
        if admit_next:
            self._unqueue(ip, make_room=False)

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

    # ---------------------------------------------------------------- places

    def _has_room(self, ip: str) -> bool:
        cap = self.limits.max_per_ip
        return not cap or self._per_ip[ip] < cap

    def _admit(self, guarded: _Guarded) -> None:
        self._per_ip[guarded.ip] += 1
        self._by_transport[guarded.transport] = guarded
        guarded.admit()

    def _unqueue(self, ip: str, *, make_room: bool) -> None:
        """Admit ``ip``'s parked connections, oldest first, while there are places
        (``make_room``: closing connections that hold one without a request)."""
        queue = self._parked.get(ip)
        while queue:
            if self._has_room(ip):
                first = next(iter(queue))
            else:
                victim = self._victim(ip) if make_room else None
                sent = None if victim is None else self._sent_first(queue)
                if victim is None or sent is None:
                    break
                victim.shed()  # gives its place back now, before the socket is gone
                first = sent
            self.unpark(first)
            self._admit(first)
        if queue and ip not in self._room_timers:
            self._look_for_room_later(ip)

    @staticmethod
    def _sent_first(queue: dict[_Guarded, None]) -> _Guarded | None:
        """The oldest parked connection (of the first few) whose request bytes wait: a
        connection is closed to make room for one that sends, never for a silent one."""
        first = list(itertools.islice(queue, _SHED_SCAN))
        sent = _unread(first)
        return next((guarded for guarded in first if guarded in sent or guarded.early), None)

    def _look_for_room_later(self, ip: str) -> None:
        """While connections wait in ``ip``'s queue, look for room again once its
        oldest connection without a request may be closed (or soon, if it may be now):
        a place freed by a close admits one anyway, but connections that send nothing
        close only at a timeout."""
        now = time.monotonic()
        since = [next(iter(q[ip].values())) for q in (self._headless, self._idle) if ip in q]
        if not since:
            return
        delay = max(min(since) + _SHED_AFTER - now, _RETRY_ROOM)

        def again() -> None:
            del self._room_timers[ip]
            self._unqueue(ip, make_room=True)

        self._room_timers[ip] = asyncio.get_running_loop().call_later(delay, again)

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

    def __init__(self, owner: Connections, inner: Callable[[], asyncio.Protocol]) -> None:
        self._owner = owner
        self._make_inner = inner
        self._inner: asyncio.Protocol | None = None  # made once admitted
        self._transport: asyncio.Transport | None = None
        self.ip = ""
        self._counted = False  # it holds a place under the per-IP cap
        self._state = _HEADERS
        self._timer: asyncio.TimerHandle | None = None
        self._head_started = False  # a byte other than CR/LF arrived for this request
        self._head_tail = b""  # the last bytes of the head so far (its end may straddle)
        # What arrived while parked, before pausing took effect: replayed once admitted.
        self._early = bytearray()
        self._early_eof = False

    @property
    def transport(self) -> asyncio.Transport | None:
        return self._transport

    @property
    def early(self) -> bool:
        """Bytes arrived while parked (before pausing took effect)."""
        return bool(self._early)

    # ---------------------------------------------------------------- transport events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one.
        transport = cast(asyncio.Transport, transport)
        self._transport = transport
        peer = transport.get_extra_info("peername")
        self.ip = str(peer[0]) if isinstance(peer, tuple) and peer else "unknown"
        self._owner.arrive(self)

    def data_received(self, data: bytes) -> None:
        if self._state == _PARKED:
            self._early += data
            return
        if not self._counted or self._inner is None:
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
        if self._state == _PARKED:
            self._early_eof = True
            return True  # kept open: it may still be admitted and answered
        if not self._counted or self._inner is None:
            return None  # close
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        if self._state == _PARKED:
            self._owner.unpark(self)
        if self._counted:
            self._counted = False
            self._owner.release(self, self._transport)
        inner, self._inner = self._inner, None
        if inner is not None:
            inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    # ---------------------------------------------------------------- the cap's decisions

    def admit(self) -> None:
        """A place is ours: aiohttp gets the connection (and what arrived while parked)."""
        transport = self._transport
        assert transport is not None
        parked = self._state == _PARKED
        self._cancel()
        self._state = _HEADERS
        self._counted = True
        self._owner.waiting(self, _HEADERS)
        # The header timeout runs from now: while parked nothing was read.
        self._arm(self._owner.limits.header_timeout)
        self._inner = self._make_inner()
        self._inner.connection_made(transport)
        if parked:
            early, self._early = bytes(self._early), bytearray()
            if early:
                self.data_received(early)
            if self._early_eof and not self.eof_received():
                transport.close()
            elif not transport.is_closing():
                transport.resume_reading()

    def park(self) -> None:
        """Wait, unread, for a place: at most ``header_timeout``, then refused."""
        transport = self._transport
        assert transport is not None
        self._state = _PARKED
        transport.pause_reading()
        self._arm(self._owner.limits.header_timeout)

    def refuse(self, message: str) -> None:
        """Answered 503 + Retry-After and closed, before aiohttp sees it."""
        transport = self._transport
        assert transport is not None
        paused = self._state == _PARKED
        self._state = _HEADERS  # not counted: what it sends now is read and dropped
        self._owner.closed("per_ip_limit")
        _log.debug("refusing a connection from %s: %s", self.ip, message)
        transport.write(
            _raw_answer(503, "Service Unavailable", message, {"Retry-After": str(_RETRY_AFTER)})
        )
        if transport.can_write_eof():
            transport.write_eof()
        if paused:
            transport.resume_reading()
        # Closed once the client hangs up (eof_received) or after the linger.
        asyncio.get_running_loop().call_later(_LINGER, transport.close)

    def abandon(self) -> None:
        """Closed unanswered: the listener stops."""
        self._cancel()
        self._state = _HEADERS
        if self._transport is not None:
            self._transport.close()

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
        given back now (to the caller, which admits another); aiohttp's protocol still
        learns of the close (connection_lost)."""
        transport = self._transport
        self._cancel()
        self._counted = False
        self._owner.release(self, transport, admit_next=False)
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
                    {"Retry-After": str(_RETRY_AFTER)},
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
        limit = self._owner.limits.header_timeout
        if self._state == _PARKED:
            self._owner.unpark(self)
            self.refuse(
                f"too many connections from {self.ip}: {self._owner.limits.max_per_ip} are "
                f"open already, all in use, and this one waited {limit:g} s "
                "(http.header_timeout) for a place (http.max_connections_per_ip); reuse "
                "connections or retry shortly"
            )
        elif self._state in (_HEADERS, _ARRIVED):
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
