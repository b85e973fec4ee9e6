"""Fault isolation on a real `icespool run` process (issue 11, items 3 and 8).

- A segment whose rows the table cannot take (the table was changed incompatibly
  by another writer after the rows were acked) fails its flushes a bounded number
  of times, is quarantined with its reason, and its table goes on; other tables
  never notice. After kill -9 the next start does not crash-loop, and `icespool
  replay --segment` commits the segment exactly once after the cause is fixed.
- A segment committed but still spooled (crash between commit and spool delete)
  whose snapshot was expired is not committed again.
- Kafka: the offsets of a quarantined segment are not recorded as held, so the
  source reads them again after a restart, and replaying the segment later adds
  nothing twice.
- In-process: the guilty segment of a multi-segment chunk is found, and a table
  that cannot be loaded at start-up is reloaded in the background.

The crash-between-commit-and-delete state is rebuilt without any hook in the
daemon (a crash point through the spool's file-system seam, support/fault_daemon.py).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pyarrow as pa
import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.table import Table
from pyiceberg.table.update.schema import UpdateSchema
from support.daemon_harness import (
    CATALOG_NAME,
    NDJSON,
    TABLE,
    Daemon,
    DaemonDir,
    daemon_command,
    ndjson,
)
from support.kafka_harness import SESSION_TIMEOUT, Broker, create_topic, produce, unique_name
from support.service_helpers import metric

import icespool.lifecycle.service as service_module
from icespool import BackpressureError, Icespool
from icespool.config import Config, embedded_default, validate_config
from icespool.spool import Spool, UnknownSegmentError, segment_file_name

GOOD = "t.good"
_TIMEOUT = aiohttp.ClientTimeout(total=60)
_GOOD_TABLE = f"""
[[tables]]
name = "{GOOD}"
create = true
schema = [
  {{ name = "id", type = "long", required = true }},
  {{ name = "v", type = "string" }},
]
"""


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    made: list[Daemon] = []
    yield made
    for daemon in made:
        daemon.cleanup()


def _daemon(made: list[Daemon], root: Path, **config: Any) -> tuple[DaemonDir, Daemon]:
    home = DaemonDir(root)
    home.write_config(**config)
    daemon = Daemon(home)
    made.append(daemon)
    return home, daemon


# ---------------------------------------------------------------------- helpers


def _with_table(home: DaemonDir, name: str, fn: Callable[[Table], Any]) -> Any:
    catalog = load_catalog(CATALOG_NAME, **home.catalog_properties)
    try:
        return fn(catalog.load_table(name))
    finally:
        engine = getattr(catalog, "engine", None)
        if engine is not None:
            engine.dispose()


def _alter(home: DaemonDir, change: Callable[[UpdateSchema], Any]) -> None:
    """Change TABLE's schema as another writer would (incompatible changes allowed)."""

    def apply(table: Table) -> None:
        with table.update_schema(allow_incompatible_changes=True) as update:
            change(update)

    _with_table(home, TABLE, apply)


def _declare(home: DaemonDir, column: str) -> None:
    """Make TABLE's [[tables]] entry declare ``column`` as its second column."""
    text = home.config_path.read_text()
    head, sep, rest = text.partition(f'name = "{TABLE}"')
    schema_end = rest.index("]\n")
    lines = rest[:schema_end].splitlines()
    lines[-1] = f"  {column},"
    home.config_path.write_text(head + sep + "\n".join(lines) + "\n" + rest[schema_end:])


def _ids(home: DaemonDir, name: str) -> Counter[int]:
    rows = _with_table(home, name, lambda t: t.scan().to_arrow().column("id").to_pylist())
    return Counter(rows)


def _assert_once(home: DaemonDir, name: str, expected: set[int]) -> None:
    ids = _ids(home, name)
    twice = sorted(i for i, c in ids.items() if c > 1)
    assert not twice, f"{name}: {len(twice)} ids twice, e.g. {twice[:5]}"
    assert set(ids) == expected, (
        f"{name}: {len(expected - set(ids))} ids missing, {len(set(ids) - expected)} unexpected"
    )


async def _ingest(
    daemon: Daemon, session: aiohttp.ClientSession, table: str, records: list[dict[str, Any]]
) -> None:
    url = daemon.records_url(table)
    async with session.post(url, data=ndjson(records), headers={"Content-Type": NDJSON}) as resp:
        assert resp.status == 200, f"{resp.status} {await resp.text()}\n{daemon.tail()}"


async def _flush(
    daemon: Daemon, session: aiohttp.ClientSession, table: str
) -> tuple[int, dict[str, Any]]:
    async with session.post(daemon.flush_url(table)) as resp:
        return resp.status, await resp.json(content_type=None)


async def _get(daemon: Daemon, session: aiohttp.ClientSession, path: str) -> Any:
    async with session.get(daemon.url + path) as resp:
        assert resp.status == 200, f"{path}: {resp.status} {await resp.text()}"
        if path == "/metrics":
            return await resp.text()
        return await resp.json()


def _replay(home: DaemonDir, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ICESPOOL")}
    return subprocess.run(
        [*daemon_command(), "replay", "--config", str(home.config_path), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


def _quarantined_ids(status: dict[str, Any], table: str = TABLE) -> list[str]:
    return [q["id"] for q in status["quarantine"]["listed"] if q["table"] == table]


async def _stop(daemon: Daemon) -> None:
    daemon.signal(signal.SIGTERM)
    code = await daemon.wait_exit(60)
    assert code == 0, f"stop answered {code}\n{daemon.tail()}"


def _declared(tmp_path: Path, v_required: bool) -> Config:
    """An in-process config of TABLE (id long required, v string)."""
    column = {"name": "v", "type": "string", "required": v_required}
    id_column = {"name": "id", "type": "long", "required": True}
    table = {"name": TABLE, "create": True, "schema": [id_column, column]}
    return validate_config({**embedded_default(tmp_path), "tables": [table]})


# ---------------------------------------------------------------------- tests


async def test_uncommittable_segment_is_quarantined_and_its_table_and_others_go_on(
    daemons: list[Daemon], tmp_path: Path
) -> None:
    home, daemon = _daemon(daemons, tmp_path / "d", batch_timeout="1h", extra=_GOOD_TABLE)
    daemon.start()
    await daemon.wait_ready()
    async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
        await _ingest(daemon, session, GOOD, [{"id": i, "v": "g"} for i in range(500)])
        await _ingest(daemon, session, TABLE, [{"id": i} for i in range(100)])  # v null
        # Another writer makes v required: the acked rows with a null v cannot go in.
        _alter(home, lambda u: u.update_column("v", required=True))

        for attempt in (1, 2):
            status, body = await _flush(daemon, session, TABLE)
            assert status == 503, (status, body)
            assert f"attempt {attempt} of 3" in body["error"] and "column 'v'" in body["error"]
            degraded = (await _get(daemon, session, "/v1/status"))["degraded"]
            assert set(degraded) == {TABLE}, degraded
            assert (await _get(daemon, session, "/readyz"))["degraded"] == degraded
        status, body = await _flush(daemon, session, TABLE)
        assert status == 200 and body["records"] == 0, body
        state = await _get(daemon, session, "/v1/status")
        assert state["degraded"] == {}, state["degraded"]
        [first] = _quarantined_ids(state)
        assert body["quarantined"] == [first], body
        [entry] = state["quarantine"]["listed"]
        assert "column 'v'" in entry["reason"], entry
        metrics = await _get(daemon, session, "/metrics")
        assert (
            'icespool_uncommittable_segments_total{reason="schema",table="t.events"} 1.0' in metrics
        )
        assert "\nicespool_quarantined_segments_total 1.0" in metrics

        status, body = await _flush(daemon, session, GOOD)
        assert status == 200 and body["records"] == 500, body
        # Later segments of the bad table land (and v is optional again from here).
        _alter(home, lambda u: u.update_column("v", required=False))
        await _ingest(daemon, session, TABLE, [{"id": i, "v": "ok"} for i in range(100, 200)])
        status, body = await _flush(daemon, session, TABLE)
        assert status == 200 and body["records"] == 100, body

        # Acked, never committed: the good table's and one more bad-to-be segment.
        await _ingest(daemon, session, GOOD, [{"id": i, "v": "g"} for i in range(500, 1000)])
        await _ingest(daemon, session, TABLE, [{"id": i} for i in range(200, 300)])
    assert daemon.kill() == -signal.SIGKILL
    _alter(home, lambda u: u.update_column("v", required=True))

    daemon.start()  # before: recovery raised, exit 1 on every start
    await daemon.wait_ready()
    async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
        # The config declares v optional: the table cannot even be loaded. It degrades
        # alone; the good table's acked records are committed.
        degraded = (await _get(daemon, session, "/readyz"))["degraded"]
        assert list(degraded) == [TABLE] and "cannot load" in degraded[TABLE], degraded
        async with session.post(
            daemon.records_url(TABLE), data=ndjson([{"id": 1}]), headers={"Content-Type": NDJSON}
        ) as resp:
            assert resp.status == 503 and "degraded" in await resp.text()
        metrics = await _get(daemon, session, "/metrics")
        assert 'icespool_table_degraded{table="t.events"} 1.0' in metrics
    _assert_once(home, GOOD, set(range(1000)))
    await _stop(daemon)

    _declare(home, '{ name = "v", type = "string", required = true }')
    daemon.start()
    await daemon.wait_ready()
    async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
        state = await _get(daemon, session, "/v1/status")
        assert state["degraded"] == {} and state["spool"]["segments"] == 0, state
        quarantined = _quarantined_ids(state)
        assert len(quarantined) == 2 and quarantined[0] == first, state["quarantine"]
        second = quarantined[1]
    _assert_once(home, GOOD, set(range(1000)))
    _assert_once(home, TABLE, set(range(100, 200)))
    await _stop(daemon)

    done = _replay(home)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 segments stay in quarantine" in done.stderr, done.stderr

    # The fix: v may be null again. Both quarantined segments commit once, in one call.
    _alter(home, lambda u: u.update_column("v", required=False))
    _declare(home, '{ name = "v", type = "string" }')
    done = _replay(home, "--segment", f"{first},{second}")
    assert done.returncode == 0, done.stdout + done.stderr
    _assert_once(home, TABLE, set(range(300)))
    assert home.quarantined() == [] and home.spool_files() == []
    # Once more: nothing left to restore, so it fails naming the segment, adds nothing.
    done = _replay(home, "--segment", first)
    assert done.returncode == 1 and first in done.stderr, done.stdout + done.stderr
    _assert_once(home, TABLE, set(range(300)))


async def test_all_quarantined_restores_every_segment_even_one_whose_reason_was_lost(
    daemons: list[Daemon], tmp_path: Path
) -> None:
    """`replay --all-quarantined` commits every quarantined segment exactly once, also
    one whose reason file a full disk kept from being written; a file that does not
    verify fails by name and stays in quarantine."""
    home, daemon = _daemon(daemons, tmp_path / "d", batch_timeout="1h")
    quarantined: list[str] = []
    for part in range(3):
        daemon.start()
        await daemon.wait_ready()
        async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
            await daemon.ingest(
                session, [{"id": i, "v": "x"} for i in range(part * 100, part * 100 + 100)]
            )
        assert daemon.kill() == -signal.SIGKILL
        async with Spool(home.spool_dir) as spool:  # recovery seals the killed segment
            [info] = spool.recovered.segments
            await spool.quarantine(info.id, f"example {part}")
        quarantined.append(info.id)
    [lost] = [
        p
        for p in (home.spool_dir / "quarantine").iterdir()
        if quarantined[1] in p.name and p.name.endswith(".json")
    ]
    lost.unlink()

    done = _replay(home, "--all-quarantined")
    assert done.returncode == 0, done.stdout + done.stderr
    _assert_once(home, TABLE, set(range(300)))
    assert home.quarantined() == [] and home.spool_files() == []

    bad = home.spool_dir / "quarantine" / segment_file_name(TABLE, quarantined[0])
    bad.write_bytes(b"not a segment")
    done = _replay(home, "--all-quarantined")
    assert done.returncode == 1 and quarantined[0] in done.stderr, done.stdout + done.stderr
    assert bad.read_bytes() == b"not a segment"
    _assert_once(home, TABLE, set(range(300)))


async def test_committed_segment_is_not_committed_again_after_its_snapshot_expired(
    daemons: list[Daemon], tmp_path: Path
) -> None:
    home, daemon = _daemon(daemons, tmp_path / "d", batch_timeout="1h")
    daemon.start(crash=["unlink:*.arrow:1"])  # SIGKILL right after the commit
    await daemon.wait_ready()
    async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
        await daemon.ingest(session, [{"id": i, "v": "x"} for i in range(1000)])
        with pytest.raises(aiohttp.ClientError):
            await daemon.flush(session)
    assert await daemon.wait_exit(20) == -signal.SIGKILL, daemon.tail()
    [segment] = home.spool_files()
    segment_id = segment.name.removesuffix(".arrow").rsplit("__", 1)[1]

    def expire(table: Table) -> None:
        [ours] = table.metadata.snapshots
        assert ours.summary is not None and ours.summary["icespool.segments"] == segment_id
        # Someone else commits, then maintenance expires our snapshot.
        schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.string())])
        table.append(pa.table({"id": [5000], "v": ["other"]}, schema=schema))
        table.maintenance.expire_snapshots().by_id(ours.snapshot_id).commit()

    _with_table(home, TABLE, expire)
    summaries = _with_table(home, TABLE, lambda t: [s.summary for s in t.metadata.snapshots])
    assert [s.get("icespool.segments") if s else None for s in summaries] == [None], summaries

    daemon.start()
    await daemon.wait_ready()
    async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
        result = await daemon.flush(session)
    _assert_once(home, TABLE, set(range(1000)) | {5000})
    assert result["records"] == 0 and result["snapshot_id"] is None, result
    assert "already in snapshot (expired since" in daemon.log()
    assert home.spool_files() == []


def _kafka(broker: Broker, topic: str) -> str:
    return f"""
[[kafka]]
bootstrap_servers = "{broker.bootstrap}"
group_id = "g-{topic}"
topics = ["{topic}"]
table = "{TABLE}"
offset_commit_interval = "1s"
session_timeout = "{SESSION_TIMEOUT}"
"""


async def _wait_pending(daemon: Daemon, session: aiohttp.ClientSession, n: int) -> None:
    for _ in range(300):
        state = await _get(daemon, session, "/v1/status")
        if state["tables"][TABLE]["pending_records"] >= n:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{n} records never reached the spool\n{daemon.tail()}")


async def test_kafka_quarantined_segment_is_read_again_and_replayed_exactly_once(
    daemons: list[Daemon], tmp_path: Path, broker: Broker
) -> None:
    topic = unique_name("isolation")
    await create_topic(broker.bootstrap, topic, 1)
    home, daemon = _daemon(daemons, tmp_path / "d", batch_timeout="1h", extra=_kafka(broker, topic))
    offsets_key = f"icespool.kafka.g-{topic}/{topic}/0"
    daemon.start()
    await daemon.wait_ready()
    async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
        await produce(broker.bootstrap, topic, [{"id": i, "v": "a"} for i in range(50)])
        await _wait_pending(daemon, session, 50)
        assert (await _flush(daemon, session, TABLE))[0] == 200
        await produce(broker.bootstrap, topic, [{"id": i} for i in range(50, 150)])
        await _wait_pending(daemon, session, 100)
        _alter(home, lambda u: u.update_column("v", required=True))
        statuses = [(await _flush(daemon, session, TABLE))[0] for _ in range(3)]
        assert statuses == [503, 503, 200], statuses
        [quarantined] = _quarantined_ids(await _get(daemon, session, "/v1/status"))
        await produce(broker.bootstrap, topic, [{"id": i, "v": "c"} for i in range(150, 200)])
        await _wait_pending(daemon, session, 50)
        assert (await _flush(daemon, session, TABLE))[0] == 200
        await asyncio.sleep(2.5)  # offset ticks: idle tables record what was consumed
    held = _with_table(home, TABLE, lambda t: t.metadata.properties[offsets_key])
    assert held == "0-49,150-199", held  # the quarantined offsets are not claimed
    await _stop(daemon)

    # Fixed; the restart reads offsets 50-149 again from Kafka and commits them.
    _alter(home, lambda u: u.update_column("v", required=False))
    daemon.start()
    await daemon.wait_ready()
    for _ in range(300):
        if len(_ids(home, TABLE)) >= 200:
            break
        async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
            await _flush(daemon, session, TABLE)
        await asyncio.sleep(0.2)
    _assert_once(home, TABLE, set(range(200)))
    await _stop(daemon)

    # Replaying the quarantined copy now adds nothing: its offsets are held.
    done = _replay(home, "--segment", quarantined)
    assert done.returncode == 0, done.stdout + done.stderr
    _assert_once(home, TABLE, set(range(200)))
    held = _with_table(home, TABLE, lambda t: t.metadata.properties[offsets_key])
    assert held == "0-199", held
    assert home.quarantined() == []


async def test_the_guilty_segment_of_a_chunk_is_found_and_the_others_commit(
    tmp_path: Path,
) -> None:
    """In-process: three spooled segments, the middle one with rows the table (changed
    since) rejects; recovery commits the other two, quarantines it, and
    `replay_quarantined` commits it once after the fix."""

    config = _declared(tmp_path, False)
    async with Icespool(config) as ice:  # creates the table
        arrow_schema = ice.writer(TABLE).arrow_schema
    ids: list[str] = []
    async with Spool(config.spool.dir) as spool:
        for start, value in ((0, "a"), (10, None), (20, "c")):
            rows = pa.table({"id": list(range(start, start + 10)), "v": [value] * 10})
            await spool.append(TABLE, rows.cast(arrow_schema).to_batches()[0])
            info = await spool.seal(TABLE)
            assert info is not None
            ids.append(info.id)
    catalog = load_catalog(config.catalog.name, **config.catalog.properties())
    with catalog.load_table(TABLE).update_schema(allow_incompatible_changes=True) as update:
        update.update_column("v", required=True)

    async with Icespool(_declared(tmp_path, True)) as ice:
        status = ice.status()
        assert status["degraded"] == {} and status["spool"]["segments"] == 0
        assert [q["id"] for q in status["quarantine"]["listed"]] == [ids[1]]
        assert "column 'v'" in status["quarantine"]["listed"][0]["reason"]
        assert metric(ice, "icespool_uncommittable_segments_total", table=TABLE, reason="schema")
    table = catalog.load_table(TABLE)
    assert [s.summary.get("icespool.segments") for s in table.snapshots() if s.summary] == [
        ids[0],
        ids[2],
    ]
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == [
        *range(10),
        *range(20, 30),
    ]

    with table.update_schema() as update:
        update.make_column_optional("v")
    async with Icespool(config) as ice:
        result = await ice.replay_quarantined(ids[1])
        assert result.records == 10 and result.segments == (ids[1],)
        with pytest.raises(UnknownSegmentError):
            await ice.replay_quarantined(ids[1])
        assert ice.quarantined() == []
    table = catalog.load_table(TABLE)
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == list(range(30))
    spool_key = next(k for k in table.properties if k.endswith(".last-segments"))
    assert table.properties[spool_key] == ids[1]


async def test_a_table_that_cannot_be_loaded_is_retried_and_then_commits_its_spool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In-process: the declared schema does not match the table at start-up; the
    daemon starts without it (503 for its records), and once the table is changed to
    match, the background reload commits what it had spooled."""
    monkeypatch.setattr(service_module, "_RELOAD_INTERVAL", 0.1)
    optional, required = _declared(tmp_path, False), _declared(tmp_path, True)
    async with Icespool(required) as ice:  # creates the table, v required
        writer = ice.writer(TABLE)
        await writer.append(pa.table({"id": list(range(10)), "v": ["x"] * 10}))
        await writer.flush()
    async with Spool(required.spool.dir) as spool:
        batch = pa.table({"id": list(range(10, 20)), "v": ["y"] * 10})
        await spool.append(TABLE, batch.cast(writer.arrow_schema).to_batches()[0])
    async with Icespool(optional) as ice:  # declares v optional: does not match
        assert "cannot load the table" in ice.degraded()[TABLE]
        with pytest.raises(BackpressureError, match="degraded"):
            ice.writer(TABLE)
        assert ice.status()["spool"]["segments"] == 1
        catalog = load_catalog(required.catalog.name, **required.catalog.properties())
        with catalog.load_table(TABLE).update_schema() as update:
            update.make_column_optional("v")
        for _ in range(100):
            if not ice.degraded() and ice.status()["spool"]["segments"] == 0:
                break
            await asyncio.sleep(0.05)
        assert ice.degraded() == {} and ice.status()["spool"]["segments"] == 0
        ids = catalog.load_table(TABLE).scan().to_arrow().column("id").to_pylist()
        assert sorted(ids) == list(range(20))


async def test_a_dead_letter_table_that_cannot_be_used_holds_back_only_its_source(
    tmp_path: Path, broker: Broker
) -> None:
    """In-process: the dead-letter table exists with another schema. The daemon
    starts (it used to exit), says why, and the Kafka source waits for the table
    instead of consuming records it could not dead-letter."""
    raw = _declared(tmp_path, False).model_dump(mode="json", by_alias=True, exclude_none=True)
    config = validate_config(
        {
            **raw,
            "kafka": [
                {
                    "bootstrap_servers": broker.bootstrap,
                    "topics": [unique_name("dlq-blocked")],
                    "group_id": unique_name("g-dlq-blocked"),
                    "session_timeout": SESSION_TIMEOUT,
                    "table": TABLE,
                    "dead_letter": "table",  # t.events_dead_letter
                }
            ],
        }
    )
    catalog = load_catalog(config.catalog.name, **config.catalog.properties())
    catalog.create_namespace_if_not_exists("t")
    catalog.create_table(f"{TABLE}_dead_letter", pa.schema([("x", pa.int32())]))
    async with Icespool(config) as ice:
        assert "cannot load the table" in ice.degraded()[f"{TABLE}_dead_letter"]
        assert ice.status()["kafka"]["sources"] == []
        await ice.writer(TABLE).append(pa.table({"id": [1, 2], "v": ["a", "b"]}))
        assert (await ice.flush(TABLE)).records == 2
