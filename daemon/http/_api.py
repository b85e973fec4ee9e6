"""The HTTP endpoints of the daemon's contract (docs/http.md), on aiohttp.

    POST /v1/tables/{table}/records   ingest (NDJSON, a JSON array, or Arrow IPC stream)
    POST /v1/tables/{table}/changes   keyed upserts and deletes for an upsert table (same formats)
    POST /v1/tables/{table}/flush     commit now
    POST /v1/tables/{table}/replay    re-ingest a dead-letter table's records (JSON filters)
    GET  /v1/status                   service.status()
    GET  /v1/openapi.json             this API's OpenAPI 3 document (daemon/http/openapi.json)
    GET  /metrics                     Prometheus text
    GET  /healthz, /readyz            liveness, readiness

Ingest is all-or-nothing: a request is decoded whole (off the event loop), handed to
the table's writer in one ``append``, and answered 200 only once that returned, i.e.
once every record is in the spool. Every refusal is JSON ``{"error": "..."}`` with
the status the contract names; cheap checks (auth, table, content type, declared
length) run before a byte of the body is read.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from icespool.config import HttpConfig
from icespool.decode import (
    ARROW_STREAM,
    FORMATS,
    JSON,
    NDJSON,
    count_ndjson_records,
    decode_arrow_stream,
    ndjson_from_array,
)
from icespool.errors import (
    BackpressureError,
    BadInputError,
    IcespoolError,
    ReadOnlyTableError,
    ReplayInProgressError,
    ShuttingDownError,
    UnknownTableError,
)
from icespool.http._auth import ADMIN_TOKEN_NAME, Denied, Token, Tokens, load_tokens
from icespool.http._conn import ConnectionLimits, Connections
from icespool.http._encoding import (
    CorruptEncoding,
    DecodedTooLarge,
    Decoding,
    EncodingError,
    codings,
)
from icespool.http._openapi import openapi_document
from icespool.http._tls import load_certificate
from icespool.http._upstream._site import ListeningSite
from icespool.iceberg import short_error, unavailable
from icespool.kafka import ReplayFilter
from icespool.lifecycle.service import Icespool
from icespool.metrics import CONTENT_TYPE_LATEST
from icespool.schema import SchemaChangeError
from icespool.spool import SpoolIOError
from icespool.write.result import FlushResult
from icespool.write.writer import TableWriter

__all__ = ["ARROW_STREAM", "JSON", "NDJSON", "HttpServer", "start_http"]


_log = logging.getLogger("icespool.http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# Routes that need the Bearer token when one is configured; probes and metrics
# stay open so kubelet and Prometheus need no secret.
_PROTECTED: Final = frozenset({"ingest", "changes", "flush", "replay", "status"})
# Routes that write records to a table: a producer token's table patterns apply.
_WRITES: Final = frozenset({"ingest", "changes"})
# What a non-admin token is told it cannot do, by route.
_ADMIN_ROUTES: Final = {
    "flush": "flush",
    "replay": "replay dead letters",
    "status": "GET /v1/status",
}
_UNMATCHED_ROUTE: Final = "unmatched"  # one label for every unknown path: bounded cardinality
_SHOWN_NAME_CHARS: Final = 120
_STARTING_RETRY_AFTER: Final = 1.0
_DRAINING_RETRY_AFTER: Final = 1.0
_BUSY_RETRY_AFTER: Final = 1.0
_UNAVAILABLE_RETRY_AFTER: Final = 5.0
_FLUSH_POLL: Final = 0.25
# Decoded bytes one step of undoing a Content-Encoding yields (one thread hop each).
_DECODE_STEP: Final = 2**20
# Default budget of request bytes held at once (bodies being read, decoded, appended):
# without it, memory grows with the number of concurrent clients, not with the config.
_INFLIGHT_BODIES: Final = 4


class _Problem(Exception):
    """An answer other than 200: status, message and extra headers."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        headers: Mapping[str, str] | None = None,
        close: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})
        # The body may still be on its way: do not keep the connection for reuse.
        self.close = close


class HttpServer:
    """A listening HTTP server; ``port`` is the bound port (useful with port 0)."""

    def __init__(
        self,
        runner: web.AppRunner,
        port: int,
        api: _Api,
        tls: ssl.SSLContext | None,
        connections: Connections,
    ) -> None:
        self._runner = runner
        self._port = port
        self._api = api
        self._tls = tls
        self.connections = connections
        self._stopped = False

    @property
    def port(self) -> int:
        return self._port

    @property
    def tls(self) -> bool:
        return self._tls is not None

    async def reload(self, http: HttpConfig) -> list[str]:
        """Read the token files and the TLS certificate and key again (SIGHUP) and use
        them for the next requests and handshakes; the listener and open connections
        stay. All or nothing: a `ConfigError` naming the key leaves both as they were.
        Returns what was reloaded, for the log (names only, never a token)."""
        tokens = await asyncio.to_thread(load_tokens, http)
        done = []
        if self._tls is not None and http.tls_cert_file and http.tls_key_file:
            # On the loop: no handshake may start while the context changes.
            load_certificate(self._tls, http.tls_cert_file, http.tls_key_file)
            done.append(f"TLS certificate {http.tls_cert_file}")
        self._api.tokens.replace(tokens)
        done.append(f"tokens {', '.join(t.name for t in tokens) or '(none: API open)'}")
        return done

    async def stop(self) -> None:
        """Stop listening and close connections. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self.connections.close()
        await self._runner.cleanup()


async def start_http(
    service: Icespool,
    host: str,
    port: int,
    *,
    auth_token: str | None = None,
    max_body_bytes: int,
    max_inflight_bytes: int | None = None,
    body_timeout: float = 60.0,
    shutdown_timeout: float = 5.0,
    tokens: Sequence[Token] = (),
    tls: ssl.SSLContext | None = None,
    limits: ConnectionLimits | None = None,
) -> HttpServer:
    """Serve ``service`` on ``host:port`` (0 picks a free port) until ``stop()``.

    ``auth_token``: when set, ingest, flush and status need ``Authorization: Bearer
    <token>`` (an admin token); ``tokens``: named, scoped tokens (`icespool.http._auth`).
    ``max_body_bytes`` bounds a request body (413 beyond it);
    ``max_inflight_bytes`` (default 4 x ``max_body_bytes``) bounds the bodies of all
    ingest requests in progress together (503 + Retry-After beyond it);
    ``body_timeout`` bounds the time to receive a body (408), so slow clients cannot
    hold a request open forever. ``tls``: serve HTTPS with this server context
    (`icespool.http._tls.server_context`). ``limits``: header and idle timeouts and the
    per-IP connection cap (`icespool.http._conn`).
    """
    if auth_token is not None and not auth_token.strip():
        raise ValueError("auth_token must not be empty; pass None to disable auth")
    every = list(tokens)
    if auth_token is not None:
        every.insert(0, Token(ADMIN_TOKEN_NAME, auth_token.strip().encode("utf-8"), admin=True))
    limits = limits or ConnectionLimits()
    inflight = max_inflight_bytes or _INFLIGHT_BODIES * max_body_bytes
    metrics = service.metrics
    api = _Api(service, Tokens(every), max_body_bytes, max(inflight, max_body_bytes), body_timeout)
    # client_max_size guards any path that would call request.read(); ingest reads
    # the body itself with its own limit.
    app = web.Application(client_max_size=max_body_bytes, middlewares=[api.middleware])
    app.router.add_post("/v1/tables/{table}/records", api.ingest, name="ingest")
    app.router.add_post("/v1/tables/{table}/changes", api.changes, name="changes")
    app.router.add_post("/v1/tables/{table}/flush", api.flush, name="flush")
    app.router.add_post("/v1/tables/{table}/replay", api.replay, name="replay")
    app.router.add_get("/v1/status", api.status, name="status")
    app.router.add_get("/v1/openapi.json", api.openapi, name="openapi")
    app.router.add_get("/metrics", api.metrics, name="metrics")
    app.router.add_get("/healthz", api.healthz, name="healthz")
    app.router.add_get("/readyz", api.readyz, name="readyz")
    # access_log=None: no log line per request at info; the middleware logs at debug.
    # aiohttp's own keep-alive timer is left behind ours (icespool.http._conn closes first).
    # auto_decompress=False: Content-Encoding is undone in one place, icespool.http._encoding
    # (aiohttp's parser knows fewer codings, and would answer the others differently).
    runner = web.AppRunner(
        app,
        auto_decompress=False,
        access_log=None,
        handle_signals=False,
        shutdown_timeout=shutdown_timeout,
        keepalive_timeout=limits.idle_timeout + limits.header_timeout,
    )
    # Idempotent (the same filter object), whatever number of servers this process starts.
    logging.getLogger("aiohttp.server").addFilter(_MALFORMED)
    await runner.setup()
    assert runner.server is not None
    connections = Connections(
        limits,
        runner.server,
        lambda reason: metrics.http_connections_closed.labels(reason=reason).inc(),
    )
    api.connections = connections
    metrics.http_connections_parked.set_function(lambda: connections.parked)
    try:
        site = ListeningSite(runner, host, port, tls, connections)
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound = runner.addresses[0][1] if runner.addresses else port
    return HttpServer(runner, int(bound), api, tls, connections)


class _MalformedRequests(logging.Filter):
    """aiohttp logs a request it cannot parse at error level with a traceback that
    quotes the raw bytes, an Authorization header's token among them: keep only what
    kind of request was refused, at info (any client can send these)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            record.msg = "refused a malformed HTTP request (%s, status %s)"
            record.args = (type(exc).__name__, exc.code)
            record.exc_info = None
            record.exc_text = None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


_MALFORMED = _MalformedRequests()


class _Api:
    def __init__(
        self,
        service: Icespool,
        tokens: Tokens,
        max_body_bytes: int,
        max_inflight_bytes: int,
        body_timeout: float,
    ) -> None:
        self._service = service
        self.tokens = tokens
        self.connections: Connections | None = None  # set once the site is built
        self._max_body = max_body_bytes
        self._max_inflight = max_inflight_bytes
        self._inflight = 0  # body bytes held by ingest requests right now
        self._body_timeout = body_timeout

    # ------------------------------------------------------------------ middleware

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        route = request.match_info.route
        resource = route.resource
        label = resource.canonical if resource is not None else _UNMATCHED_ROUTE
        connections = self.connections
        if connections is not None:
            connections.begin(request.transport)
        try:
            if self.tokens.enabled and route.name in _PROTECTED:
                self._authorize(request, route.name)
            response = await handler(request)
        except _Problem as problem:
            response = _error(problem.status, problem.message, problem.headers)
            if problem.close:
                response.force_close()
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            response = _error(exc.status, _describe_http_exception(request, exc), exc.headers)
        except Exception:
            _log.exception("%s %s failed", request.method, label)
            response = _error(500, "internal error; the daemon logged the details")
        if connections is not None:
            connections.end(request.transport)
        metrics = self._service.metrics
        metrics.http_requests.labels(route=label, code=str(response.status)).inc()
        if route.name in _WRITES and response.status == 200:
            # The ack: from the request's start (headers read) to the answer that every
            # record is spooled. 200 only: the table is a configured one (bounded labels).
            elapsed = time.perf_counter() - started
            metrics.http_ack_duration.labels(table=request.match_info["table"]).observe(elapsed)
        if _log.isEnabledFor(logging.DEBUG):
            _log.debug(
                "%s %s -> %d in %.1f ms",
                request.method,
                label,
                response.status,
                (time.perf_counter() - started) * 1000,
            )
        return response

    def _authorize(self, request: web.Request, route: str | None) -> None:
        given = request.headers.getall("Authorization", [])
        if len(given) > 1:
            raise _Problem(400, "send one Authorization header, not several", close=True)
        try:
            token = self.tokens.identify(given[0] if given else "")
            if route in _WRITES:
                self.tokens.check_write(token, request.match_info["table"])
            else:
                self.tokens.check_admin(token, _ADMIN_ROUTES.get(route or "", "this route"))
        except Denied as denied:
            challenge = {"WWW-Authenticate": 'Bearer realm="icespool"'}
            raise _Problem(
                denied.status,
                denied.message,
                headers=challenge if denied.status == 401 else None,
                close=True,  # the body may still be on its way
            ) from None

    # ------------------------------------------------------------------ ingest and admin

    async def ingest(self, request: web.Request) -> web.StreamResponse:
        return await self._take(request, changes=False)

    async def changes(self, request: web.Request) -> web.StreamResponse:
        """Keyed changes (`icespool.cdc`): as ingest, each row with ``_op``."""
        return await self._take(request, changes=True)

    async def _take(self, request: web.Request, *, changes: bool) -> web.StreamResponse:
        name = request.match_info["table"]
        # While the start waits for the catalog, a table of known schema acks anyway.
        early = self._service.accepting_while_waiting(name)
        # Readiness and the table first (404/503 before anything else); an infer = true
        # table is created from the schema of its first body.
        writer = None
        if early is None and not self._service.awaiting_schema(name):
            writer = self._writer(name)
        if request.content_type not in FORMATS:
            raise _Problem(
                415,
                f"unsupported Content-Type {_shown(request.content_type)}; send "
                f"{NDJSON} (one JSON object per line), {JSON} (an array of objects) "
                f"or {ARROW_STREAM}",
                close=True,
            )
        applied = _codings(request)
        held = 0
        body = b""
        try:
            # Spares reading and decoding a body whose table is already full; the
            # writer checks again, exactly, at append time.
            # Refusals that need no body (a dead-letter table, a full queue) come first,
            # on the writer just looked up (no await since: the same state).
            if writer is not None:
                self._service.ingest.admit(writer)
            elif early is None:
                self._service.ingest.check(name)
            body, held = await self._read_body(request, name)
            if applied:
                body, held = await self._decoded(body, held, applied, name)
            accepted = await (early or self._service.ingest).ingest_body(
                name, body, request.content_type, changes=changes
            )
        except ReadOnlyTableError as exc:
            raise _Problem(403, str(exc), close=True) from None
        except BadInputError as exc:
            records = await asyncio.to_thread(_records_in, body, request.content_type)
            rejected = self._service.metrics.records_rejected
            rejected.labels(table=name, reason=_rejection_reason(exc)).inc(records)
            raise _Problem(400, str(exc)) from None
        except BackpressureError as exc:
            raise _Problem(503, str(exc), headers=_retry_after(exc.retry_after)) from None
        except _Problem:
            raise
        except Exception as exc:  # e.g. a schema change the catalog did not answer
            raise _unavailable(exc, f"records for {name} not accepted") from None
        finally:
            self._inflight -= held
        return _json({"accepted": accepted})

    async def flush(self, request: web.Request) -> web.StreamResponse:
        writer = self._writer(request.match_info["table"])
        try:
            result = await self._flushed(writer)
        except ShuttingDownError as exc:
            raise _Problem(503, str(exc), headers=_retry_after(exc.retry_after)) from None
        except Exception as exc:
            what = f"flush of {writer.name} failed"
            retried = "; the spool keeps every record and the daemon retries"
            raise _unavailable(exc, what, retried) from None
        return _json(
            {
                "table": result.table,
                "snapshot_id": result.snapshot_id,
                "records": result.records,
                "files": result.files,
                "bytes": result.bytes,
                "reason": result.reason,
                "duration_ms": result.duration_ms,
                # Segments this flush moved to quarantine (their rows cannot go in).
                "quarantined": list(result.quarantined),
            }
        )

    async def replay(self, request: web.Request) -> web.StreamResponse:
        """Dead-letter replay: 200 with the counts, or 503 with the counts so far and
        the error that stopped it (replaying again is safe)."""
        name = request.match_info["table"]
        self._check_ready()
        applied = _codings(request)
        body = await request.read()  # bounded by client_max_size
        if applied:
            decoding = Decoding(body, applied, self._max_body)
            try:
                body = await asyncio.to_thread(decoding.whole)
            except EncodingError as exc:
                raise _encoding_problem(exc) from None
        try:
            data = json.loads(body) if body.strip() else None
        except (ValueError, RecursionError) as exc:
            what = "nests too deeply" if isinstance(exc, RecursionError) else f"is not JSON: {exc}"
            raise _Problem(400, f"the replay request {what}") from None
        try:
            selection = ReplayFilter.from_json(data)
        except BadInputError as exc:
            raise _Problem(400, str(exc)) from None
        try:
            result = await self._service.replay_dead_letters(name, selection)
        except UnknownTableError as exc:
            raise _Problem(404, str(exc)) from None
        except ReplayInProgressError as exc:
            raise _Problem(409, str(exc)) from None
        except BackpressureError as exc:
            raise _Problem(503, str(exc), headers=_retry_after(exc.retry_after)) from None
        except Exception as exc:
            raise _unavailable(exc, f"replay of {name} failed") from None
        if result.error is not None:
            response = _json(result.as_dict(), 503)
            response.headers["Retry-After"] = str(int(_UNAVAILABLE_RETRY_AFTER))
            return response
        return _json(result.as_dict())

    async def _flushed(self, writer: TableWriter) -> FlushResult:
        """The manual flush's result, or 503 once the catalog is known to be unreachable
        or the flush outlasts one catalog and one storage timeout (it may wait behind a
        background flush stuck in the same outage). The flush itself goes on."""
        timeouts = self._service.config.timeouts
        limit = timeouts.catalog_request + timeouts.storage_request
        flushing = asyncio.ensure_future(writer.flush("manual"))
        deadline = time.monotonic() + limit
        while not flushing.done():
            await asyncio.wait({flushing}, timeout=_FLUSH_POLL)
            problem = self._service.catalog_problem
            if not flushing.done() and (problem or time.monotonic() > deadline):
                flushing.add_done_callback(_retrieve)  # its outcome is logged by the writer
                raise _Problem(
                    503,
                    f"flush of {writer.name} not finished: "
                    f"{problem or f'still running after {limit:g} s'}; it goes on in the "
                    "background and the spool keeps every record",
                    headers=_retry_after(_UNAVAILABLE_RETRY_AFTER),
                )
        return flushing.result()

    async def status(self, request: web.Request) -> web.StreamResponse:
        del request
        # Built on the loop (it reads live state into fresh objects), serialized in a
        # thread: with 10,000 tables the JSON is megabytes.
        body = await asyncio.to_thread(_dumps, self._service.status())
        return web.Response(text=body, content_type="application/json")

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        del request
        self._service.refresh_gauges()
        # Rendering is O(series): ~70 per table, 700,000 lines with 10,000 tables.
        # Rendered in a thread (the client library locks its values) so a scrape
        # never holds the event loop, and with it every ack, for that long.
        body = await asyncio.to_thread(self._service.metrics.exposition)
        return web.Response(
            body=body,
            headers={"Content-Type": CONTENT_TYPE_LATEST},
        )

    async def openapi(self, request: web.Request) -> web.StreamResponse:
        del request
        return web.Response(body=openapi_document(), headers={"Content-Type": "application/json"})

    async def healthz(self, request: web.Request) -> web.StreamResponse:
        del request
        return _json({"status": "ok"})

    async def readyz(self, request: web.Request) -> web.StreamResponse:
        del request
        reason = self._service.not_ready_reason()
        if reason is None:
            # Readiness is the daemon's: it acks records for every table (the spool
            # keeps them) even while some cannot commit, so degraded tables are
            # reported here but do not take the replica out of service.
            return _json({"status": "ready", "degraded": self._service.degraded()})
        raise _Problem(503, f"not ready: {reason}")

    # ------------------------------------------------------------------ helpers

    def _check_ready(self) -> None:
        service = self._service
        if service.draining:
            raise _Problem(
                503,
                "the daemon is shutting down; retry against another replica",
                headers=_retry_after(_DRAINING_RETRY_AFTER),
                close=True,
            )
        if not service.ready:
            # Writers exist during recovery, but new records must not overtake it; while
            # the catalog does not answer, no table can be opened at all.
            wait = service.start_wait
            reason = service.not_ready_reason() or "starting"
            raise _Problem(
                503,
                f"the daemon cannot take requests yet: {reason}; nothing was accepted, "
                "retry after the Retry-After seconds",
                headers=_retry_after(_STARTING_RETRY_AFTER if wait is None else wait.retry_after()),
                close=True,
            )

    def _writer(self, name: str) -> TableWriter:
        self._check_ready()
        try:
            return self._service.table_writer(name)
        except BackpressureError as exc:  # shutting down, or the table is degraded
            raise _Problem(
                503, str(exc), headers=_retry_after(exc.retry_after), close=True
            ) from None
        except UnknownTableError as exc:
            raise self._unknown_table(name, exc) from None

    def _unknown_table(self, name: str, exc: UnknownTableError) -> _Problem:
        service = self._service
        if service.awaiting_schema(name):
            return _Problem(404, str(exc))
        # Table names are only ever looked up, never joined into a path, so a
        # traversal attempt is just another unknown name.
        known = ", ".join(service.table_names) or "(none)"
        return _Problem(
            404,
            f"table {_shown(name)} is not configured on this daemon; tables: {known}",
            close=True,
        )

    async def _read_body(self, request: web.Request, table: str) -> tuple[bytes, int]:
        """The whole body and the in-flight bytes reserved for it (caller releases them)."""
        limit = self._max_body
        declared = request.content_length
        if declared is not None and declared > limit:
            raise _Problem(413, _too_large(f"{declared} bytes are declared", limit), close=True)
        held = 0
        chunks: list[bytes] = []
        size = 0
        try:
            # Bytes are reserved as they arrive, not as declared: a client that declares
            # a large body and sends nothing must not hold the budget of everyone else.
            async with asyncio.timeout(self._body_timeout):
                # Chunked (or lying) clients: count while reading, stop at the limit.
                async for chunk in request.content.iter_any():
                    size += len(chunk)
                    if size > limit:
                        raise _Problem(
                            413, _too_large(f"more than {limit} bytes arrived", limit), close=True
                        )
                    if size > held:
                        held += self._reserve(size - held, table)
                    chunks.append(chunk)
        except TimeoutError:
            self._inflight -= held
            raise _Problem(
                408,
                f"the request body did not arrive within {self._body_timeout:g} s "
                f"({size} bytes received); send it faster or in smaller requests",
                close=True,
            ) from None
        except BaseException:
            self._inflight -= held
            raise
        return (chunks[0] if len(chunks) == 1 else b"".join(chunks)), held

    async def _decoded(
        self, body: bytes, held: int, applied: tuple[str, ...], table: str
    ) -> tuple[bytes, int]:
        """``body`` with its Content-Encoding undone, in bounded steps off the loop, and
        the in-flight bytes reserved for it. The decoded bytes are reserved as they
        appear (a small body may decode to ``max_body_bytes``); the received ones
        (``held``) are released once decoded, or by the caller on an exception."""
        decoding = Decoding(body, applied, self._max_body)
        del body
        pieces: list[bytes] = []
        decoded = 0
        try:
            while piece := await asyncio.to_thread(decoding.read, _DECODE_STEP):
                decoded += self._reserve(len(piece), table)
                pieces.append(piece)
        except EncodingError as exc:
            self._inflight -= decoded
            raise _encoding_problem(exc) from None
        except BaseException:
            self._inflight -= decoded
            raise
        self._inflight -= held
        return (pieces[0] if len(pieces) == 1 else b"".join(pieces)), decoded

    def _reserve(self, extra: int, table: str) -> int:
        # max_inflight >= max_body, so a lone request within max_body_bytes always fits.
        if self._inflight + extra > self._max_inflight:
            self._service.metrics.backpressure.labels(table=table, reason="http_inflight").inc()
            raise _Problem(
                503,
                f"the daemon is already receiving {self._inflight} bytes of request bodies "
                f"(limit {self._max_inflight}); retry shortly",
                headers=_retry_after(_BUSY_RETRY_AFTER),
                close=True,
            )
        self._inflight += extra
        return extra


def _rejection_reason(exc: BadInputError) -> str:
    """The ``reason`` label of a 400: as the Kafka dead letter of the same fault has."""
    return "schema_change" if isinstance(exc, SchemaChangeError) else exc.reason


def _records_in(body: bytes, content_type: str) -> int:
    """Records of a refused body, for ``icespool_records_rejected_total`` (blocking):
    NDJSON's non-blank lines, a JSON array's elements, or a valid Arrow stream's rows;
    at least 1, so a body
    with no readable record (empty, or not an Arrow stream) still counts once."""
    if content_type == NDJSON:
        return max(1, count_ndjson_records(body))
    if content_type == JSON:
        try:
            return max(1, count_ndjson_records(ndjson_from_array(body)))
        except BadInputError:
            return 1
    try:
        return max(1, int(decode_arrow_stream(body).num_rows))
    except BadInputError:
        return 1


def _codings(request: web.Request) -> tuple[str, ...]:
    """The request's Content-Encoding, checked before a byte of the body is read."""
    try:
        return codings(request.headers.getall("Content-Encoding", []))
    except EncodingError as exc:
        raise _encoding_problem(exc) from None


def _encoding_problem(exc: EncodingError) -> _Problem:
    if isinstance(exc, DecodedTooLarge):
        return _Problem(413, _too_large(str(exc), exc.limit))
    status = 400 if isinstance(exc, CorruptEncoding) else 415
    return _Problem(status, str(exc), close=status == 415)


def _too_large(what: str, limit: int) -> str:
    return (
        f"request body too large: {what}, the limit is {limit} bytes (http.max_body_bytes); "
        "split the records over several requests"
    )


def _unavailable(exc: Exception, what: str, then: str = "") -> Exception:
    """503 + Retry-After naming the dependency when ``exc`` is an outage (or one of our
    errors, which say what to do); otherwise ``exc`` itself: a bug, answered 500."""
    dependency = unavailable(exc)
    if dependency is None and not isinstance(exc, IcespoolError | SpoolIOError):
        return exc
    cause = f"{dependency} is unavailable: " if dependency else ""
    return _Problem(
        503,
        f"{what}: {cause}{short_error(exc)}{then}",
        headers=_retry_after(_UNAVAILABLE_RETRY_AFTER),
    )


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _retry_after(seconds: float) -> dict[str, str]:
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


def _shown(text: str) -> str:
    """``text`` quoted and cut short, safe to echo into a response or a log line."""
    shown = repr(text)
    if len(shown) > _SHOWN_NAME_CHARS:
        shown = shown[: _SHOWN_NAME_CHARS - 4] + "...'"
    return shown


def _describe_http_exception(request: web.Request, exc: web.HTTPException) -> str:
    path = _shown(request.path)
    if exc.status == 404:
        return (
            f"no such endpoint: {request.method} {path}; the API is under "
            "/v1/tables/{namespace.table}/records|changes|flush|replay, /v1/status, "
            "/v1/openapi.json, /metrics, /healthz, /readyz"
        )
    if exc.status == 405:
        allowed = exc.headers.get("Allow", "")
        return f"method {request.method} is not allowed on {path}; use {allowed}"
    return f"{exc.reason} ({request.method} {path})"


def _dumps(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"), default=str)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=_dumps)


def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> web.Response:
    response = _json({"error": message}, status)
    for key in ("Retry-After", "WWW-Authenticate", "Allow"):
        if headers and key in headers:
            response.headers[key] = headers[key]
    return response
