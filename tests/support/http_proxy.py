"""A loopback HTTP reverse proxy that records every request and injects faults per request.

    with HttpProxy(("127.0.0.1", 8333)) as proxy:          # listens on proxy.url
        proxy.fail(commit_request, "forward_then_502")      # next matching request only
        proxy.mode = "down"                                 # every request is reset

Where ``support.proxy.TcpProxy`` sees bytes, this one sees requests: it can let a REST
commit reach the catalog and then lose the answer (the catalog applied it, the client
cannot know), count S3 ``UploadPart`` requests of a multipart upload, or cut a connection
in the middle of an upload's body.

Faults for one request (``fail``; the first matching rule is used up):
- ``forward_then_502``: forwarded, the answer replaced by ``502 Bad Gateway``.
- ``forward_then_drop``: forwarded, then the connection is closed without an answer.
- ``reset_mid_body``: half the request body is read, then the connection is reset; nothing
  reaches the upstream.
- ``503``: answered ``503 Service Unavailable`` (S3 ``SlowDown``) without forwarding.
- ``200_html``: answered ``200 OK`` with an HTML page without forwarding (a gateway's
  login page after a redirect; nothing reached the upstream).
Modes (all requests, switch any time):
- ``forward``; ``down``: every request's connection is reset (the store is unreachable);
  ``stall``: requests are read and never answered until the mode changes (then dropped).
``delay`` (seconds, any time): every forwarded request waits that long first (latency).

The request line and headers go upstream as they came (``Host`` included): S3 and the
catalog verify SigV4 signatures over them. Threads, not asyncio, like TcpProxy.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal
from urllib.parse import parse_qs, urlsplit

__all__ = ["Fault", "HttpProxy", "Mode", "Seen"]

Fault = Literal["forward_then_502", "forward_then_drop", "reset_mid_body", "503", "200_html"]
Mode = Literal["forward", "down", "stall"]
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "te", "upgrade"})


@dataclass(frozen=True)
class Seen:
    """One request as the proxy received it, and what became of it."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # lower-case names
    body_bytes: int
    status: int | None  # what the client got (None: no answer)
    fault: str | None
    seconds: float = 0.0  # from the request's headers read to its answer sent

    @property
    def upload_part(self) -> bool:
        """An S3 multipart ``UploadPart``."""
        return self.method == "PUT" and "partNumber" in self.query and "uploadId" in self.query


@dataclass
class _Rule:
    match: Callable[[Seen], bool]
    fault: Fault
    left: int


@dataclass
class _State:
    mode: Mode = "forward"
    rules: list[_Rule] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class HttpProxy:
    def __init__(self, upstream: tuple[str, int], *, upstream_timeout: float = 120.0) -> None:
        self.upstream = upstream
        self.upstream_timeout = upstream_timeout
        self.delay = 0.0
        self._state = _State()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> HttpProxy:
        proxy = self

        class Handler(_Handler):
            owner = proxy

        server = _Server(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    @property
    def port(self) -> int:
        assert self._server is not None, "use the proxy as a context manager"
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ------------------------------------------------------------------ control

    @property
    def mode(self) -> Mode:
        return self._state.mode

    @mode.setter
    def mode(self, mode: Mode) -> None:
        self._state.mode = mode

    def fail(self, match: Callable[[Seen], bool], fault: Fault, times: int = 1) -> None:
        """The next ``times`` requests ``match`` accepts get ``fault``."""
        with self._state.lock:
            self._state.rules.append(_Rule(match, fault, times))

    def pending_faults(self) -> int:
        with self._state.lock:
            return sum(rule.left for rule in self._state.rules)

    def seen(self, match: Callable[[Seen], bool] | None = None) -> list[Seen]:
        with self._state.lock:
            return [s for s in self._state.seen if match is None or match(s)]

    def clear(self) -> None:
        with self._state.lock:
            self._state.seen.clear()

    # ------------------------------------------------------------------ used by the handler

    def _take_fault(self, request: Seen) -> Fault | None:
        with self._state.lock:
            for rule in self._state.rules:
                if rule.left > 0 and rule.match(request):
                    rule.left -= 1
                    return rule.fault
        return None

    def _record(self, request: Seen) -> None:
        with self._state.lock:
            self._state.seen.append(request)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a connection the proxy reset on purpose, or a client that went away


class _Handler(BaseHTTPRequestHandler):
    owner: HttpProxy
    protocol_version = "HTTP/1.1"  # keep-alive, and "100 Continue" for Expect
    _upstream: http.client.HTTPConnection | None = None
    _began = 0.0

    def log_message(self, format: str, *args: object) -> None:
        pass  # the test reads proxy.seen(); stderr noise helps nobody

    def finish(self) -> None:
        if self._upstream is not None:
            self._upstream.close()
        with contextlib.suppress(OSError):
            super().finish()

    def do_GET(self) -> None:
        self._proxy()

    do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = do_GET

    def _proxy(self) -> None:
        self._began = time.perf_counter()
        owner = self.owner
        parts = urlsplit(self.path)
        headers = {k.lower(): v for k, v in self.headers.items()}
        length = int(headers.get("content-length", "0") or 0)
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        probe = Seen(self.command, parts.path, parse_qs(parts.query), headers, length, None, None)
        if owner.mode == "down":
            self._record(probe, None, "down")
            self._reset()
            return
        fault = owner._take_fault(probe)
        if fault == "reset_mid_body":
            if length:
                self.rfile.read(max(1, length // 2))
            self._record(probe, None, fault)
            self._reset()
            return
        body = self._read_chunked_raw() if chunked else self.rfile.read(length)
        probe = Seen(self.command, parts.path, probe.query, headers, len(body), None, fault)
        if owner.mode == "stall":
            while owner.mode == "stall":
                time.sleep(0.05)
            self._record(probe, None, "stall")
            self.close_connection = True
            return
        if fault == "503":
            self._answer(503, b"<Error><Code>SlowDown</Code></Error>", {})
            self._record(probe, 503, fault)
            return
        if fault == "200_html":
            page = b"<html><body>Sign in to continue</body></html>"
            self._answer(200, page, [("Content-Type", "text/html")])
            self._record(probe, 200, fault)
            return
        if owner.delay:
            time.sleep(owner.delay)
        try:
            status, reason, answer_headers, answer = self._forward(body, headers)
        except OSError:
            self._record(probe, None, "upstream failed")
            self._reset()
            return
        if fault == "forward_then_502":
            self._answer(502, b"bad gateway (test proxy)", {})
            self._record(probe, 502, fault)
            return
        if fault == "forward_then_drop":
            self._record(probe, None, fault)
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        self._answer(status, answer, answer_headers, reason)
        self._record(probe, status, None)

    # ------------------------------------------------------------------ helpers

    def _read_chunked_raw(self) -> bytes:
        """The chunked body with its framing, to send on as it came (aws-chunked bodies
        are signed chunk by chunk)."""
        raw = bytearray()
        while True:
            line = self.rfile.readline()
            raw += line
            size = int(line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while True:  # trailers, then the empty line
                    trailer = self.rfile.readline()
                    raw += trailer
                    if trailer in (b"\r\n", b"\n", b""):
                        return bytes(raw)
            raw += self.rfile.read(size)
            raw += self.rfile.readline()

    def _forward(
        self, body: bytes, headers: dict[str, str]
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        for attempt in (1, 2):
            connection = self._upstream
            if connection is None:
                connection = http.client.HTTPConnection(
                    *self.owner.upstream, timeout=self.owner.upstream_timeout
                )
                self._upstream = connection
            try:
                connection.putrequest(
                    self.command, self.path, skip_host=True, skip_accept_encoding=True
                )
                for name, value in self.headers.items():
                    if name.lower() not in _HOP_BY_HOP:
                        connection.putheader(name, value)
                connection.endheaders()
                if body:
                    connection.send(body)
                response = connection.getresponse()
                answer = response.read() if self.command != "HEAD" else b""
                kept = [
                    (k, v)
                    for k, v in response.getheaders()
                    if k.lower() not in _HOP_BY_HOP and k.lower() != "transfer-encoding"
                ]
                return response.status, response.reason, kept, answer
            except (OSError, http.client.HTTPException):
                # A kept-alive upstream connection the server closed meanwhile: once more.
                connection.close()
                self._upstream = None
                if attempt == 2:
                    raise OSError("upstream failed") from None
        raise AssertionError("unreachable")

    def _answer(self, status: int, body: bytes, headers: object, reason: str | None = None) -> None:
        self.send_response(status, reason)
        sent_length = False
        for name, value in headers if isinstance(headers, list) else []:
            if name.lower() == "content-length":
                sent_length = True
                if self.command == "HEAD":
                    self.send_header(name, value)
                    continue
                value = str(len(body))
            self.send_header(name, value)
        if not sent_length and self.command != "HEAD":
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)

    def _record(self, probe: Seen, status: int | None, fault: str | None) -> None:
        took = time.perf_counter() - self._began
        self.owner._record(
            Seen(
                probe.method,
                probe.path,
                probe.query,
                probe.headers,
                probe.body_bytes,
                status,
                fault,
                took,
            )
        )

    def _reset(self) -> None:
        """Close with RST: the client sees 'connection reset by peer'."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        with contextlib.suppress(OSError):
            self.connection.close()
