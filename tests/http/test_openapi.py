"""The OpenAPI document against ONE real ``icespool run`` child (with tokens, a small body
limit, short header timeout and a per-IP cap, so every documented status can happen):

- the served document is the repository's file, byte for byte, and valid OpenAPI 3;
- schemathesis fuzzes every operation: no 500 anywhere, every answer's status, content
  type, headers and body conform to the document;
- every status documented for the ingest route is driven deliberately and seen.
"""

from __future__ import annotations

import asyncio
import json
import select
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import jsonschema
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance
from support.daemon_harness import Daemon, DaemonDir

from icespool.http import openapi_document

REPO_DOCUMENT = Path(__file__).resolve().parents[2] / "daemon" / "http" / "openapi.json"
ADMIN, PRODUCER = "admin-secret-1", "producer-secret-2"
PER_IP = 12
HEADER_TIMEOUT = 1.0
MAX_BODY = 64 * 1024
RECORDS = "/v1/tables/{table}/records"


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    root = tmp_path_factory.mktemp("openapi")
    (root / "admin.token").write_text(ADMIN)
    (root / "producer.token").write_text(PRODUCER)
    home = DaemonDir(root / "d")
    home.write_config(
        extra=f"""
[[tables]]
name = "u.other"
create = true
schema = [{{ name = "id", type = "long" }}]

[[http.tokens]]
name = "producer"
token_file = "{root / "producer.token"}"
tables = ["t.*"]
"""
    )
    daemon = Daemon(home)
    daemon.start(
        env={
            "ICESPOOL__HTTP__AUTH_TOKEN_FILE": str(root / "admin.token"),
            "ICESPOOL__HTTP__MAX_BODY_BYTES": str(MAX_BODY),
            "ICESPOOL__HTTP__HEADER_TIMEOUT": f"{HEADER_TIMEOUT}s",
            "ICESPOOL__HTTP__MAX_CONNECTIONS_PER_IP": str(PER_IP),
        }
    )
    try:
        asyncio.run(daemon.wait_ready())
        yield daemon
    finally:
        daemon.kill()
        daemon.cleanup()


def _document() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(REPO_DOCUMENT.read_bytes())
    return loaded


async def test_the_served_document_is_the_repository_file_and_valid_openapi(
    running: Daemon,
) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{running.url}/v1/openapi.json") as reply,
    ):
        assert reply.status == 200
        assert reply.headers["Content-Type"] == "application/json"
        served = await reply.read()
    assert served == REPO_DOCUMENT.read_bytes() == openapi_document()
    schema = schemathesis.openapi.from_dict(json.loads(served))
    schema.validate()  # the OpenAPI 3.0 meta-schema
    document = _document()
    assert document["openapi"].startswith("3.")
    # Every route the daemon serves is documented, and nothing else.
    assert set(document["paths"]) == {
        "/v1/tables/{table}/records",
        "/v1/tables/{table}/changes",
        "/v1/tables/{table}/flush",
        "/v1/tables/{table}/replay",
        "/v1/status",
        "/v1/openapi.json",
        "/metrics",
        "/healthz",
        "/readyz",
    }
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                if status.startswith(("4", "5")):
                    if "$ref" in response:
                        name = response["$ref"].rsplit("/", 1)[1]
                        response = document["components"]["responses"][name]
                    body = response["content"]["application/json"]["schema"]
                    error = {"$ref": "#/components/schemas/Error"}
                    if (path, status) == ("/v1/tables/{table}/replay", "503"):
                        # A replay stopped by an error answers with its counts so far.
                        result = {"$ref": "#/components/schemas/ReplayResult"}
                        assert body == {"oneOf": [result, error]}
                        continue
                    assert body == error, (path, method, status)


@pytest.mark.parametrize(
    "mode", [schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE]
)
def test_every_operation_conforms_and_never_fails_with_500(
    running: Daemon, mode: schemathesis.GenerationMode
) -> None:
    schema = schemathesis.openapi.from_url(f"{running.url}/v1/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    # Schemathesis leaves out the operation that serves the document itself.
    assert {o.label for o in operations} == {
        "POST /v1/tables/{table}/records",
        "POST /v1/tables/{table}/changes",
        "POST /v1/tables/{table}/flush",
        "POST /v1/tables/{table}/replay",
        "GET /v1/status",
        "GET /metrics",
        "GET /healthz",
        "GET /readyz",
    }
    statuses: dict[str, set[int]] = {}
    for operation in operations:
        if mode == schemathesis.GenerationMode.NEGATIVE and operation.path != RECORDS:
            continue  # only ingest has a body; any string is a valid table name
        statuses[operation.label] = set()

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=20,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        )
        def fuzz(case: schemathesis.Case) -> None:
            # As an admin (flush and status succeed), a producer (403s) and with no
            # token (401s); probes, metrics and this document take none of them.
            # positive_data_acceptance is left out: a body valid for the document can
            # still miss a column the table requires (the document cannot know the
            # tables), and a 400 naming that column is the right answer.
            tables = [None]
            if case.path_parameters and "table" in case.path_parameters:
                tables.append("t.events")  # a real table: the body is decoded too
            for table in tables:
                if table is not None:
                    case.path_parameters = {**case.path_parameters, "table": table}
                for token in (ADMIN, PRODUCER, None):
                    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
                    response = case.call_and_validate(
                        headers=headers, timeout=30, excluded_checks=[positive_data_acceptance]
                    )
                    statuses[case.operation.label].add(response.status_code)

        fuzz()
    for label, seen in statuses.items():
        assert 500 not in seen, label
    assert {400, 401, 403} <= statuses[f"POST {RECORDS}"]
    if mode == schemathesis.GenerationMode.POSITIVE:
        assert {401, 403, 404} <= statuses["POST /v1/tables/{table}/flush"]
        assert {401, 403, 404} <= statuses["POST /v1/tables/{table}/replay"]
        assert {200, 401, 403} <= statuses["GET /v1/status"]


# ------------------------------------------------------------------ ingest: every status


def _arrow(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client:
        yield client


async def _ingest(
    session: aiohttp.ClientSession,
    daemon: Daemon,
    *,
    table: str = "t.events",
    body: bytes = b'{"id": 1}\n',
    content_type: str = "application/x-ndjson",
    token: str | None = PRODUCER,
) -> tuple[int, dict[str, str], Any]:
    headers = {"Content-Type": content_type}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    async with session.post(
        f"{daemon.url}/v1/tables/{table}/records", data=body, headers=headers
    ) as reply:
        return reply.status, dict(reply.headers), await reply.json()


def _trickled(port: int, head: bytes) -> tuple[int, bytes, float]:
    """Send ``head`` a byte every 50 ms until the server answers; returns the answer's
    status, the whole answer and the seconds until the server closed."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        for byte in head:
            if select.select([sock], [], [], 0.05)[0]:
                break  # the server answered
            sock.sendall(bytes([byte]))
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return int(data.split(b" ", 2)[1]), data, time.monotonic() - started


async def test_every_documented_status_of_the_ingest_route_is_reachable(
    running: Daemon, session: aiohttp.ClientSession
) -> None:
    documented = _document()["paths"]["/v1/tables/{table}/records"]["post"]["responses"]
    error_schema = _document()["components"]["schemas"]["Error"]
    seen: dict[str, dict[str, Any]] = {}

    def saw(status: int, headers: dict[str, str], body: Any) -> None:
        assert str(status) in documented, (status, body)
        if status >= 400:
            jsonschema.validate(body, error_schema)
        seen[str(status)] = {"body": body, "headers": headers}

    saw(*await _ingest(session, running))  # 200, NDJSON
    saw(*await _ingest(session, running, body=b'[{"id": 2}]', content_type="application/json"))
    saw(
        *await _ingest(
            session,
            running,
            body=_arrow(pa.table({"id": pa.array([3], pa.int64())})),
            content_type="application/vnd.apache.arrow.stream",
        )
    )
    assert seen["200"]["body"] == {"accepted": 1}
    saw(*await _ingest(session, running, body=b'{"id": "x"}\n'))
    assert seen["400"]["body"]["error"].startswith("column 'id': expected an integer")
    saw(*await _ingest(session, running, token=None))
    assert seen["401"]["body"] == {"error": "missing 'Authorization: Bearer <token>' header"}
    saw(*await _ingest(session, running, table="u.other"))
    assert seen["403"]["body"]["error"].startswith(
        "token 'producer' may not write to table 'u.other'"
    )
    saw(*await _ingest(session, running, table="t.nope"))
    assert "'t.nope' is not configured" in seen["404"]["body"]["error"]
    saw(*await _ingest(session, running, body=b'{"id": 1}\n' * (MAX_BODY // 9)))
    assert seen["413"]["body"]["error"].startswith("request body too large")
    saw(*await _ingest(session, running, content_type="text/csv"))
    assert seen["415"]["body"]["error"].startswith("unsupported Content-Type 'text/csv'")

    # 408: the headers of an ingest request trickle in slower than http.header_timeout.
    head = (
        b"POST /v1/tables/t.events/records HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/x-ndjson\r\nX-Pad: " + b"p" * 200 + b"\r\n\r\n"
    )
    status, answer, elapsed = await asyncio.to_thread(_trickled, running.port or 0, head)
    body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    saw(status, {}, body)
    assert status == 408 and HEADER_TIMEOUT * 0.9 <= elapsed <= HEADER_TIMEOUT + 2.0

    # 503 + Retry-After: this client IP holds every connection it may, each busy with a
    # request whose body has not come (idle or silent ones would make room instead).
    held = [await asyncio.open_connection("127.0.0.1", running.port) for _ in range(PER_IP)]
    try:
        for _, writer in held:
            writer.write(
                b"POST /v1/tables/t.events/records HTTP/1.1\r\nHost: x\r\n"
                b"Authorization: Bearer " + PRODUCER.encode() + b"\r\n"
                b"Content-Type: application/x-ndjson\r\nContent-Length: 10\r\n\r\n"
            )
        await asyncio.sleep(0.7)  # past the time a silent connection is left to send
        # A new connection (the session may hold an admitted one).
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as fresh:
            status, headers, body = await _ingest(fresh, running)
        saw(status, headers, body)
        assert status == 503 and headers["Retry-After"] == "1"
        assert body["error"].startswith("too many connections from 127.0.0.1")
    finally:
        for _, writer in held:
            writer.close()
    assert set(seen) == set(documented), sorted(seen)
    # The daemon is still serving.
    await asyncio.sleep(0.5)
    assert (await _ingest(session, running))[0] == 200
