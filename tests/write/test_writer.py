"""Table writers in-process, on a real SQLite catalog and a real spool directory."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.table import Table

from icespool import Column, Icespool, SchemaError, ShuttingDownError, UnknownTableError
from icespool.config import Config, embedded_default, validate_config
from icespool.errors import CommitError
from icespool.iceberg import SEGMENTS_SUMMARY_KEY, commit_files
from icespool.iceberg._parquet import encode_data_files
from icespool.schema import arrow_schema_for
from icespool.spool import Spool
from icespool.write.cadence import Cadence

TABLE = "t.events"


def _config(tmp_path: Path, **table_settings: Any) -> Config:
    raw = embedded_default(tmp_path)
    raw["tables"] = [
        {
            "name": TABLE,
            "create": True,
            "schema": [
                {"name": "id", "type": "long", "required": True},
                {"name": "v", "type": "string"},
            ],
            "batch_timeout": "1h",
            **table_settings,
        }
    ]
    return validate_config(raw)


def _batch(ids: range) -> pa.Table:
    return pa.table({"id": pa.array(list(ids), pa.int64()), "v": [f"v{i}" for i in ids]})


def _table(config: Config) -> Table:
    catalog = load_catalog(config.catalog.name, **config.catalog.properties())
    return catalog.load_table(TABLE)


def _rows(config: Config) -> list[dict[str, Any]]:
    rows = _table(config).scan().to_arrow().sort_by("id").to_pylist()
    return rows


async def test_flush_commits_one_snapshot_with_exact_rows(tmp_path: Path) -> None:
    config = _config(tmp_path)
    async with Icespool(config) as ice:
        writer = ice.writer(TABLE)
        assert await writer.append(_batch(range(5))) == 5
        await writer.queue({"id": 5, "v": "v5"})
        await writer.queue_all([{"id": 6, "v": "v6"}, {"id": 7}])
        first = await writer.flush()
        assert first.records == 8 and first.snapshot_id is not None and first.reason == "manual"
        assert writer.pending_records == 0
        empty = await writer.flush()
        assert empty.snapshot_id is None and empty.records == 0
        await writer.append(_batch(range(8, 10)))
        second = await writer.flush()
        assert second.records == 2
    rows = _rows(config)
    assert [r["id"] for r in rows] == list(range(10))
    assert [r["v"] for r in rows] == [f"v{i}" for i in range(7)] + [None, "v8", "v9"]
    snapshots = _table(config).snapshots()
    assert [s.snapshot_id for s in snapshots] == [first.snapshot_id, second.snapshot_id]
    summary = snapshots[0].summary
    assert summary is not None and summary[SEGMENTS_SUMMARY_KEY] == ",".join(first.segments)


async def test_record_count_and_age_triggers_commit(tmp_path: Path) -> None:
    config = _config(tmp_path, max_batch_records=100, batch_timeout="300ms")
    async with Icespool(config) as ice:
        writer = ice.writer(TABLE)
        await writer.append(_batch(range(150)))  # passes max_batch_records
        for _ in range(100):
            if writer.pending_records == 0:
                break
            await asyncio.sleep(0.02)
        reasons = {
            s.labels["reason"]: s.value
            for s in ice.metrics.commits.collect()[0].samples
            if s.name.endswith("_total")
        }
        assert reasons == {"records": 1.0}
        await writer.append(_batch(range(150, 160)))
        for _ in range(150):
            if writer.pending_records == 0:
                break
            await asyncio.sleep(0.02)
        assert writer.pending_records == 0
        assert ice.metrics.commits.labels(table=TABLE, reason="age")._value.get() == 1.0
    assert [r["id"] for r in _rows(config)] == list(range(160))


async def test_column_api_with_validity_and_selection(tmp_path: Path) -> None:
    config = _config(tmp_path)
    async with Icespool(config) as ice:
        writer = ice.writer(TABLE)
        n = await writer.append(
            {
                "id": Column([10, 11, 12, 13]),
                "v": Column(["a", "b", "c", "d"], validity=[True, False, True, True]),
            }
        )
        assert n == 4
        n = await writer.append(
            {
                "id": Column([20, 21, 22], selection=[2, 0]),
                "v": Column(["x", "y", "z"], validity=[True, True, False], selection=[2, 0]),
            }
        )
        assert n == 2
        await writer.flush()
    assert [(r["id"], r["v"]) for r in _rows(config)] == [
        (10, "a"),
        (11, None),
        (12, "c"),
        (13, "d"),
        (20, "x"),
        (22, None),
    ]


async def test_bad_batches_name_the_column_and_spool_nothing(tmp_path: Path) -> None:
    config = _config(tmp_path)
    async with Icespool(config) as ice:
        writer = ice.writer(TABLE)
        with pytest.raises(SchemaError, match="'id'"):
            await writer.append(pa.table({"id": ["not a number"], "v": ["x"]}))
        with pytest.raises(SchemaError, match="'id'"):
            await writer.append(pa.table({"v": ["no id"]}))
        with pytest.raises(SchemaError, match="'extra'"):
            await writer.append(pa.table({"id": [1], "extra": [1]}))
        with pytest.raises(SchemaError, match="'id'"):
            await writer.append(pa.table({"id": pa.array([1, None], pa.int64())}))
        assert writer.pending_records == 0
        assert ice.status()["spool"]["bytes"] == 0
        with pytest.raises(UnknownTableError, match=r"nope\.nope"):
            ice.writer("nope.nope")
        result = await writer.flush()
        assert result.snapshot_id is None


async def test_in_process_values_no_reader_can_hold_are_refused_naming_the_column(
    tmp_path: Path,
) -> None:
    """The in-process API is checked like HTTP and Kafka: -2^62 us would be acked, then
    committed where neither pyiceberg's datetimes nor Spark can read it."""
    config = _config(
        tmp_path,
        schema=[
            {"name": "id", "type": "long", "required": True},
            {"name": "ts", "type": "timestamptz"},
            {"name": "s", "type": "struct<d: date>"},
        ],
    )
    async with Icespool(config) as ice:
        writer = ice.writer(TABLE)
        utc = pa.timestamp("us", tz="UTC")
        with pytest.raises(SchemaError, match=r"'ts'.*out of range"):
            await writer.append(pa.table({"id": [1], "ts": pa.array([-(2**62)], utc)}))
        nested = pa.StructArray.from_arrays([pa.array([-800_000], pa.date32())], ["d"])
        with pytest.raises(SchemaError, match=r"'s\.d'.*out of range"):
            await writer.append(pa.table({"id": [2], "s": nested}))
        assert writer.pending_records == 0
        edge = pa.array([253402300799999999], utc)  # 9999-12-31T23:59:59.999999Z
        assert await writer.append(pa.table({"id": [3], "ts": edge})) == 1
        assert (await writer.flush()).records == 1
    assert [r["id"] for r in _rows(config)] == [3]


async def test_recovery_commits_leftover_segments_before_ready(tmp_path: Path) -> None:
    config = _config(tmp_path)
    async with Icespool(config) as ice:  # creates the table
        arrow_schema = ice.writer(TABLE).arrow_schema
    async with Spool(config.spool.dir) as spool:
        for start in (0, 10, 20):
            batch = _batch(range(start, start + 10)).cast(arrow_schema).to_batches()[0]
            await spool.append(TABLE, batch)
        await spool.seal(TABLE)
        await spool.append(
            TABLE, _batch(range(30, 35)).cast(arrow_schema).to_batches()[0]
        )  # left open
    async with Icespool(config) as ice:
        assert ice.ready
        assert ice.status()["spool"]["segments"] == 0
        assert ice.metrics.commits.labels(table=TABLE, reason="recovery")._value.get() == 1.0
    assert [r["id"] for r in _rows(config)] == list(range(35))


async def test_segment_committed_before_a_crash_is_deleted_not_recommitted(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)
    async with Icespool(config) as ice:
        arrow_schema = ice.writer(TABLE).arrow_schema
    # Reproduce the crash window by hand: commit a sealed segment, keep the file.
    async with Spool(config.spool.dir) as spool:
        await spool.append(TABLE, _batch(range(7)).cast(arrow_schema).to_batches()[0])
        info = await spool.seal(TABLE)
        assert info is not None
        data = await spool.read(info.id)
    table = _table(config)
    files = encode_data_files(
        table,
        data.batches,
        target_file_size=1 << 27,
        row_group_records=1 << 20,
        compression="zstd",
        file_prefix=info.id,
    )
    commit_files(table, files, segment_ids=[info.id], summary={})
    assert info.path.exists()
    async with Icespool(config) as ice:
        assert ice.status()["spool"]["segments"] == 0
        assert ice.metrics.commits.labels(table=TABLE, reason="recovery")._value.get() == 0.0
    assert [r["id"] for r in _rows(config)] == list(range(7))
    assert len(_table(config).snapshots()) == 1
    assert not info.path.exists()


async def test_close_commits_and_then_refuses(tmp_path: Path) -> None:
    config = _config(tmp_path)
    ice = Icespool(config)
    await ice.start()
    writer = ice.writer(TABLE)
    await writer.append(_batch(range(3)))
    in_flight = asyncio.create_task(writer.flush())
    result = await writer.writer.close()
    await in_flight
    assert writer.pending_records == 0
    assert result.reason in ("close", "manual")
    with pytest.raises(ShuttingDownError):
        await writer.append(_batch(range(3, 4)))
    await ice.stop()
    await ice.stop()  # idempotent
    assert [r["id"] for r in _rows(config)] == [0, 1, 2]


async def test_many_tables_flush_concurrently(tmp_path: Path) -> None:
    raw = embedded_default(tmp_path)
    names = [f"t.table{i}" for i in range(6)]
    raw["tables"] = [
        {
            "name": name,
            "create": True,
            "schema": [{"name": "id", "type": "long", "required": True}],
            "batch_timeout": "1h",
        }
        for name in names
    ]
    config = validate_config(raw)
    async with Icespool(config) as ice:

        async def feed(name: str) -> None:
            writer = ice.writer(name)
            for k in range(5):
                await writer.append(pa.table({"id": pa.array(range(k * 10, k * 10 + 10))}))
                await writer.flush()

        await asyncio.gather(*(feed(n) for n in names))
    catalog = load_catalog(config.catalog.name, **config.catalog.properties())
    for name in names:
        table = catalog.load_table(name)
        ids = table.scan().to_arrow().column("id").to_pylist()
        assert sorted(ids) == list(range(50)), name
        assert len(table.snapshots()) == 5
        assert arrow_schema_for(table).field("id").nullable is False


async def test_storage_outage_backs_off_keeps_acking_and_loses_nothing(tmp_path: Path) -> None:
    config = _config(tmp_path, batch_timeout="100ms")
    warehouse = tmp_path / "warehouse"
    async with Icespool(config) as ice:
        writer = ice.writer(TABLE)
        await writer.append(_batch(range(10)))
        for _ in range(100):
            if writer.pending_records == 0:
                break
            await asyncio.sleep(0.02)
        assert writer.pending_records == 0
        # Storage goes away: data files cannot be written under the table location.
        hidden = tmp_path / "warehouse.away"
        warehouse.rename(hidden)
        warehouse.write_text("not a directory")
        try:
            await writer.append(_batch(range(10, 20)))
            failures = ice.metrics.commit_failures.labels(table=TABLE)
            for _ in range(200):
                if failures._value.get() >= 1:
                    break
                await asyncio.sleep(0.02)
            assert failures._value.get() >= 1
            # Still acking while commits fail: the spool holds it all.
            assert await writer.append(_batch(range(20, 30))) == 10
            assert writer.pending_records == 20
        finally:
            warehouse.unlink()
            hidden.rename(warehouse)
        for _ in range(500):  # the backoff retry commits everything
            if writer.pending_records == 0:
                break
            await asyncio.sleep(0.02)
        assert writer.pending_records == 0
    assert [r["id"] for r in _rows(config)] == list(range(30))


async def test_a_backlog_commits_in_bounded_chunks_and_the_flush_reports_all(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = _config(tmp_path, max_batch_bytes=2000)
    async with Icespool(config) as ice:  # creates the table
        arrow_schema = ice.writer(TABLE).arrow_schema
    async with Spool(config.spool.dir) as spool:
        for start in (0, 100, 200):  # three segments, each above max_batch_bytes
            await spool.append(
                TABLE, _batch(range(start, start + 100)).cast(arrow_schema).to_batches()[0]
            )
            info = await spool.seal(TABLE)
            assert info is not None and info.bytes > 2000
    caplog.set_level("INFO", logger="icespool.service")
    async with Icespool(config) as ice:
        # One flush (reason recovery), one snapshot per bounded chunk.
        assert ice.metrics.commits.labels(table=TABLE, reason="recovery")._value.get() == 3.0
    assert "replayed t.events: 300 records committed" in caplog.text
    assert [r["id"] for r in _rows(config)] == list(range(300))
    assert len(_table(config).snapshots()) == 3


def _race_next_commit(
    monkeypatch: pytest.MonkeyPatch, ice: Icespool, other_commit: Callable[[], None]
) -> list[int]:
    """Before the service's next commit reaches the catalog, another writer (its own
    catalog and Table) commits ``other_commit`` to the same table: the service's swap,
    built on the table it refreshed before, is refused once. Returns the list the
    race appends to when it ran."""
    catalog = ice.tables.require_catalog()
    send = catalog.commit_table
    raced: list[int] = []

    def commit_table(table: Table, requirements: Any, updates: Any) -> Any:
        if not raced and table.name() == tuple(TABLE.split(".")):
            raced.append(1)
            other_commit()
        return send(table, requirements, updates)

    monkeypatch.setattr(catalog, "commit_table", commit_table)
    return raced


async def test_a_conflict_with_another_writer_is_counted_and_the_commit_lands_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _config(tmp_path)
    caplog.set_level("INFO", logger="icespool.writer")
    async with Icespool(config) as ice:
        writer = ice.writer(TABLE)
        other = _table(config)  # another writer: its own catalog and Table
        theirs = _batch(range(100, 103)).cast(arrow_schema_for(other))
        await writer.append(_batch(range(5)))
        raced = _race_next_commit(monkeypatch, ice, lambda: other.append(theirs))
        result = await writer.flush()
        assert raced == [1]
        assert (result.conflicts, result.records) == (1, 5)
        m = ice.metrics
        assert m.commit_conflicts.labels(table=TABLE)._value.get() == 1.0
        assert m.commits.labels(table=TABLE, reason="manual")._value.get() == 1.0
        assert m.commit_failures.labels(table=TABLE)._value.get() == 0.0
        # The conflict spaces the table's age flushes by a quarter of batch_timeout;
        # each clean commit takes a sixteenth of it back.
        timeout = writer.settings.batch_timeout
        stretch = m.batch_timeout_stretch.labels(table=TABLE)
        assert writer.cadence.stretch == stretch._value.get() == timeout / 4
        assert writer.cadence.timeout(timeout) == timeout * 1.25
        for n in range(4):
            await writer.append(_batch(range(200 + n, 201 + n)))
            assert (await writer.flush()).conflicts == 0
        assert writer.cadence.stretch == stretch._value.get() == 0.0
    assert f"committed {TABLE}: reason=manual records=5 " in caplog.text
    assert f"snapshot={result.snapshot_id} conflicts=1" in caplog.text
    logged = next(r for r in caplog.records if r.getMessage().startswith("committed "))
    assert logged.__dict__["conflicts"] == 1
    # The other writer's rows and ours, each once; ours in one snapshot built on theirs.
    assert [r["id"] for r in _rows(config)] == [*range(5), *range(100, 103), *range(200, 204)]
    snapshots = _table(config).snapshots()
    assert len(snapshots) == 6 and snapshots[1].snapshot_id == result.snapshot_id
    assert snapshots[1].parent_snapshot_id == snapshots[0].snapshot_id
    marked = [s.summary.get(SEGMENTS_SUMMARY_KEY) for s in snapshots[:2] if s.summary]
    assert marked == [None, ",".join(result.segments)]


async def test_conflicts_of_a_commit_that_fails_are_counted_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer repartitions the table between the writer's refresh and its swap:
    the swap conflicts, and the retry finds the files encoded for the old spec and
    fails the flush. The conflict counts; the next flush re-encodes and lands."""
    config = _config(tmp_path)
    async with Icespool(config) as ice:
        writer = ice.writer(TABLE)
        other = _table(config)

        def repartition() -> None:
            with other.update_spec() as update:
                update.add_identity("v")

        await writer.append(_batch(range(6)))
        raced = _race_next_commit(monkeypatch, ice, repartition)
        with pytest.raises(CommitError, match="encoded for partition spec 0 but the table now"):
            await writer.flush()
        assert raced == [1]
        m = ice.metrics
        assert m.commit_conflicts.labels(table=TABLE)._value.get() == 1.0
        assert m.commit_failures.labels(table=TABLE)._value.get() == 1.0
        assert writer.pending_records == 6  # the spool kept them
        result = await writer.flush()
        assert (result.conflicts, result.records) == (0, 6)
        assert m.commit_conflicts.labels(table=TABLE)._value.get() == 1.0
        assert m.commits.labels(table=TABLE, reason="manual")._value.get() == 1.0
    assert [r["id"] for r in _rows(config)] == list(range(6))
    (snapshot,) = _table(config).snapshots()
    assert snapshot.snapshot_id == result.snapshot_id


def test_the_cadence_stretch_is_bounded_and_decays() -> None:
    """A quarter of batch_timeout per commit that met a conflict, at most one
    batch_timeout; a sixteenth back per clean commit, never below nothing."""
    cadence = Cadence()
    for _ in range(10):
        cadence.committed(2, 8.0)
    assert cadence.stretch == 8.0 and cadence.timeout(8.0) == 16.0
    assert cadence.timeout(2.0) == 4.0  # a reload that shortened batch_timeout
    for n in range(15):
        cadence.committed(0, 8.0)
        assert cadence.stretch == 8.0 - (n + 1) * 0.5
    cadence.committed(0, 8.0)
    cadence.committed(0, 8.0)
    assert cadence.stretch == 0.0 and cadence.timeout(8.0) == 8.0
