"""Maintenance on a bad day: what a hostile user or an unlucky moment does to expiry,
compaction and the commits around them, one small case each.

Real SQLite SQL catalog, local warehouse, real pyiceberg Table objects (as in
test_compaction.py and test_orphans.py).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.metadata import SnapshotLogEntry, TableMetadata, new_table_metadata
from pyiceberg.table.refs import SnapshotRef, SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.table.statistics import StatisticsFile
from pyiceberg.table.update import RemoveSnapshotsUpdate, update_table_metadata
from pyiceberg.types import DoubleType, LongType, NestedField, StringType
from support.failing_io import SlowDataReads
from support.fixture_types import MakeConfig
from support.maintenance_helpers import (
    ENCODE,
    INCARNATION,
    append_daemon_files,
    encode_daemon_files,
    live_files,
    rows,
    sql_catalog,
    table_ids,
    uuid7_at,
)

from icespool.config import embedded_default, validate_config
from icespool.errors import ConfigError
from icespool.iceberg import commit_expiry, commit_files, commit_properties
from icespool.iceberg._catalog import ensure_table
from icespool.iceberg._upstream._metadata import apply_updates
from icespool.lifecycle.service import Icespool
from icespool.maintenance import (
    LEASE_PROPERTY,
    FileOwner,
    IoBudget,
    commit_rewrite,
    delete_files,
    find_garbage,
    plan_compaction,
    remove_orphans,
    resolve,
    rewrite,
)
from icespool.schema import arrow_schema_for, conform, parse_partition_spec, parse_schema

COLUMNS: list[dict[str, object]] = [
    {"name": "id", "type": "long", "required": True},
    {"name": "payload", "type": "string"},
]


def _table(tmp_path: Path, properties: dict[str, str] | None = None) -> Table:
    schema = parse_schema(COLUMNS)
    spec = parse_partition_spec(schema, [])
    return ensure_table(
        sql_catalog(tmp_path), "m.events", schema, spec, properties or {}, create=True
    )


def _files_on_disk(table: Table) -> set[str]:
    root = table.metadata.location.removeprefix("file://")
    return {
        os.path.join(directory, name)
        for directory, _, names in os.walk(root)
        for name in names
        if name.endswith((".avro", ".parquet"))
    }


def _reachable(table: Table) -> set[str]:
    """Manifest lists, manifests and live data files the table's snapshots reach."""
    reached: set[str] = set()
    for snapshot in table.metadata.snapshots:
        reached.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(table.io):
            reached.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                reached.add(entry.data_file.file_path)
    return {path.removeprefix("file://") for path in reached}


def test_a_sweep_cut_in_two_finds_the_rest_after_the_first_half_was_deleted(
    tmp_path: Path,
) -> None:
    """A sweep cut short by its deadline goes on next run with the expired snapshots
    left. An unmerged manifest is listed by consecutive snapshots, so the first part's
    deletions remove manifests the rest still list: the rest must go on (what such a
    manifest held was decided with it), not fail on the missing file at every run."""
    table = _table(tmp_path, {"commit.manifest.min-count-to-merge": "3"})
    for n in range(6):
        append_daemon_files(table, [rows(range(n * 2, n * 2 + 2))])
    table.refresh()
    oldest = [s.snapshot_id for s in table.metadata.snapshots[:4]]
    expired = commit_expiry(table, lambda _: set(oldest))
    assert expired is not None and len(expired.snapshots) == 4
    deadline = time.monotonic() + 60

    for part in (expired.snapshots[:1], expired.snapshots[1:]):
        garbage = find_garbage(table.io, part, table.metadata, deadline=deadline)
        outcome = delete_files(table.io, garbage.files, limit=1_000, deadline=deadline)
        assert outcome.failed == [] and outcome.left == []

    assert _files_on_disk(table) == _reachable(table)
    assert table_ids(table) == list(range(12))


def _manifest_count(table: Table) -> int:
    table.refresh()
    snapshot = table.current_snapshot()
    assert snapshot is not None
    return len(snapshot.manifests(table.io))


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("commit.manifest.min-count-to-merge", "abc"),
        ("commit.manifest.target-size-bytes", "8MB"),
        ("commit.manifest-merge.enabled", "maybe"),
    ],
)
def test_a_garbage_merge_property_does_not_stop_the_tables_commits(
    tmp_path: Path, key: str, value: str
) -> None:
    """Any engine may set any string as a table property (Iceberg checks them only when
    it commits). A value pyiceberg cannot parse made every daemon commit a
    CommitRejectedError, the data's fault: each segment of the table was struck and
    quarantined. The merge properties only tune manifest merging: a value that is no
    value means the property's default."""
    table = _table(tmp_path, {"commit.manifest.min-count-to-merge": "3"})
    commit_properties(table, lambda _: {key: value})
    for n in range(6):
        append_daemon_files(table, [rows(range(n * 2, n * 2 + 2))])
    assert table_ids(table) == list(range(12))
    assert table.metadata.properties[key] == value  # the table's own value is left alone


def test_a_table_another_engine_created_merges_its_manifests_as_iceberg_does(
    tmp_path: Path,
) -> None:
    """A table the daemon did not create lacks commit.manifest-merge.enabled. Iceberg's
    default is true (Java, Spark); pyiceberg's is false, so every daemon commit added a
    manifest for ever: the manifest list and every commit's cost grew with the table's
    age, the very thing merge appends are for."""
    table = _table(tmp_path, {"commit.manifest.min-count-to-merge": "4"})
    with table.transaction() as strip:  # as another engine creates it: no merge key
        strip.remove_properties("commit.manifest-merge.enabled")
    assert "commit.manifest-merge.enabled" not in table.metadata.properties
    for n in range(12):
        append_daemon_files(table, [rows(range(n * 2, n * 2 + 2))])
        assert _manifest_count(table) < 4
    assert table_ids(table) == list(range(24))


NESTED: list[dict[str, object]] = [
    {"name": "id", "type": "long", "required": True},
    {"name": "s", "type": "struct<a: int, b: string, c: struct<x: int, y: string>>"},
    {"name": "l", "type": "list<struct<p: int, q: string>>"},
    {"name": "m", "type": "map<string, struct<u: float, v: string>>"},
]


def _nested_rows(ids: range, arrow: pa.Schema) -> pa.Table:
    """Rows with every nesting, null structs, lists and maps among them."""
    data: dict[str, list[Any]] = {"id": [], "s": [], "l": [], "m": []}
    for i in ids:
        data["id"].append(i)
        data["s"].append(
            None if i % 7 == 3 else {"a": i, "b": f"b{i}", "c": {"x": -i, "y": f"y{i}"}}
        )
        data["l"].append(None if i % 5 == 1 else [{"p": i, "q": f"q{i}"}, None])
        data["m"].append(None if i % 6 == 2 else [(f"k{i}", {"u": i / 2, "v": f"v{i}"})])
    return pa.table(
        {name: pa.array(values, arrow.field(name).type) for name, values in data.items()},
        schema=arrow,
    )


def _evolve_nested(table: Table) -> None:
    """What Spark's ALTER TABLE ... RENAME COLUMN / DROP COLUMN / ALTER COLUMN TYPE do
    to nested fields."""
    with table.update_schema() as update:
        update.rename_column("s.a", "a2")
        update.delete_column("s.b")
        update.rename_column("s.c.x", "x2")
        update.update_column("s.c.x", LongType())
        update.delete_column("l.element.q")
        update.rename_column("l.element.p", "p2")
        update.rename_column("m.value.v", "v2")
        update.update_column("m.value.u", DoubleType())
        update.add_column(("s", "new"), StringType())


def _raw(table: Table) -> list[dict[str, Any]]:
    """Every row of main, read by pyiceberg's scan (its own projection of each file by
    field id: a reader independent of the daemon's), sorted by id."""
    table.refresh()
    found = table.scan().to_arrow().to_pylist()
    return sorted(found, key=lambda row: row["id"])


def _file_rows(table: Table) -> list[dict[str, Any]]:
    """Every row of the live files as pyarrow reads them (pyiceberg's scan reads a null
    list of structs back as an empty one), sorted by id."""
    found: list[dict[str, Any]] = []
    for path in live_files(table):
        with table.io.new_input(path).open() as stream:
            found += pq.read_table(stream).to_pylist()
    return sorted(found, key=lambda row: row["id"])


def test_compaction_across_nested_renames_drops_and_widenings_keeps_every_value(
    tmp_path: Path,
) -> None:
    """Spark renames, drops and widens fields inside structs, lists and maps between
    the daemon's commits. Compaction matched nested fields by name: a renamed or
    dropped one failed the bin, so every run failed on the same oldest files and the
    table was never compacted again. Matched by field id, every value survives."""
    schema = parse_schema(NESTED)
    table = ensure_table(
        sql_catalog(tmp_path), "m.nested", schema, parse_partition_spec(schema, []), {}, True
    )
    arrow = arrow_schema_for(table)
    append_daemon_files(table, [_nested_rows(range(n * 6, n * 6 + 6), arrow) for n in range(3)])
    _evolve_nested(table)
    arrow = arrow_schema_for(table)
    append_daemon_files(
        table, [_nested_rows_evolved(range(n * 6, n * 6 + 6), arrow) for n in range(3, 6)]
    )
    before = _raw(table)
    assert [row["id"] for row in before] == list(range(36))
    assert before[0]["s"] == {"a2": 0, "c": {"x2": 0, "y": "y0"}, "new": None}

    table.refresh()
    (plan,) = plan_compaction(table, target_file_size=1 << 20, max_bytes=1 << 30)
    assert len(plan.files) == 6
    new = rewrite(table, plan, budget=IoBudget(None), **_WRITER)
    result = commit_rewrite(table, plan, new)

    assert result.outcome == "committed" and len(new) == 1
    assert set(live_files(table)) == {new[0].file_path}
    assert _raw(table) == before
    # The new file is written in the current schema: no old names left in it.
    with table.io.new_input(new[0].file_path).open() as stream:
        written = pq.read_schema(stream)
    assert written.field("s").type.names == ["a2", "c", "new"]
    assert written.field("l").type.value_type.names == ["p2"]
    nulls = [(row["s"] is None, row["l"] is None, row["m"] is None) for row in _file_rows(table)]
    assert nulls[:18] == [(i % 7 == 3, i % 5 == 1, i % 6 == 2) for i in range(18)]


_WRITER = {
    "row_group_records": ENCODE["row_group_records"],
    "compression": "zstd",
    "incarnation": INCARNATION,
}


def _nested_rows_evolved(ids: range, arrow: pa.Schema) -> pa.Table:
    data: dict[str, list[Any]] = {"id": [], "s": [], "l": [], "m": []}
    for i in ids:
        data["id"].append(i)
        data["s"].append({"a2": i, "c": {"x2": 2**40 + i, "y": f"y{i}"}, "new": f"n{i}"})
        data["l"].append([{"p2": i}])
        data["m"].append([(f"k{i}", {"u": i / 4, "v2": f"v{i}"})])
    return pa.table(
        {name: pa.array(values, arrow.field(name).type) for name, values in data.items()},
        schema=arrow,
    )


async def test_a_spooled_record_survives_nested_renames_and_drops_made_elsewhere(
    make_config: MakeConfig,
) -> None:
    """Records spooled under the old schema, nested fields renamed and dropped by
    another engine before the flush: the segment commits (matched by field id), it is
    not struck and quarantined as if its rows were at fault."""
    config = make_config(
        tables=[{"name": "m.nested", "create": True, "schema": NESTED}],
        maintenance={"enabled": False},
    )
    async with Icespool(config) as service:
        writer = service.writer("m.nested")
        await writer.append(_nested_rows(range(6), writer.arrow_schema).to_batches()[0])
        assert service._catalog is not None
        table = service._catalog.load_table("m.nested")
        await asyncio.to_thread(_evolve_nested, table)
        result = await service.flush("m.nested")
        assert result.records == 6 and result.quarantined == ()
        got = await asyncio.to_thread(_file_rows, table)
    assert [row["id"] for row in got] == list(range(6))
    assert got[0]["s"] == {"a2": 0, "c": {"x2": 0, "y": "y0"}, "new": None}
    assert got[0]["l"] == [{"p2": 0}, None]
    assert got[0]["m"] == [("k0", {"u": 0.0, "v2": "v0"})]
    assert got[3]["s"] is None and got[1]["l"] is None and got[2]["m"] is None


def test_nested_fields_match_by_id_in_slices_of_a_batch_too(tmp_path: Path) -> None:
    schema = parse_schema(NESTED)
    table = ensure_table(
        sql_catalog(tmp_path), "m.nested", schema, parse_partition_spec(schema, []), {}, True
    )
    batch = _nested_rows(range(20), arrow_schema_for(table)).to_batches()[0]
    _evolve_nested(table)
    target = arrow_schema_for(table)
    for start, length in [(0, 20), (3, 9), (19, 1), (5, 0)]:
        part = batch.slice(start, length)
        got = conform(part, target, match_field_ids=True, drop_extra=True).to_pylist()
        expected = [
            {
                "id": row["id"],
                "s": None
                if row["s"] is None
                else {
                    "a2": row["s"]["a"],
                    "c": {"x2": row["s"]["c"]["x"], "y": row["s"]["c"]["y"]},
                    "new": None,
                },
                "l": None
                if row["l"] is None
                else [None if e is None else {"p2": e["p"]} for e in row["l"]],
                "m": None
                if row["m"] is None
                else [(k, {"u": v["u"], "v2": v["v"]}) for k, v in row["m"]],
            }
            for row in part.to_pylist()
        ]
        assert got == expected, (start, length)


async def _maintained(service: Icespool, table: str, done: Any, within: float) -> dict[str, Any]:
    """The table's maintenance status once ``done(last_run)`` holds (polls)."""
    deadline = time.monotonic() + within
    state: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        state = service.status()["tables"][table]["maintenance"]
        last = state["last_run"] if state else None
        if last and not state["running"] and done(last):
            return state
        await asyncio.sleep(0.05)
    raise AssertionError(f"maintenance of {table} not done within {within}s: {state}")


async def test_compaction_bigger_than_its_runs_io_budget_makes_progress_run_by_run(
    make_config: MakeConfig,
) -> None:
    """[maintenance] io_bytes_per_second x run_timeout passes less than the plan's
    inputs and outputs (compaction_max_bytes_per_run is 2 GiB by default). Every run
    planned the same bins, hit its deadline waiting for budget and committed nothing:
    a table never compacted, a failure every run. A run plans what its budget can pass."""
    config = make_config(
        tables=[{"name": "m.events", "create": True, "schema": COLUMNS}],
        maintenance={
            "interval": "1s",
            "run_timeout": "2s",
            "io_bytes_per_second": "48KiB",
            "lease": "none",
            "compaction_min_files": 2,
        },
    )
    async with Icespool(config) as service:
        for n in range(8):  # eight files of ~10 KiB: ~160 KiB to read and write
            data = rows(range(n * 400, n * 400 + 400))
            await service.writer("m.events").append(data.to_batches()[0])
            assert (await service.flush("m.events")).records == 400

        def compacted(last: dict[str, Any]) -> bool:
            assert last["outcome"] == "ok", last  # no run fails
            return "replaced" in last["details"].get("compact", "")

        await _maintained(service, "m.events", compacted, within=20)
        assert service._catalog is not None
        table = service._catalog.load_table("m.events")
        assert table_ids(table) == list(range(3_200))


@pytest.mark.parametrize(
    ("maintenance", "override", "key"),
    [
        ({"interval": "500ms"}, None, "maintenance.interval"),
        ({"interval": "1s", "lease_ttl": "2s"}, None, "maintenance.lease_ttl"),
        ({}, {"interval": "300ms", "lease_ttl": "2500ms"}, "tables[0].maintenance.lease_ttl"),
        ({"lease_ttl": "2s", "interval": "1s"}, {"enabled": False}, "maintenance.lease_ttl"),
    ],
)
def test_check_config_refuses_a_maintenance_cadence_that_can_never_work(
    tmp_path: Path, maintenance: dict[str, Any], override: dict[str, Any] | None, key: str
) -> None:
    """A lease holder stops 2 s before its lease ends (replicas' clocks may differ that
    much), so with a lease of at most ~2 s (interval 500ms: 1.5 s) every run took the
    lease by a commit and then found its deadline already passed: every task of every
    run failed, while check-config said the file was fine."""
    raw = embedded_default(tmp_path)
    raw["maintenance"] = maintenance
    if override is not None:
        raw["tables"][0]["maintenance"] = override
    with pytest.raises(ConfigError) as caught:
        validate_config(raw)
    assert [p.key for p in caught.value.problems] == [key]


def test_a_one_second_cadence_with_its_default_lease_is_accepted(tmp_path: Path) -> None:
    raw = embedded_default(tmp_path)
    raw["maintenance"] = {"interval": "1s"}
    assert validate_config(raw).maintenance.resolved_lease_ttl == 3
    raw["maintenance"] = {"interval": "500ms", "lease": "none"}
    assert validate_config(raw).maintenance.interval == 0.5


async def test_a_lease_left_by_a_dead_replica_whose_clock_ran_ahead_is_taken_over(
    make_config: MakeConfig,
) -> None:
    """A replica whose clock was a day ahead took the lease and died: its lease ends a
    day from now by every other clock, so no replica maintained the table for a day
    (expiry, compaction, orphans all stopped while ingest went on). A lease value that
    nobody renewed for its TTL plus the clock margin, measured on this replica's own
    monotonic clock since it first saw the value, has ended whatever the holder's clock
    said: a live holder renews well before that."""
    config = make_config(
        tables=[{"name": "m.events", "create": True, "schema": COLUMNS}],
        maintenance={"interval": "1s", "lease_ttl": "3s"},
    )
    ahead = f"ghost-replica {int((time.time() + 86_400) * 1000)}"
    async with Icespool(config) as service:
        assert service._catalog is not None
        table = service._catalog.load_table("m.events")
        await asyncio.to_thread(commit_properties, table, lambda _: {LEASE_PROPERTY: ahead})
        await service.writer("m.events").append(rows(range(10)).to_batches()[0])
        assert (await service.flush("m.events")).records == 10
        started = time.monotonic()

        def maintained(last: dict[str, Any]) -> bool:
            return last["outcome"] == "ok"

        state = await _maintained(service, "m.events", maintained, within=15)
        assert state["lease"]["holder"] == "this replica"
        # Not before the ghost's lease had gone unrenewed for its TTL plus the margin.
        assert time.monotonic() - started >= 3 + 2
        table.refresh()
        assert table.metadata.properties[LEASE_PROPERTY].startswith(service._spool.id + " ")
        assert table_ids(table) == list(range(10))


def _compaction_outputs(table: Table) -> set[str]:
    root = table.metadata.location.removeprefix("file://")
    return {
        os.path.join(directory, name)
        for directory, _, names in os.walk(root)
        for name in names
        if name.startswith("c-") and name.endswith(".parquet")
    }


async def test_a_compaction_whose_commit_never_starts_leaves_no_files(
    make_config: MakeConfig,
) -> None:
    """The run's rewrite is done, its commit waits in the table's lane behind a flush
    stuck on a slow catalog, and the run's deadline (or its timeout, or SIGTERM) comes
    first: the commit never starts, so nothing will ever reference the files the
    rewrite wrote. They stayed on disk until an orphan sweep an hour later; the run
    deletes them itself. A later run compacts as usual."""
    config = make_config(
        tables=[{"name": "m.events", "create": True, "schema": COLUMNS}],
        maintenance={
            "interval": "2s",
            "run_timeout": "1s",
            "lease": "none",
            "compaction_min_files": 2,
        },
    )
    async with Icespool(config) as service:
        for n in range(3):
            await service.writer("m.events").append(
                rows(range(n * 10, n * 10 + 10)).to_batches()[0]
            )
            assert (await service.flush("m.events")).records == 10
        # A flush stuck in the catalog: the lane is busy past the run's deadline and
        # timeout (1 s + 1 s); the rewrite (outside the lane) is not held up.
        stuck = service._pool.lane("m.events").submit(lambda: asyncio.sleep(5))

        def ended(last: dict[str, Any]) -> bool:
            return last["outcome"] in ("failed", "timeout")

        state = await _maintained(service, "m.events", ended, within=8)
        # The next run comes at least interval / 2 later (backoff): nothing of it yet.
        await asyncio.sleep(0.3)  # the removal runs in a thread
        assert service._catalog is not None
        table = service._catalog.load_table("m.events")
        assert _compaction_outputs(table) == set(), state["last_run"]
        await stuck

        def compacted(last: dict[str, Any]) -> bool:
            return "replaced" in last["details"].get("compact", "")

        await _maintained(service, "m.events", compacted, within=8)
        table.refresh()
        live = {path.removeprefix("file://") for path in live_files(table)}
        assert _compaction_outputs(table) == {p for p in live if "/c-" in p}  # no stray one
        assert table_ids(table) == list(range(30))


def test_a_short_orphan_age_never_removes_a_file_another_replica_is_about_to_commit(
    tmp_path: Path,
) -> None:
    """orphan_older_than = "1s" ("clean up faster"). This replica's spool protects its
    own files, but another replica writing the same table (a Kafka consumer group)
    writes its files and commits them up to commit_files' retry budget later: its file
    was swept as an orphan and its commit then referenced a file that is gone (every
    scan of the table failed). The age a sweep uses is never below that window."""
    raw = embedded_default(tmp_path / "a")
    raw["maintenance"] = {"orphan_older_than": "1s"}
    config = validate_config(raw)
    settings = resolve(config, None, {})
    table = _table(tmp_path)
    # The other replica's flush: a segment opened seconds ago, encoded, commit pending
    # (its catalog is slow). Neither this replica's spool nor a snapshot knows it.
    segment = uuid7_at(time.time() - 5)
    _, files = encode_daemon_files(table, rows(range(10)), segment=segment)
    path = files[0].file_path.removeprefix("file://")
    then = time.time() - 5
    os.utime(path, (then, then))

    # This replica's own incarnations are not the other's.
    swept = remove_orphans(
        table,
        owner=FileOwner("aaaaaaaaaaaa", frozenset({"bbbbbbbbbbbb"})),
        is_spooled=lambda _: False,
    )

    assert swept.removed == 0 and os.path.exists(path)
    commit_files(table, files, segment_ids=[segment], summary={})  # the other replica's commit
    assert table_ids(table) == list(range(10))
    assert settings.orphan_older_than >= 600  # the commit window with default [timeouts]


def _history(count: int) -> TableMetadata:
    """Table metadata with ``count`` snapshots in one line of history, a tag on the
    third and a statistics file of the second."""
    schema = Schema(NestedField(1, "id", LongType(), required=True))
    base = new_table_metadata(
        schema, UNPARTITIONED_PARTITION_SPEC, UNSORTED_SORT_ORDER, "file:///t", {}
    )
    snapshots = [
        Snapshot(
            snapshot_id=i,
            parent_snapshot_id=i - 1 if i > 1 else None,
            sequence_number=i,
            timestamp_ms=1_000 + i,
            manifest_list=f"file:///t/metadata/snap-{i}.avro",
            summary=Summary(Operation.APPEND),
            schema_id=0,
        )
        for i in range(1, count + 1)
    ]
    statistics = StatisticsFile(
        snapshot_id=2,
        statistics_path="file:///t/metadata/2.stats",
        file_size_in_bytes=1,
        file_footer_size_in_bytes=1,
        blob_metadata=[],
    )
    return base.model_copy(
        update={
            "snapshots": snapshots,
            "snapshot_log": [
                SnapshotLogEntry(snapshot_id=s.snapshot_id, timestamp_ms=s.timestamp_ms)
                for s in snapshots
            ],
            "refs": {
                "main": SnapshotRef(snapshot_id=count, snapshot_ref_type=SnapshotRefType.BRANCH),
                "audit": SnapshotRef(snapshot_id=3, snapshot_ref_type=SnapshotRefType.TAG),
            },
            "current_snapshot_id": count,
            "last_sequence_number": count,
            "statistics": [statistics],
        }
    )


def test_expiring_thousands_of_snapshots_in_one_commit_is_linear(tmp_path: Path) -> None:
    """The first expiry of a table that went unmaintained (maintenance just enabled,
    apply_to_existing, an old Spark table) removes thousands of snapshots in one
    commit, in the table's lane. pyiceberg applies the removal by scanning the list of
    ids once per snapshot: 3 s at 10,000 snapshots, minutes at 100,000, twice per commit
    (staging and the SQL commit), holding the table's ingest commits all along."""
    small = _history(12)
    removed = RemoveSnapshotsUpdate(snapshot_ids=[1, 2, 3, 4, 5])
    # The same result as pyiceberg's own update (the tagged snapshot's ref goes too).
    # (Each stamps last-updated-ms with its own clock reading.)
    ours, theirs = apply_updates(small, (removed,)), update_table_metadata(small, (removed,))
    assert ours.model_copy(update={"last_updated_ms": 0}) == theirs.model_copy(
        update={"last_updated_ms": 0}
    )

    big = _history(10_000)
    ids = list(range(1, 9_990))
    started = time.perf_counter()
    after = apply_updates(big, (RemoveSnapshotsUpdate(snapshot_ids=ids),))
    elapsed = time.perf_counter() - started
    assert [s.snapshot_id for s in after.snapshots] == list(range(9_990, 10_001))
    assert after.snapshots[0].parent_snapshot_id is None  # its parent is gone
    assert [e.snapshot_id for e in after.snapshot_log] == list(range(9_990, 10_001))
    assert set(after.refs) == {"main"} and after.statistics == []
    assert elapsed < 1.0, f"{elapsed:.2f}s"


FIXED = {
    "write.target-file-size-bytes": "1048576",
    "write.parquet.compression-codec": "zstd",
    "write.parquet.row-group-limit": "1000",
    "write.metadata.metrics.default": "full",
}


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("write.target-file-size-bytes", "512MB"),
        ("write.parquet.compression-codec", "zstandard"),
        ("write.parquet.row-group-limit", "-5"),
        ("write.metadata.metrics.default", "histogram"),
    ],
)
async def test_a_garbage_write_property_holds_the_table_back_and_quarantines_nothing(
    make_config: MakeConfig, key: str, value: str
) -> None:
    """Another engine sets a table's write property to a value no writer can use
    (Spark's writes to the table fail on it too). It is the table's fault, not its
    rows': each flush failed as "cannot be encoded", struck its segments three times
    and quarantined them, every acked record of the table, to be replayed by hand.
    The table is held back (degraded, retried) and commits everything once fixed."""
    config = make_config(
        tables=[{"name": "m.events", "create": True, "schema": COLUMNS}],
        maintenance={"enabled": False},
    )
    async with Icespool(config) as service:
        assert service._catalog is not None
        table = service._catalog.load_table("m.events")
        await asyncio.to_thread(commit_properties, table, lambda _: {key: value})
        writer = service.writer("m.events")
        for n in range(4):
            await writer.append(rows(range(n * 10, n * 10 + 10)).to_batches()[0])
            with pytest.raises(Exception, match=key):
                await service.flush("m.events")
        assert service._spool.stats().quarantined == 0
        assert key in service.degraded()["m.events"]
        await asyncio.to_thread(
            commit_properties,
            table,
            lambda _: {
                key: "1048576"
                if "size" in key or "limit" in key
                else "zstd"
                if "codec" in key
                else "full"
            },
        )
        result = await service.flush("m.events")
        assert result.records == 40 and result.quarantined == ()
        assert table_ids(table) == list(range(40))


async def test_many_small_files_slow_to_read_are_compacted_a_part_per_run(
    make_config: MakeConfig,
) -> None:
    """Thousands of tiny files on an object store whose every read takes tens of ms:
    one bin of them takes longer to read than a run may last. Every run planned the
    same bin (its bytes are few, the budget passes them), read past its deadline and
    committed nothing, for ever. A run that runs out of time makes the next plan
    fewer files, until one fits: the table is compacted a part per run."""
    config = make_config(
        catalog={"py-io-impl": "support.failing_io.SlowDataReads"},
        tables=[{"name": "m.events", "create": True, "schema": COLUMNS}],
        maintenance={
            "interval": "500ms",
            "run_timeout": "1s",
            "lease": "none",
            "compaction_min_files": 2,
        },
    )
    async with Icespool(config) as service:
        assert service._catalog is not None
        table = service._catalog.load_table("m.events")
        await asyncio.to_thread(
            append_daemon_files, table, [rows(range(n * 5, n * 5 + 5)) for n in range(40)]
        )
        SlowDataReads.delay = 0.05  # 40 files: 2 s of reads, in runs of 1 s
        try:

            def compacted(last: dict[str, Any]) -> bool:
                return "replaced" in last["details"].get("compact", "")

            state = await _maintained(service, "m.events", compacted, within=20)
        finally:
            SlowDataReads.delay = 0.0
        assert state["last_run"]["outcome"] == "ok"
        assert table_ids(table) == list(range(200))
