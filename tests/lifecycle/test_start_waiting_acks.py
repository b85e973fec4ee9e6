"""A start that waits for the catalog still acks records of tables whose schema it knows:
real `icespool run` children on a real PostgreSQL catalog behind a loopback TCP proxy
(the ``pg_proxy`` fixture) that refuses connections, then forwards.

Known: declared in [[tables]] ``schema``, or recorded in the spool by an earlier run
(``table-schemas``). Those records are spooled and acked (200) while /readyz stays 503;
once the catalog answers, each is committed exactly once, also after a kill -9 while
waiting. A table of unknown schema is answered 503 naming the wait, with nothing
spooled; a body that does not fit the known schema 503 naming the column.
"""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType
from support.daemon_harness import NDJSON, Daemon, DaemonDir, ndjson
from support.proxy import TcpProxy

_BATCH = 50
ARROW_STREAM = "application/vnd.apache.arrow.stream"
_TIMEOUTS = '\n[timeouts]\ncatalog_connect = "1s"\ncatalog_request = "1s"\n'
_WAITING = "starting: waiting for the catalog 'lake' (unreachable for "
_INFERRED = "create = true\ninfer = true"
# A second table, created from its first records: unknown while the catalog is down.
_OTHER = '\n[[tables]]\nname = "t.other"\ncreate = true\ninfer = true\n'


def _daemon(tmp_path: Path, uri: str, *, table: str | None = None, extra: str = "") -> Daemon:
    home = DaemonDir(tmp_path / "d", catalog_uri=uri)
    home.write_config(batch_timeout="60s", extra=_TIMEOUTS + extra, table=table)
    return Daemon(home)


def _records(ids: range) -> bytes:
    return ndjson({"id": i, "v": f"v{i}"} for i in ids)


async def _post(
    session: aiohttp.ClientSession, url: str, body: bytes, content_type: str = NDJSON
) -> tuple[int, dict[str, Any], dict[str, str]]:
    async with session.post(url, data=body, headers={"Content-Type": content_type}) as resp:
        return resp.status, json.loads(await resp.text()), dict(resp.headers)


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, Any]]:
    async with session.get(url) as resp:
        return resp.status, json.loads(await resp.text())


async def _ack_batches(
    daemon: Daemon, session: aiohttp.ClientSession, first: int, batches: int
) -> list[int]:
    """Post ``batches`` batches of `_BATCH` ids from ``first`` on; each must be acked."""
    acked: list[int] = []
    for start in range(first, first + batches * _BATCH, _BATCH):
        ids = range(start, start + _BATCH)
        status, body, _ = await _post(session, daemon.records_url(), _records(ids))
        assert (status, body) == (200, {"accepted": _BATCH}), daemon.tail()
        acked += ids
    return acked


def _assert_committed_once(daemon: Daemon, acked: list[int]) -> None:
    rows, _ = daemon.home.read_rows()
    counts = Counter(row["id"] for row in rows)
    assert sorted(counts) == sorted(acked), "an acked id is missing, or one was never acked"
    assert set(counts.values()) == {1}, "an id was committed twice"
    assert all(row["v"] == f"v{row['id']}" for row in rows)


async def _stop(daemon: Daemon) -> None:
    daemon.signal(signal.SIGTERM)
    assert await daemon.wait_exit(within=40) == 0, daemon.tail()
    assert daemon.home.spool_files() == []
    assert daemon.home.quarantined() == []


async def test_a_declared_table_acks_while_the_catalog_is_down_and_commits_each_once(
    pg_proxy: tuple[TcpProxy, str], tmp_path: Path
) -> None:
    proxy, uri = pg_proxy
    proxy.mode = "refuse"
    daemon = _daemon(tmp_path, uri, extra=_OTHER)
    try:
        daemon.start()
        await daemon.wait_listening(within=60)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            await daemon.wait_log("retrying in", within=30)
            acked = await _ack_batches(daemon, session, 0, 10)
            # Arrow as well: cast to the declared schema like NDJSON.
            arrow = pa.table({"id": list(range(500, 520)), "v": [f"v{i}" for i in range(500, 520)]})
            sink = pa.BufferOutputStream()
            with ipc.new_stream(sink, arrow.schema) as writer:
                writer.write_table(arrow)
            status, body, _ = await _post(
                session, daemon.records_url(), sink.getvalue().to_pybytes(), ARROW_STREAM
            )
            assert (status, body) == (200, {"accepted": 20}), daemon.tail()
            acked += range(500, 520)

            # Not ready (the catalog), saying what is accepted meanwhile.
            status, body = await _get(session, f"{daemon.url}/readyz")
            assert status == 503, body
            assert body["error"].startswith(f"not ready: {_WAITING}"), body
            assert body["error"].endswith(
                "; records for t.events (schema known) are accepted meanwhile "
                "(/v1/status accepting_while_waiting)"
            ), body
            status, state = await _get(session, f"{daemon.url}/v1/status")
            assert status == 200
            assert state["ready"] is False
            assert state["accepting_while_waiting"] == ["t.events"]
            assert state["waiting_for"]["dependency"] == "the catalog 'lake'"
            metrics = await daemon.metrics(session)
            assert 'icespool_records_acked_total{table="t.events"} 520.0' in metrics

            # The table of unknown schema waits: 503 naming the catalog, nothing spooled.
            status, body, headers = await _post(
                session, daemon.records_url("t.other"), _records(range(-5, 0))
            )
            assert status == 503, body
            assert body["error"].startswith(f"the daemon cannot take requests yet: {_WAITING}"), (
                body
            )
            assert "nothing was accepted" in body["error"], body
            assert 1 <= int(headers["Retry-After"]) <= 30, headers
            spooled = [p.name for p in daemon.home.spool_files()]
            assert spooled and all(name.startswith("t__events__") for name in spooled), spooled

            proxy.mode = "forward"
            await daemon.wait_ready(within=90)  # the retry backoff is at most 30 s
            # Committed by start-up recovery, before the daemon said ready.
            status, state = await _get(session, f"{daemon.url}/v1/status")
            assert state["accepting_while_waiting"] == []
            assert state["tables"]["t.events"]["pending_records"] == 0, state
            assert state["tables"]["t.events"]["last_commit"]["reason"] == "recovery"
            assert state["tables"]["t.events"]["last_commit"]["records"] == len(acked)
            log = daemon.log()
            assert (
                "520 records were acked while waiting for the catalog (t.events: 520); "
                "committing them with the spool's leftovers"
            ) in log, daemon.tail()
            acked += await _ack_batches(daemon, session, 10_000, 1)
        await _stop(daemon)
        _assert_committed_once(daemon, acked)
        assert "Traceback" not in daemon.all_logs()
    finally:
        daemon.cleanup()


async def test_a_schema_the_spool_recorded_acks_after_a_clean_stop(
    pg_proxy: tuple[TcpProxy, str], tmp_path: Path
) -> None:
    """No schema declared (``infer = true``): the first run creates the table from its
    records; after a clean stop the spool holds no segment, but its record of the
    table's schema lets the next start ack while the catalog is down."""
    proxy, uri = pg_proxy
    proxy.mode = "forward"
    daemon = _daemon(tmp_path, uri, table=_INFERRED)
    try:
        daemon.start()
        await daemon.wait_ready(within=60)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            acked = await _ack_batches(daemon, session, 0, 2)
        await _stop(daemon)
        assert (daemon.home.spool_dir / "table-schemas").is_file()

        proxy.mode = "refuse"
        daemon.start()
        await daemon.wait_listening(within=60)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            await daemon.wait_log("retrying in", within=30)
            status, state = await _get(session, f"{daemon.url}/v1/status")
            assert (status, state["ready"]) == (200, False)
            assert state["accepting_while_waiting"] == ["t.events"]
            acked += await _ack_batches(daemon, session, 1000, 6)
            proxy.mode = "forward"
            await daemon.wait_ready(within=90)
            status, state = await _get(session, f"{daemon.url}/v1/status")
            assert state["tables"]["t.events"]["pending_records"] == 0, state
        await _stop(daemon)
        _assert_committed_once(daemon, acked)
        assert "Traceback" not in daemon.all_logs()
    finally:
        daemon.cleanup()


async def test_records_acked_while_waiting_survive_kill_9(
    pg_proxy: tuple[TcpProxy, str], tmp_path: Path
) -> None:
    proxy, uri = pg_proxy
    proxy.mode = "refuse"
    daemon = _daemon(tmp_path, uri)
    try:
        daemon.start()
        await daemon.wait_listening(within=60)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            await daemon.wait_log("retrying in", within=30)
            acked = await _ack_batches(daemon, session, 0, 8)
        daemon.kill()
        assert daemon.home.spool_files() != []

        proxy.mode = "forward"
        daemon.start()
        await daemon.wait_ready(within=60)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            _, state = await _get(session, f"{daemon.url}/v1/status")
            assert state["recovery"]["records"] == len(acked), state["recovery"]
            assert state["tables"]["t.events"]["pending_records"] == 0, state
        await _stop(daemon)
        _assert_committed_once(daemon, acked)
    finally:
        daemon.cleanup()


@pytest.mark.parametrize(
    ("body", "status", "error"),
    [
        (
            b'{"id": 1, "v": "a", "extra": 5}\n',
            503,
            "the records do not fit the schema of table t.events known while waiting (as "
            "declared): column 'extra': not in the table schema (line 1); the columns are "
            "id, v; whether the table takes them (schema evolution, a change made "
            "elsewhere) is known once the catalog answers; nothing was accepted, retry "
            f"after the Retry-After seconds ({_WAITING}",
        ),
        (
            b'{"id": "x"}\n',
            503,
            "the records do not fit the schema of table t.events known while waiting (as "
            "declared): column 'id': expected an integer from -9223372036854775808 to "
            '9223372036854775807, got "x" (line 1); whether the table takes them',
        ),
        (
            b'{"v": "no id"}\n',
            503,
            "the records do not fit the schema of table t.events known while waiting (as "
            "declared): column 'id': required column is missing or null (line 1); ",
        ),
        (
            b'{"id": 1\n',
            400,
            "line 1: invalid JSON (Expecting ',' delimiter at character 9); send one JSON "
            "object per line, without line breaks inside a record",
        ),
    ],
    ids=["new-field", "wrong-type", "required-missing", "not-json"],
)
async def test_a_body_that_does_not_fit_the_known_schema_is_refused_whole(
    pg_proxy: tuple[TcpProxy, str], tmp_path: Path, body: bytes, status: int, error: str
) -> None:
    """A misfit is 503 (only the catalog's table can say whether it takes it), naming
    the column; a body that is no JSON is 400 as always. Nothing of either is spooled;
    the good body after it is acked and committed once."""
    proxy, uri = pg_proxy
    proxy.mode = "refuse"
    daemon = _daemon(tmp_path, uri)
    try:
        daemon.start()
        await daemon.wait_listening(within=60)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            await daemon.wait_log("retrying in", within=30)
            got, answer, headers = await _post(session, daemon.records_url(), body)
            assert got == status, answer
            assert answer["error"].startswith(error), answer
            if status == 503:
                assert 1 <= int(headers["Retry-After"]) <= 30, headers
            assert daemon.home.spool_files() == []
            acked = await _ack_batches(daemon, session, 0, 1)
            proxy.mode = "forward"
            await daemon.wait_ready(within=90)
        await _stop(daemon)
        _assert_committed_once(daemon, acked)
    finally:
        daemon.cleanup()


async def test_a_declaration_the_table_contradicts_keeps_what_was_acked_spooled(
    pg_proxy: tuple[TcpProxy, str], postgres_uri: str, tmp_path: Path
) -> None:
    """Records are acked against the declared schema, but the catalog's existing table
    lacks a declared column: the table is degraded (the log names the difference), what
    was acked stays spooled, and once the table is changed to match, the background
    reload commits every acked id once."""
    proxy, uri = pg_proxy
    daemon = _daemon(tmp_path, uri)
    direct = {"type": "sql", "uri": postgres_uri, "warehouse": daemon.home.warehouse.as_uri()}
    catalog = SqlCatalog("lake", **direct)
    try:
        catalog.create_namespace("t")
        catalog.create_table(
            "t.events",
            schema=Schema(
                NestedField(1, "id", LongType(), required=True),
                NestedField(2, "name", StringType(), required=False),
            ),
        )
        proxy.mode = "refuse"
        daemon.start()
        await daemon.wait_listening(within=60)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            await daemon.wait_log("retrying in", within=30)
            acked = await _ack_batches(daemon, session, 0, 4)
            proxy.mode = "forward"
            await daemon.wait_ready(within=90)
            await daemon.wait_log("t.events: cannot load the table: SchemaError: ", within=30)
            assert (
                "t.events: cannot load the table: SchemaError: column 'v': the declared schema "
                "does not match table t.events: v: declared as string but missing from table "
                "t.events. Make the [[tables]] schema match the table, or change the table "
                "(ALTER TABLE); its records stay spooled"
            ) in daemon.log(), daemon.tail()
            _, state = await _get(session, f"{daemon.url}/v1/status")
            assert "the declared schema does not match" in state["degraded"]["t.events"]
            assert daemon.home.spool_files() != []

            with catalog.load_table("t.events").update_schema() as update:
                update.add_column("v", StringType())
            await daemon.wait_log("t.events: loaded; committing its spooled records", within=30)
            await daemon.wait_log("committed t.events: reason=recovery records=200", within=30)
        await _stop(daemon)
        _assert_committed_once(daemon, acked)
    finally:
        daemon.cleanup()
        catalog.engine.dispose()


async def test_a_full_disk_when_the_start_seals_what_it_acked_keeps_it_and_starts(
    pg_proxy: tuple[TcpProxy, str], tmp_path: Path
) -> None:
    """The disk is full just as the catalog answers: sealing the records acked while
    waiting fails, and the start commits the prefix the spool kept instead of ending."""
    proxy, uri = pg_proxy
    proxy.mode = "refuse"
    control = tmp_path / "disk"
    daemon = _daemon(tmp_path, uri)
    try:
        daemon.start(control=control)
        await daemon.wait_listening(within=60)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            await daemon.wait_log("retrying in", within=30)
            acked = await _ack_batches(daemon, session, 0, 4)
            control.write_text("enospc")
            proxy.mode = "forward"
            await daemon.wait_log("sealing the records acked while waiting failed", within=90)
            control.write_text("")
            await daemon.wait_ready(within=90)
            acked += await _ack_batches(daemon, session, 10_000, 1)
        await _stop(daemon)
        _assert_committed_once(daemon, acked)
    finally:
        daemon.cleanup()
