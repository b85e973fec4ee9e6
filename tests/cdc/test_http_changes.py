"""HTTP for upsert tables: ``POST /v1/tables/{t}/changes`` (NDJSON, JSON array, Arrow
stream; rows with ``"_op": "upsert" | "delete"``) and ``/records`` as upserts, against a
real daemon (service + HTTP) on a real SQLite catalog. The merged state is read back
file by file with the deletes applied (`support.cdc_stream.merged_rows`); every refusal
is a 400 (413, 503) naming the problem, and writes nothing of its body."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from pyiceberg.catalog import load_catalog
from support.cdc_stream import merged_rows
from support.fixture_types import MakeConfig, RunDaemon

from icespool.config import Config

ITEMS = "c.items"
PLAIN = "c.plain"
INFERRED = "c.inferred"
NDJSON = "application/x-ndjson"
JSON = "application/json"
ARROW = "application/vnd.apache.arrow.stream"
COLUMNS = ("id", "name", "qty")
ITEMS_TABLE = {
    "name": ITEMS,
    "create": True,
    "key": ["id"],
    "schema": [
        {"name": "id", "type": "long", "required": True},
        {"name": "name", "type": "string"},
        {"name": "qty", "type": "long", "required": True},
    ],
}
PLAIN_TABLE = {
    "name": PLAIN,
    "create": True,
    "schema": [{"name": "id", "type": "long", "required": True}],
}


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def _ndjson(*records: Mapping[str, Any]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def _arrow(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


async def _post(
    session: aiohttp.ClientSession,
    base: str,
    route: str,
    body: bytes,
    content_type: str = NDJSON,
    table: str = ITEMS,
) -> tuple[int, Any]:
    async with session.post(
        f"{base}/v1/tables/{table}/{route}", data=body, headers={"Content-Type": content_type}
    ) as reply:
        return reply.status, await reply.json()


async def _flush(session: aiohttp.ClientSession, base: str) -> dict[str, Any]:
    async with session.post(f"{base}/v1/tables/{ITEMS}/flush") as reply:
        assert reply.status == 200, await reply.text()
        result: dict[str, Any] = await reply.json()
        return result


def _state(config: Config) -> dict[int, tuple[Any, ...]]:
    catalog = load_catalog(config.catalog.name, **config.catalog.properties())
    try:
        got = merged_rows(catalog.load_table(ITEMS), COLUMNS)
    finally:
        catalog.engine.dispose()
    by_key = {row[0]: row for row in got}
    assert len(by_key) == len(got), f"a key twice: {sorted(got)}"
    return by_key


def _config(make_config: MakeConfig, **table: Any) -> Config:
    config: Config = make_config(
        tables=[
            {**ITEMS_TABLE, **table},
            PLAIN_TABLE,
            {"name": INFERRED, "create": True, "infer": True},
        ],
        defaults={"batch_timeout": "60s"},
    )
    return config


async def test_changes_in_every_format_merge_to_the_last_change_per_key(
    run_daemon: RunDaemon, make_config: MakeConfig, session: aiohttp.ClientSession
) -> None:
    config = _config(make_config)
    async with run_daemon(config) as (service, base):
        # One body: upserts, an update of a key of the same body, a delete, a delete then
        # re-insert of one key, and a delete of a key that never existed.
        first = _ndjson(
            {"id": 1, "name": "a", "qty": 1, "_op": "upsert"},
            {"id": 2, "name": "b", "qty": 2, "_op": "upsert"},
            {"id": 3, "name": "c", "qty": 3, "_op": "upsert"},
            {"id": 1, "name": "a2", "qty": 10, "_op": "upsert"},
            {"id": 2, "_op": "delete"},
            {"id": 3, "_op": "delete"},
            {"id": 3, "name": "c2", "qty": 30, "_op": "upsert"},
            {"id": 99, "_op": "delete"},
        )
        assert await _post(session, base, "changes", first) == (200, {"accepted": 8})
        assert (await _flush(session, base))["records"] == 8
        assert _state(config) == {1: (1, "a2", 10), 3: (3, "c2", 30)}

        # A JSON array across commits: deletes what the last commit wrote, re-inserts
        # a key deleted there; a delete may carry other columns (they are ignored).
        second = [
            {"id": 1, "_op": "delete", "name": "ignored"},
            {"id": 2, "name": "b3", "qty": 200, "_op": "upsert"},
            {"id": 4, "name": None, "qty": 4, "_op": "upsert"},
        ]
        reply = await _post(session, base, "changes", json.dumps(second).encode(), JSON)
        assert reply == (200, {"accepted": 3})
        await _flush(session, base)
        assert _state(config) == {2: (2, "b3", 200), 3: (3, "c2", 30), 4: (4, None, 4)}

        # An Arrow stream: `_op` a string column, a delete with nulls elsewhere, other
        # integer widths cast to the table's.
        third = pa.table(
            {
                "id": pa.array([3, 5, 4], pa.int32()),
                "name": pa.array([None, "e", "d5"]),
                "qty": pa.array([None, 5, 40], pa.int64()),
                "_op": pa.array(["delete", "upsert", "upsert"]),
            }
        )
        assert await _post(session, base, "changes", _arrow(third), ARROW) == (
            200,
            {"accepted": 3},
        )
        # /records on an upsert table: every record an upsert (replaces key 5's row).
        records = _ndjson({"id": 5, "name": "e2", "qty": 50}, {"id": 6, "name": "f", "qty": 6})
        assert await _post(session, base, "records", records) == (200, {"accepted": 2})
        await _flush(session, base)
        assert _state(config) == {
            2: (2, "b3", 200),
            4: (4, "d5", 40),
            5: (5, "e2", 50),
            6: (6, "f", 6),
        }
        assert (
            service.metrics.registry.get_sample_value(
                "icespool_http_requests_total",
                {"route": "/v1/tables/{table}/changes", "code": "200"},
            )
            == 3
        )


@pytest.mark.parametrize("content_type", [NDJSON, JSON])
async def test_bad_changes_are_400s_naming_the_problem_and_write_nothing(
    run_daemon: RunDaemon,
    make_config: MakeConfig,
    session: aiohttp.ClientSession,
    content_type: str,
) -> None:
    config = _config(make_config)
    good = {"id": 1, "name": "a", "qty": 1, "_op": "upsert"}
    where = "line 2" if content_type == NDJSON else "record at index 1"
    cases: list[tuple[dict[str, Any], str]] = [
        (
            {"id": 2, "qty": 2, "_op": "merge"},
            f"column '_op': unknown op 'merge' ({where}); an op is 'upsert' or 'delete'",
        ),
        (
            {"name": "x", "_op": "delete"},
            f"column 'id': the key is missing ({where}); every change needs the table's key",
        ),
        (
            {"id": None, "qty": 1, "_op": "upsert"},
            f"column 'id': the key is missing ({where}); every change needs the table's key",
        ),
        (
            {"id": "seven", "_op": "delete"},
            "column 'id': key column: expected an integer from -9223372036854775808 to "
            f'9223372036854775807, got "seven" ({where})',
        ),
        (
            {"id": 2, "name": "no qty", "_op": "upsert"},
            f"column 'qty': required column is missing or null in an upsert ({where}) "
            "(a delete needs only the key)",
        ),
        ({"id": 2, "qty": 2}, f"column '_op': required column is missing or null ({where})"),
        ({"id": 2, "qty": 2, "_op": 1}, "column '_op': expected a string, got 1"),
    ]
    async with run_daemon(config) as (service, base):
        for bad, message in cases:
            records = [good, bad]
            body = _ndjson(*records) if content_type == NDJSON else json.dumps(records).encode()
            status, answer = await _post(session, base, "changes", body, content_type)
            assert status == 400, (bad, answer)
            assert answer["error"].startswith(message), (bad, answer["error"])
        writer = service.table_writer(ITEMS)
        assert writer.pending_records == 0
        # /changes on an append table: refused before anything is decoded.
        status, answer = await _post(
            session, base, "changes", _ndjson({"id": 1, "_op": "upsert"}), table=PLAIN
        )
        assert status == 400
        assert answer["error"].startswith(f"table '{PLAIN}' has no key, so it takes no changes")
        assert service.table_writer(PLAIN).pending_records == 0
        # A table created from its first records has no key either (config refuses `key`
        # with `infer`): refused, and not created by the refused body.
        status, answer = await _post(
            session, base, "changes", _ndjson({"id": 1, "_op": "upsert"}), table=INFERRED
        )
        assert status == 400
        assert answer["error"].startswith(f"table '{INFERRED}' has no key")
        assert service.awaiting_schema(INFERRED)
        rejected = service.metrics.registry.get_sample_value(
            "icespool_records_rejected_total", {"table": PLAIN, "reason": "not_upsert"}
        )
        assert rejected == 1
        # Nothing refused reached the table; the daemon still takes good changes.
        assert await _post(session, base, "changes", _ndjson(good)) == (200, {"accepted": 1})
        await _flush(session, base)
    assert _state(config) == {1: (1, "a", 1)}


async def test_bad_arrow_changes_413_and_503(
    run_daemon: RunDaemon, make_config: MakeConfig, session: aiohttp.ClientSession
) -> None:
    config = _config(make_config, max_queue_bytes="16KiB")
    async with run_daemon(config, max_body_bytes=200_000) as (service, base):
        no_op = pa.table({"id": pa.array([1], pa.int64()), "qty": pa.array([1], pa.int64())})
        status, answer = await _post(session, base, "changes", _arrow(no_op), ARROW)
        assert status == 400 and answer["error"].startswith("column '_op': missing")
        bad_op = no_op.append_column("_op", pa.array(["delete_all"]))
        status, answer = await _post(session, base, "changes", _arrow(bad_op), ARROW)
        assert (status, answer["error"]) == (
            400,
            "column '_op': unknown op 'delete_all' (row 0); an op is 'upsert' or 'delete'",
        )
        bad_key = pa.table({"id": pa.array(["x"]), "_op": pa.array(["delete"])})
        status, answer = await _post(session, base, "changes", _arrow(bad_key), ARROW)
        assert status == 400 and answer["error"].startswith("column 'id': key column:")
        null_key = pa.table({"id": pa.array([None], pa.int64()), "_op": pa.array(["delete"])})
        status, answer = await _post(session, base, "changes", _arrow(null_key), ARROW)
        assert status == 400 and "column 'id'" in answer["error"], answer
        assert service.table_writer(ITEMS).pending_records == 0

        # 413 as /records: the body is larger than max_body_bytes.
        huge = _ndjson(*({"id": i, "qty": i, "_op": "upsert"} for i in range(8_000)))
        status, answer = await _post(session, base, "changes", huge)
        assert status == 413 and answer["error"].startswith("request body too large")
        # 503 as /records: the table's queue is full (16 KiB).
        fill = _ndjson(
            *({"id": i, "name": "x" * 40, "qty": i, "_op": "upsert"} for i in range(600))
        )
        assert (await _post(session, base, "changes", fill))[0] == 200
        status, answer = await _post(session, base, "changes", fill)
        assert status == 503 and "max_queue_bytes" in answer["error"], answer
        assert (await _flush(session, base))["records"] == 600
    assert _state(config) == {i: (i, "x" * 40, i) for i in range(600)}
