"""What a hostile pass over the HTTP surface found (issue 15), each now a test: forged
dead letters, bodies declared and never sent, tokens in logs, deep replay requests,
several Authorization headers, token files no client can send."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import aiohttp
import pyarrow as pa
import pytest
from support.fixture_types import MakeConfig, RunDaemon

from icespool.config import validate_config
from icespool.errors import ConfigError, ReadOnlyTableError
from icespool.http import load_tokens
from icespool.lifecycle.service import Icespool

NDJSON = {"Content-Type": "application/x-ndjson"}
DLT = "demo.events_dead_letter"


def _with_dead_letters(make_config: MakeConfig) -> object:
    # The broker is never reached (port 1 refuses): the dead-letter table is created at
    # start all the same, and HTTP serves while the source retries.
    return make_config(
        kafka=[
            {
                "bootstrap_servers": "127.0.0.1:1",
                "topics": ["events"],
                "group_id": "g",
                "table": "demo.events",
            }
        ]
    )


async def test_records_cannot_be_forged_into_a_dead_letter_table(
    make_config: MakeConfig, run_daemon: RunDaemon
) -> None:
    # A forged dead letter at a real record's offset made a later replay count that
    # record as already present and delete it: data loss.
    config = _with_dead_letters(make_config)
    forged = {
        "topic": "events",
        "partition": 0,
        "offset": 5,
        "reason": "invalid",
        "error": "forged",
        "dead_lettered_at": "2026-01-01T00:00:00Z",
    }
    async with run_daemon(config) as (service, url), aiohttp.ClientSession() as http:
        post = f"{url}/v1/tables/{DLT}/records"
        async with http.post(post, data=json.dumps(forged) + "\n", headers=NDJSON) as r:
            assert r.status == 403
            assert "dead-letter table" in (await r.json())["error"]
        with pytest.raises(ReadOnlyTableError, match="only its source writes it"):
            await service.writer(DLT).append(pa.table({"topic": ["events"]}))
        assert service.table_writer(DLT).pending_records == 0
        # The source's own table is writable as ever.
        body = json.dumps({"event_id": 1}) + "\n"
        async with http.post(
            f"{url}/v1/tables/demo.events/records", data=body, headers=NDJSON
        ) as r:
            assert r.status == 200, await r.text()


async def test_bodies_declared_but_not_sent_do_not_block_other_clients(
    make_config: MakeConfig, run_daemon: RunDaemon
) -> None:
    # Four requests declaring max_body_bytes each and sending nothing used to reserve the
    # whole in-flight budget: every other client got 503 until their body timeout.
    limit = 1 << 20
    async with run_daemon(make_config(), max_body_bytes=limit) as (_, url):
        port = int(url.rsplit(":", 1)[1])
        stalled = []
        for _ in range(6):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                b"POST /v1/tables/demo.events/records HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/x-ndjson\r\n"
                + f"Content-Length: {limit}\r\n\r\n".encode()
            )
            await writer.drain()
            stalled.append(writer)
        await asyncio.sleep(0.3)
        async with aiohttp.ClientSession() as http:
            body = "".join(json.dumps({"event_id": i}) + "\n" for i in range(10))
            post = f"{url}/v1/tables/demo.events/records"
            async with http.post(post, data=body, headers=NDJSON) as r:
                assert r.status == 200, await r.text()
                assert await r.json() == {"accepted": 10}
        for writer in stalled:
            writer.close()


async def test_a_malformed_authorization_header_never_puts_the_token_in_the_log(
    make_config: MakeConfig, run_daemon: RunDaemon, caplog: pytest.LogCaptureFixture
) -> None:
    async with run_daemon(make_config(), auth_token="tok-secret-77") as (_, url):
        port = int(url.rsplit(":", 1)[1])
        with caplog.at_level(logging.DEBUG):
            for header in (b"Bearer tok-secret-77\x00", b"Bearer tok-secret-77" + b"x" * 9000):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"GET /v1/status HTTP/1.1\r\nHost: x\r\nAuthorization: " + header)
                writer.write(b"\r\n\r\n")
                await writer.drain()
                answer = await reader.read(100)
                writer.close()
                assert answer.startswith(b"HTTP/1.") and b" 400 " in answer[:20], answer
    logged = [r for r in caplog.records if r.name.startswith("aiohttp")]
    assert logged, "aiohttp said nothing about the malformed requests"
    for record in logged:
        assert "tok-secret" not in record.getMessage()
        assert record.exc_info is None and record.levelno <= logging.INFO


async def test_several_authorization_headers_are_refused(
    make_config: MakeConfig, run_daemon: RunDaemon
) -> None:
    async with run_daemon(make_config(), auth_token="tok-a") as (_, url):
        port = int(url.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"GET /v1/status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer nope\r\n"
            b"Authorization: Bearer tok-a\r\nConnection: close\r\n\r\n"
        )
        await writer.drain()
        answer = await reader.read()
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), head
    assert json.loads(body) == {"error": "send one Authorization header, not several"}


async def test_a_deeply_nested_replay_request_is_400_not_500(
    make_config: MakeConfig, run_daemon: RunDaemon
) -> None:
    config = _with_dead_letters(make_config)
    async with run_daemon(config) as (_, url), aiohttp.ClientSession() as http:
        for body in ('{"a":' * 5000 + "1" + "}" * 5000, "[" * 100_000):
            async with http.post(f"{url}/v1/tables/{DLT}/replay", data=body) as r:
                assert r.status == 400
                assert (await r.json()) == {"error": "the replay request nests too deeply"}


def test_a_token_file_no_client_can_send_is_refused_by_key(tmp_path: Path) -> None:
    for text in ("line1\nline2\n", "to ken\n", "tok\x00en\n"):
        path = tmp_path / "t.token"
        path.write_text(text)
        config = validate_config(
            {
                "catalog": {"name": "c", "type": "sql", "uri": f"sqlite:///{tmp_path}/c.db"},
                "spool": {"dir": str(tmp_path / "spool")},
                "http": {"tokens": [{"name": "p", "token_file": str(path), "tables": ["*.*"]}]},
            }
        )
        with pytest.raises(ConfigError, match="whitespace or control characters") as info:
            load_tokens(config.http)
        assert info.value.key == "http.tokens[0].token_file"


async def test_the_in_process_api_of_a_plain_table_still_appends(make_config: MakeConfig) -> None:
    async with Icespool(_with_dead_letters(make_config)) as service:  # type: ignore[arg-type]
        assert await service.writer("demo.events").append(pa.table({"event_id": [1, 2]})) == 2
