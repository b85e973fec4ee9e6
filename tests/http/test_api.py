"""The HTTP contract over real sockets: a real service, SQLite catalog, spool and Iceberg tables."""

from __future__ import annotations

import asyncio
import datetime as dt
import decimal
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

import aiohttp
import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pyiceberg.catalog import load_catalog
from yarl import URL

from icespool.config import Config
from icespool.lifecycle.service import Icespool

# The fixtures of the same names in conftest.py.
MakeConfig = Callable[..., Config]
RunDaemon = Callable[..., AbstractAsyncContextManager[tuple[Icespool, str]]]

NDJSON = "application/x-ndjson"
ARROW = "application/vnd.apache.arrow.stream"
DEMO = "demo.events"
TYPED = "lab.typed"
UTC = dt.UTC

TYPED_TABLE = {
    "name": TYPED,
    "create": True,
    "schema": [
        {"name": "id", "type": "long", "required": True},
        {"name": "n", "type": "int"},
        {"name": "ok", "type": "boolean"},
        {"name": "score", "type": "double"},
        {"name": "amount", "type": "decimal(10,2)"},
        {"name": "day", "type": "date"},
        {"name": "local", "type": "timestamp"},
        {"name": "ts", "type": "timestamptz"},
        {"name": "name", "type": "string", "required": True},
    ],
    "partition_by": ["day(ts)"],
}
DEMO_TABLE = {
    "name": DEMO,
    "create": True,
    "schema": [
        {"name": "event_id", "type": "long", "required": True},
        {"name": "ts", "type": "timestamptz"},
        {"name": "kind", "type": "string"},
    ],
}


class Reply:
    def __init__(self, status: int, body: bytes, headers: Mapping[str, str]) -> None:
        self.status = status
        self.body = body
        self.headers = headers

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def error(self) -> str:
        payload = self.json
        assert set(payload) == {"error"}, payload
        message = payload["error"]
        assert isinstance(message, str)
        return message


class Client:
    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self.session = session
        self.base = base

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str | None = NDJSON,
        headers: Mapping[str, str] | None = None,
    ) -> Reply:
        all_headers = dict(headers or {})
        if content_type is not None and body is not None:
            all_headers["Content-Type"] = content_type
        # encoded=True: send the path exactly as written (%2F, %00, .. stay as they are).
        url = URL(self.base + path, encoded=True)
        async with self.session.request(method, url, data=body, headers=all_headers) as r:
            return Reply(r.status, await r.read(), r.headers)

    async def ingest(self, table: str, body: Any, **kwargs: Any) -> Reply:
        return await self.request("POST", f"/v1/tables/{table}/records", body, **kwargs)

    async def flush(self, table: str, **kwargs: Any) -> Reply:
        return await self.request("POST", f"/v1/tables/{table}/flush", **kwargs)

    async def get(self, path: str, **kwargs: Any) -> Reply:
        return await self.request("GET", path, **kwargs)


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def ndjson(*records: Mapping[str, Any]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def arrow_stream(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def read_table(config: Config, name: str) -> pa.Table:
    catalog = load_catalog(config.catalog.name, **config.catalog.properties())
    return catalog.load_table(name).scan().to_arrow()


def rows(config: Config, name: str, key: str) -> list[dict[str, Any]]:
    table = read_table(config, name)
    return sorted(table.to_pylist(), key=lambda r: r[key])


def events(ids: range, kind: str = "click") -> bytes:
    return ndjson(*({"event_id": i, "ts": "2024-05-01T12:00:00Z", "kind": kind} for i in ids))


# ------------------------------------------------------------------ ingest -> Iceberg


async def test_ndjson_ingest_reads_back_from_iceberg_with_exact_values_and_types(
    run_daemon: RunDaemon, make_config: MakeConfig, session: aiohttp.ClientSession
) -> None:
    config = make_config(tables=[TYPED_TABLE])
    records = [
        {
            "id": 1,
            "n": 7,
            "ok": True,
            "score": 2.5,
            "amount": "12.34",
            "day": "2024-02-29",
            "local": "2024-05-01T12:00:00.25",
            "ts": "2024-05-01T14:00:00+02:00",
            "name": "first",
        },
        {"id": 2, "amount": 0.5, "ts": "2024-05-02T00:00:00", "name": "zoë"},
        {"id": 3, "n": -2147483648, "ok": False, "score": -0.0, "name": ""},
    ]
    async with run_daemon(config) as (service, base):
        client = Client(session, base)
        reply = await client.ingest(TYPED, ndjson(*records))
        assert (reply.status, reply.json) == (200, {"accepted": 3})
        flushed = await client.flush(TYPED)
        assert flushed.status == 200
        result = flushed.json
        assert result["table"] == TYPED and result["reason"] == "manual"
        assert result["records"] == 3 and result["files"] >= 1
        assert isinstance(result["snapshot_id"], int)
        schema = service.writer(TYPED).arrow_schema

    table = read_table(config, TYPED)
    assert [(f.name, f.type, f.nullable) for f in table.schema] == [
        (f.name, f.type, f.nullable) for f in schema
    ]
    assert table.schema.field("ts").type == pa.timestamp("us", tz="UTC")
    assert table.schema.field("local").type == pa.timestamp("us")
    assert sorted(table.to_pylist(), key=lambda r: r["id"]) == [
        {
            "id": 1,
            "n": 7,
            "ok": True,
            "score": 2.5,
            "amount": decimal.Decimal("12.34"),
            "day": dt.date(2024, 2, 29),
            "local": dt.datetime(2024, 5, 1, 12, 0, 0, 250000),
            "ts": dt.datetime(2024, 5, 1, 12, 0, tzinfo=UTC),
            "name": "first",
        },
        {
            "id": 2,
            "n": None,
            "ok": None,
            "score": None,
            "amount": decimal.Decimal("0.50"),
            "day": None,
            "local": None,
            "ts": dt.datetime(2024, 5, 2, tzinfo=UTC),
            "name": "zoë",
        },
        {
            "id": 3,
            "n": -2147483648,
            "ok": False,
            "score": -0.0,
            "amount": None,
            "day": None,
            "local": None,
            "ts": None,
            "name": "",
        },
    ]
    snapshots = (
        load_catalog(config.catalog.name, **config.catalog.properties())
        .load_table(TYPED)
        .snapshots()
    )
    assert [s.snapshot_id for s in snapshots] == [result["snapshot_id"]]


async def test_arrow_stream_ingest_is_cast_to_the_table_schema(
    daemon: tuple[Icespool, str], session: aiohttp.ClientSession
) -> None:
    service, base = daemon
    client = Client(session, base)
    sent = pa.table(
        {
            # int32 and a naive timestamp: the writer casts both to the table's types
            "event_id": pa.array([10, 11, 12], pa.int32()),
            "ts": pa.array(
                [dt.datetime(2024, 5, 1, 12), None, dt.datetime(2024, 5, 3, 1, 2, 3, 4)],
                pa.timestamp("us"),
            ),
            "kind": ["a", None, "c"],
        }
    )
    reply = await client.ingest(DEMO, arrow_stream(sent), content_type=ARROW)
    assert (reply.status, reply.json) == (200, {"accepted": 3})
    assert (await client.flush(DEMO)).json["records"] == 3
    table = read_table(service.config, DEMO)
    assert table.schema.field("event_id").type == pa.int64()
    assert table.schema.field("ts").type == pa.timestamp("us", tz="UTC")
    assert sorted(table.to_pylist(), key=lambda r: r["event_id"]) == [
        {"event_id": 10, "ts": dt.datetime(2024, 5, 1, 12, tzinfo=UTC), "kind": "a"},
        {"event_id": 11, "ts": None, "kind": None},
        {"event_id": 12, "ts": dt.datetime(2024, 5, 3, 1, 2, 3, 4, tzinfo=UTC), "kind": "c"},
    ]


async def test_flush_with_nothing_pending_has_a_null_snapshot(
    daemon: tuple[Icespool, str], session: aiohttp.ClientSession
) -> None:
    _, base = daemon
    reply = await Client(session, base).flush(DEMO)
    assert reply.status == 200
    assert reply.json == {
        "table": DEMO,
        "snapshot_id": None,
        "records": 0,
        "files": 0,
        "bytes": 0,
        "reason": "manual",
        "duration_ms": 0.0,
        "quarantined": [],
    }


# ------------------------------------------------------------------ bad input


GOOD = {"event_id": 1, "ts": "2024-05-01T12:00:00Z", "kind": "ok"}
BAD_REQUESTS = [
    # (id, table, body, content type, status, fragments of the error message)
    ("malformed-json", DEMO, ndjson(GOOD) + b'{"event_id": 2,\n', NDJSON, 400,
     ["line 2", "invalid JSON"]),
    ("wrong-type", DEMO, ndjson(GOOD, {"event_id": 2, "kind": 5}), NDJSON, 400,
     ["column 'kind'", "expected a string", "got 5", "line 2"]),
    ("timestamp-as-number", DEMO, ndjson({"event_id": 2, "ts": 1714564800}), NDJSON, 400,
     ["column 'ts'", "ISO-8601"]),
    ("missing-required", DEMO, ndjson(GOOD, {"kind": "x"}), NDJSON, 400,
     ["column 'event_id'", "required", "line 2"]),
    ("null-required", DEMO, ndjson({"event_id": None}), NDJSON, 400,
     ["column 'event_id'", "required"]),
    ("unknown-field", DEMO, ndjson(GOOD, {"event_id": 2, "colour": "red"}), NDJSON, 400,
     ["column 'colour'", "not in the table schema", "line 2"]),
    ("top-level-null", DEMO, b"null\n", NDJSON, 400, ["expected a JSON object, got null"]),
    ("empty-body", DEMO, b"", NDJSON, 400, ["no records"]),
    ("blank-body", DEMO, b"\n \n", NDJSON, 400, ["no records"]),
    ("garbage-arrow", DEMO, b"\x00garbage" * 10, ARROW, 400, ["not a valid Arrow IPC stream"]),
    ("arrow-wrong-type", DEMO, arrow_stream(pa.table({"event_id": ["x"]})), ARROW, 400,
     ["column 'event_id'"]),
    ("arrow-unknown-column", DEMO, arrow_stream(pa.table({"event_id": [1], "zz": [1]})), ARROW,
     400, ["column 'zz'", "not in the table schema"]),
    ("wrong-content-type", DEMO, ndjson(GOOD), "text/plain", 415,
     ["'text/plain'", NDJSON, ARROW]),
    # application/json is a JSON array of objects: NDJSON sent as JSON names the fix.
    ("ndjson-as-json", DEMO, ndjson(GOOD, GOOD), "application/json", 400,
     ["expected a JSON array of objects", "got an object", NDJSON]),
    ("unknown-table", "demo.nope", ndjson(GOOD), NDJSON, 404,
     ["'demo.nope'", "not configured", DEMO]),
    ("traversal-encoded", "..%2F..%2Fetc%2Fpasswd", ndjson(GOOD), NDJSON, 404,
     ["'../../etc/passwd'", "not configured"]),
    ("traversal-dotdot", "..", ndjson(GOOD), NDJSON, 404, ["not configured"]),
    ("slash", "demo/events", ndjson(GOOD), NDJSON, 404, ["no such endpoint"]),
    ("nul", "demo.events%00", ndjson(GOOD), NDJSON, 404, ["'demo.events\\x00'"]),
    ("very-long", "x" * 4000, ndjson(GOOD), NDJSON, 404, ["not configured", "..."]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("table", "body", "content_type", "status", "fragments"),
    [case[1:] for case in BAD_REQUESTS],
    ids=[case[0] for case in BAD_REQUESTS],
)
async def test_bad_request_gets_its_status_writes_nothing_and_the_daemon_stays_up(
    daemon: tuple[Icespool, str],
    session: aiohttp.ClientSession,
    table: str,
    body: bytes,
    content_type: str,
    status: int,
    fragments: list[str],
) -> None:
    service, base = daemon
    client = Client(session, base)
    reply = await client.ingest(table, body, content_type=content_type)
    assert reply.status == status, reply.body
    assert reply.headers["Content-Type"].startswith("application/json")
    message = reply.error
    for fragment in fragments:
        assert fragment in message, message
    assert len(message) < 1000
    # Nothing of the refused request was spooled ...
    assert service.writer(DEMO).pending_records == 0
    empty = await client.flush(DEMO)
    assert (empty.status, empty.json["snapshot_id"], empty.json["records"]) == (200, None, 0)
    # ... and the daemon still takes good records; only those reach the table.
    good = await client.ingest(DEMO, events(range(100, 102)))
    assert (good.status, good.json) == (200, {"accepted": 2})
    assert (await client.flush(DEMO)).json["records"] == 2
    assert [r["event_id"] for r in rows(service.config, DEMO, "event_id")] == [100, 101]


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_oversized_body_is_413_before_it_is_buffered(
    run_daemon: RunDaemon, session: aiohttp.ClientSession, chunked: bool
) -> None:
    limit = 64 * 1024
    body = events(range(2000))
    assert len(body) > limit

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 8192):
            yield body[start : start + 8192]

    async with run_daemon(max_body_bytes=limit) as (service, base):
        client = Client(session, base)
        reply = await client.ingest(DEMO, chunks() if chunked else body)
        assert reply.status == 413
        assert "too large" in reply.error and str(limit) in reply.error
        assert service.writer(DEMO).pending_records == 0
        small = await client.ingest(DEMO, events(range(3)))
        assert small.json == {"accepted": 3}
        assert (await client.flush(DEMO)).json["records"] == 3


async def test_slow_body_times_out_with_408(
    run_daemon: RunDaemon, session: aiohttp.ClientSession
) -> None:
    async def trickle() -> AsyncIterator[bytes]:
        yield b'{"event_id": 1}\n'
        await asyncio.sleep(2)
        yield b'{"event_id": 2}\n'

    async with run_daemon(body_timeout=0.3) as (service, base):
        client = Client(session, base)
        reply = await client.ingest(DEMO, trickle())
        assert reply.status == 408 and "did not arrive within 0.3 s" in reply.error
        assert service.writer(DEMO).pending_records == 0
        assert (await client.ingest(DEMO, events(range(1)))).status == 200


async def test_unexpected_error_is_a_generic_500_and_the_daemon_stays_up(
    daemon: tuple[Icespool, str],
    session: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    service, base = daemon
    client = Client(session, base)
    writer = service.table_writer(DEMO)
    healthy_append = writer.append

    async def broken_append(*args: Any, **kwargs: Any) -> int:
        raise RuntimeError("secret internals")

    monkeypatch.setattr(writer, "append", broken_append)  # an injected fault, not a mock
    with caplog.at_level(logging.ERROR, logger="icespool.http"):
        reply = await client.ingest(DEMO, events(range(1)))
    assert reply.status == 500
    assert "internal error" in reply.error and "secret" not in reply.error
    assert any(r.exc_info and "secret internals" in str(r.exc_info[1]) for r in caplog.records)
    monkeypatch.setattr(writer, "append", healthy_append)
    assert (await client.ingest(DEMO, events(range(1)))).json == {"accepted": 1}


async def test_unknown_path_and_method_are_json_errors(
    daemon: tuple[Icespool, str], session: aiohttp.ClientSession
) -> None:
    _, base = daemon
    client = Client(session, base)
    missing = await client.get("/v2/nothing")
    assert missing.status == 404 and "no such endpoint" in missing.error
    wrong = await client.request("DELETE", "/v1/status")
    assert wrong.status == 405 and "GET" in wrong.error and "GET" in wrong.headers["Allow"]


# ------------------------------------------------------------------ auth


async def test_bearer_auth_guards_ingest_flush_and_status_only(
    run_daemon: RunDaemon, session: aiohttp.ClientSession
) -> None:
    token = "s3cr3t-t0ken"
    good = {"Authorization": f"Bearer {token}"}
    async with run_daemon(auth_token=token) as (service, base):
        client = Client(session, base)
        for headers in (
            {},
            {"Authorization": "Bearer wrong"},
            {"Authorization": f"Bearer {token}x"},
            {"Authorization": f"Basic {token}"},
            {"Authorization": token},
        ):
            for reply in (
                await client.ingest(DEMO, events(range(1)), headers=headers),
                await client.flush(DEMO, headers=headers),
                await client.get("/v1/status", headers=headers),
                # auth comes before the table lookup: no probing of table names
                await client.ingest("demo.nope", events(range(1)), headers=headers),
            ):
                assert reply.status == 401, (headers, reply.body)
                assert "token" in reply.error
                assert reply.headers["WWW-Authenticate"].startswith("Bearer")
        assert service.writer(DEMO).pending_records == 0
        for path in ("/healthz", "/readyz", "/metrics"):
            assert (await client.get(path)).status == 200, path
        ok = await client.ingest(DEMO, events(range(2)), headers=good)
        assert (ok.status, ok.json) == (200, {"accepted": 2})
        lower = {"Authorization": f"bearer {token}"}
        assert (await client.get("/v1/status", headers=lower)).status == 200
        flushed = await client.flush(DEMO, headers=good)
        assert flushed.json["records"] == 2


async def test_no_token_configured_means_open_endpoints(
    daemon: tuple[Icespool, str], session: aiohttp.ClientSession
) -> None:
    _, base = daemon
    client = Client(session, base)
    reply = await client.ingest(DEMO, events(range(1)), headers={"Authorization": "Bearer x"})
    assert reply.status == 200
    assert (await client.get("/v1/status")).status == 200


# ------------------------------------------------------------------ probes, status, metrics


async def test_probes_and_status(
    daemon: tuple[Icespool, str], session: aiohttp.ClientSession
) -> None:
    _, base = daemon
    client = Client(session, base)
    assert (await client.get("/healthz")).json == {"status": "ok"}
    assert (await client.get("/readyz")).json == {"status": "ready", "degraded": {}}
    await client.ingest(DEMO, events(range(4)))
    status = (await client.get("/v1/status")).json
    assert status["ready"] is True and status["draining"] is False
    assert status["tables"][DEMO]["pending_records"] == 4
    assert status["spool"]["bytes"] > 0


async def test_draining_daemon_answers_503_with_retry_after(
    daemon: tuple[Icespool, str], session: aiohttp.ClientSession
) -> None:
    service, base = daemon
    client = Client(session, base)
    assert (await client.ingest(DEMO, events(range(3)))).status == 200
    await service.stop()  # drains: commits the 3 records (reason "shutdown")
    refused = await client.ingest(DEMO, events(range(10, 13)))
    assert refused.status == 503 and "shutting down" in refused.error
    assert int(refused.headers["Retry-After"]) >= 1
    assert (await client.flush(DEMO)).status == 503
    assert (await client.get("/readyz")).status == 503
    assert (await client.get("/healthz")).status == 200
    assert [r["event_id"] for r in rows(service.config, DEMO, "event_id")] == [0, 1, 2]


async def test_full_queue_answers_503_with_retry_after_and_writes_nothing_of_it(
    run_daemon: RunDaemon, make_config: MakeConfig, session: aiohttp.ClientSession
) -> None:
    # 10 events spool ~1 KiB, 1000 events ~25 KiB: the second request below does not
    # fit next to the first (the writer refuses it), and after 1000 events the queue is
    # full before a body is even read (the HTTP layer refuses early).
    config = make_config(tables=[{**DEMO_TABLE, "max_queue_bytes": "16KiB"}])
    async with run_daemon(config) as (service, base):
        client = Client(session, base)
        first = await client.ingest(DEMO, events(range(10)))
        assert (first.status, first.json) == (200, {"accepted": 10})
        refused = await client.ingest(DEMO, events(range(10, 1010), kind="refused"))
        assert refused.status == 503, refused.body
        assert refused.headers["Retry-After"] == "1"
        assert "max_queue_bytes" in refused.error
        assert (await client.flush(DEMO)).json["records"] == 10
        # Once the queue has drained, the retried request goes through ...
        retried = await client.ingest(DEMO, events(range(10, 1010), kind="retried"))
        assert retried.json == {"accepted": 1000}
        # ... and fills the queue: the next one is refused before its body is read.
        early = await client.ingest(DEMO, events(range(2000, 2005), kind="refused"))
        assert early.status == 503 and early.headers["Retry-After"] == "1"
        assert "max_queue_bytes" in early.error
        assert (await client.flush(DEMO)).json["records"] == 1000
        refusals = service.metrics.registry.get_sample_value(
            "icespool_backpressure_total", {"table": DEMO, "reason": "queue"}
        )
        assert refusals == 2
    kinds = [(r["event_id"], r["kind"]) for r in rows(config, DEMO, "event_id")]
    assert kinds == [(i, "click") for i in range(10)] + [(i, "retried") for i in range(10, 1010)]


async def test_bodies_in_flight_are_bounded_with_503(
    run_daemon: RunDaemon, session: aiohttp.ClientSession
) -> None:
    body = events(range(1000))  # ~60 KB
    release = asyncio.Event()

    async def held_open() -> AsyncIterator[bytes]:
        yield body[:40_000]
        await release.wait()
        yield body[40_000:]

    async with run_daemon(max_body_bytes=64 * 1024, max_inflight_bytes=80 * 1024) as (
        service,
        base,
    ):
        client = Client(session, base)
        slow = asyncio.create_task(client.ingest(DEMO, held_open()))
        await asyncio.sleep(0.3)  # the server has read the first 40 KB by now
        refused = await client.ingest(DEMO, events(range(5000, 5800)))  # ~48 KB declared
        assert refused.status == 503 and refused.headers["Retry-After"] == "1"
        assert "request bodies" in refused.error
        release.set()
        assert (await slow).json == {"accepted": 1000}
        # The budget is released: the same request now fits.
        assert (await client.ingest(DEMO, events(range(5000, 5800)))).json == {"accepted": 800}
        assert (await client.flush(DEMO)).json["records"] == 1800
    ids = [r["event_id"] for r in rows(service.config, DEMO, "event_id")]
    assert ids == list(range(1000)) + list(range(5000, 5800))


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found


async def test_metrics_after_a_known_workload(
    daemon: tuple[Icespool, str], session: aiohttp.ClientSession
) -> None:
    _, base = daemon
    client = Client(session, base)
    assert (await client.ingest(DEMO, events(range(3)))).status == 200
    assert (await client.ingest(DEMO, events(range(3, 5)))).status == 200
    assert (await client.ingest(DEMO, b'{"event_id": "x"}\n')).status == 400
    assert (await client.ingest("demo.nope", events(range(1)))).status == 404
    assert (await client.flush(DEMO)).json["records"] == 5
    assert (await client.flush(DEMO)).json["snapshot_id"] is None
    assert (await client.get("/healthz")).status == 200
    assert (await client.get("/v2/nothing")).status == 404

    reply = await client.get("/metrics")
    assert reply.status == 200
    assert reply.headers["Content-Type"].startswith("text/plain; version=")
    found = samples(reply.body.decode())

    def value(name: str, **labels: str) -> float:
        return found.get((name, frozenset(labels.items())), 0.0)

    records = "/v1/tables/{table}/records"
    assert value("icespool_records_acked_total", table=DEMO) == 5
    assert value("icespool_records_committed_total", table=DEMO) == 5
    assert value("icespool_commits_total", table=DEMO, reason="manual") == 1
    assert value("icespool_queue_records", table=DEMO) == 0
    http = {
        labels: v for (name, labels), v in found.items() if name == "icespool_http_requests_total"
    }
    assert http == {
        frozenset({("route", records), ("code", "200")}): 2,
        frozenset({("route", records), ("code", "400")}): 1,
        frozenset({("route", records), ("code", "404")}): 1,
        frozenset({("route", "/v1/tables/{table}/flush"), ("code", "200")}): 2,
        frozenset({("route", "/healthz"), ("code", "200")}): 1,
        frozenset({("route", "unmatched"), ("code", "404")}): 1,
    }
    again = samples((await client.get("/metrics")).body.decode())
    scrape = frozenset({("route", "/metrics"), ("code", "200")})
    assert again[("icespool_http_requests_total", scrape)] == 1
