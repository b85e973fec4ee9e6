"""Table maintenance inside one daemon: the retention rules, expiry deleting exactly the
files no retained snapshot reaches (branch/tag heads and exactly-once properties
untouched), a table whose maintenance keeps failing that keeps ingesting, and the
lease's compare-and-swap between two catalogs racing on PostgreSQL."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata, new_table_metadata
from pyiceberg.table.refs import SnapshotRef, SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.types import LongType, NestedField
from support.failing_io import RefusingDeletes
from support.fixture_types import MakeConfig

from icespool.config import Config, embedded_default, validate_config
from icespool.errors import ConfigError
from icespool.iceberg import commit_properties, table_defaults
from icespool.lifecycle.service import Icespool
from icespool.maintenance import (
    LEASE_PROPERTY,
    MAX_SNAPSHOT_AGE_PROPERTY,
    MIN_SNAPSHOTS_PROPERTY,
    Lease,
    LeaseHeld,
    RunContext,
    Task,
    TaskResult,
    acquire,
    choose_expired,
    release,
    resolve,
)
from icespool.runtime.retry import Backoff

TABLE = "m.events"
SCHEMA = [{"name": "id", "type": "long", "required": True}]
ARROW = pa.schema([pa.field("id", pa.int64(), nullable=False)])
HOUR_MS = 3_600_000


def _config(
    make_config: MakeConfig, catalog: dict[str, str] | None = None, **maintenance: Any
) -> Config:
    sections: dict[str, Any] = {
        "tables": [{"name": TABLE, "create": True, "schema": SCHEMA}],
        "maintenance": maintenance,
    }
    if catalog:
        sections["catalog"] = catalog
    return make_config(**sections)


async def _commit_ids(service: Icespool, ids: range) -> int:
    await service.writer(TABLE).append(pa.record_batch({"id": pa.array(list(ids), pa.int64())}))
    result = await service.flush(TABLE)
    assert result.records == len(ids) and result.snapshot_id is not None
    return result.snapshot_id


def _table(service: Icespool) -> Table:
    assert service._catalog is not None
    return service._catalog.load_table(TABLE)


def _ids(table: Table, snapshot_id: int | None = None) -> list[int]:
    return sorted(table.scan(snapshot_id=snapshot_id).to_arrow().column("id").to_pylist())


def _local(uri: str) -> str:
    return urlparse(uri).path


def _files_on_disk(root: Path) -> dict[str, set[str]]:
    """Data files, manifests and manifest lists under a table's location."""
    found: dict[str, set[str]] = {"data_file": set(), "manifest": set(), "manifest_list": set()}
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            if name.endswith(".parquet"):
                found["data_file"].add(path)
            elif name.startswith("snap-") and name.endswith(".avro"):
                found["manifest_list"].add(path)
            elif name.endswith(".avro"):
                found["manifest"].add(path)
    return found


def _reachable(table: Table) -> dict[str, set[str]]:
    """What the table's snapshots reach: live data files, manifests, manifest lists."""
    reached: dict[str, set[str]] = {"data_file": set(), "manifest": set(), "manifest_list": set()}
    for snapshot in table.metadata.snapshots:
        reached["manifest_list"].add(_local(snapshot.manifest_list))
        for manifest in snapshot.manifests(table.io):
            reached["manifest"].add(_local(manifest.manifest_path))
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                reached["data_file"].add(_local(entry.data_file.file_path))
    return reached


async def _wait_for_run(service: Icespool, *, outcome: str, within: float = 20) -> dict[str, Any]:
    deadline = time.monotonic() + within
    state: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        state = service.status()["tables"][TABLE]["maintenance"]
        last = state["last_run"] if state else None
        if last and last["outcome"] == outcome and not state["running"]:
            return state
        await asyncio.sleep(0.05)
    raise AssertionError(f"no {outcome} maintenance run within {within}s: {state}")


# ------------------------------------------------------------------ retention rules


def _metadata(snapshots: list[Snapshot], refs: dict[str, SnapshotRef]) -> TableMetadata:
    schema = Schema(NestedField(1, "id", LongType(), required=True))
    base = new_table_metadata(
        schema, UNPARTITIONED_PARTITION_SPEC, UNSORTED_SORT_ORDER, "file:///t", {}
    )
    return base.model_copy(update={"snapshots": snapshots, "refs": refs})


def _snapshot(sid: int, parent: int | None, ts: int) -> Snapshot:
    return Snapshot(
        snapshot_id=sid,
        parent_snapshot_id=parent,
        sequence_number=sid,
        timestamp_ms=ts,
        manifest_list=f"file:///t/metadata/snap-{sid}.avro",
        summary=Summary(Operation.APPEND),
        schema_id=0,
    )


def test_retention_keeps_heads_minimums_young_snapshots_and_obeys_the_cap() -> None:
    now = 1_000 * HOUR_MS
    # main: 1..20, snapshot i taken (21 - i) hours ago; a tag on 2; a branch "audit" at
    # 7 keeping 2 of its own; 30 dangles off 4 (rolled back) and is old; 31 is young.
    chain = [_snapshot(i, i - 1 if i > 1 else None, now - (21 - i) * HOUR_MS) for i in range(1, 21)]
    dangling = [_snapshot(30, 4, now - 50 * HOUR_MS), _snapshot(31, 4, now - HOUR_MS // 2)]
    refs = {
        "main": SnapshotRef(snapshot_id=20, snapshot_ref_type=SnapshotRefType.BRANCH),
        "keep": SnapshotRef(snapshot_id=2, snapshot_ref_type=SnapshotRefType.TAG),
        "audit": SnapshotRef(
            snapshot_id=7, snapshot_ref_type=SnapshotRefType.BRANCH, min_snapshots_to_keep=2
        ),
    }
    metadata = _metadata(chain + dangling, refs)
    every = {s.snapshot_id for s in metadata.snapshots}

    # Younger than 5 h: 17..20 (4 h .. 1 h old) and 31; the minimum of 3 is inside that.
    expired = choose_expired(
        metadata, max_age_ms=5 * HOUR_MS, min_snapshots=3, max_snapshots=100, now_ms=now
    )
    assert every - expired == {20, 19, 18, 17, 16, 2, 7, 6, 31}
    # The minimum wins over the age: 10 newest of main stay although older than 5 h.
    expired = choose_expired(
        metadata, max_age_ms=5 * HOUR_MS, min_snapshots=10, max_snapshots=100, now_ms=now
    )
    assert every - expired == set(range(11, 21)) | {2, 7, 6, 31}
    # The cap drops the oldest kept by age, never a head or a branch's minimum.
    expired = choose_expired(
        metadata, max_age_ms=100 * HOUR_MS, min_snapshots=2, max_snapshots=7, now_ms=now
    )
    assert every - expired == {20, 19, 2, 7, 6, 31, 18}
    expired = choose_expired(
        metadata, max_age_ms=100 * HOUR_MS, min_snapshots=2, max_snapshots=1, now_ms=now
    )
    assert every - expired == {20, 19, 2, 7, 6}
    # Nothing old: nothing expires.
    assert (
        choose_expired(metadata, max_age_ms=10**9, min_snapshots=1, max_snapshots=100, now_ms=now)
        == set()
    )


# ------------------------------------------------------------------ expiry end to end


async def test_expiry_deletes_exactly_the_files_no_retained_snapshot_reaches(
    make_config: MakeConfig,
) -> None:
    """Six appends, a tag on the second, an overwrite by another writer (Spark-like
    compaction: the appended files are only in older snapshots now), two appends.
    Maintenance then keeps the tag's snapshot and the newest two (cap 3), and deletes
    the files of appends 3..6, the six manifest lists and the four manifests only the
    expired snapshots listed: what remains on disk is exactly what the retained
    snapshots reach. Table properties are untouched but for the lease."""
    added: list[set[str]] = []
    # The table is created with [maintenance]'s retention as its properties, which then
    # win over [maintenance] (standard properties: Spark's expiry reads them too).
    off = _config(make_config, enabled=False, min_snapshots=2)
    async with Icespool(off) as service:
        table = await asyncio.to_thread(_table, service)
        location = Path(_local(table.metadata.location))
        for n in range(6):
            await _commit_ids(service, range(n * 10, n * 10 + 10))
            before = set().union(*added)
            table = await asyncio.to_thread(_table, service)
            added.append(_reachable(table)["data_file"] - before)
            if n == 1:
                tagged = table.metadata.current_snapshot_id
                assert tagged is not None
                await asyncio.to_thread(table.manage_snapshots().create_tag(tagged, "keep").commit)
        # Another writer rewrites everything into one file.
        everything = pa.table({"id": pa.array(range(60), pa.int64())}, schema=ARROW)
        await asyncio.to_thread(table.overwrite, everything)
        await _commit_ids(service, range(60, 70))
        await _commit_ids(service, range(70, 80))
        table = await asyncio.to_thread(_table, service)
        # pyiceberg's overwrite is two snapshots (delete, append): 10 in all.
        assert len(table.metadata.snapshots) == 10
    properties = dict(table.metadata.properties)
    on_disk = _files_on_disk(location)

    on = _config(make_config, interval="1s", min_snapshots=2, max_snapshots=3)
    async with Icespool(on) as service:
        state = await _wait_for_run(service, outcome="ok")
        table = await asyncio.to_thread(_table, service)
        after = _files_on_disk(location)
        reachable = await asyncio.to_thread(_reachable, table)
        metrics = service.metrics.registry.get_sample_value

        head = table.metadata.current_snapshot_id
        retained = {s.snapshot_id for s in table.metadata.snapshots}
        assert retained == {tagged, head, table.metadata.snapshot_by_id(head).parent_snapshot_id}
        assert table.metadata.refs["keep"].snapshot_id == tagged
        assert await asyncio.to_thread(_ids, table) == list(range(80))
        assert await asyncio.to_thread(_ids, table, tagged) == list(range(20))
        assert after == reachable  # nothing unreachable left, nothing reachable gone
        removed = {kind: on_disk[kind] - after[kind] for kind in on_disk}
        assert removed["data_file"] == set().union(*added[2:6])  # appends 3..6
        assert len(removed["manifest_list"]) == 7  # 1, 3..8
        # Appends 3..6's and the delete snapshot's (only DELETED entries) manifests.
        assert len(removed["manifest"]) >= 4
        for kind, files in removed.items():
            assert metrics(
                "icespool_maintenance_files_removed_total", {"table": TABLE, "kind": kind}
            ) == len(files)
        assert {k: v for k, v in table.metadata.properties.items() if k != LEASE_PROPERTY} == (
            properties
        )
        assert table.metadata.properties[LEASE_PROPERTY].startswith(service._spool.id + " ")
        assert state["last_run"]["tasks"] == {
            "convert": "ok",
            "compact": "ok",
            "expire": "ok",
            "orphans": "ok",
        }
        assert state["lease"]["holder"] == "this replica" and state["pending_deletes"] == 0
        # The shape gauges, set by the run.
        current = table.metadata.current_snapshot()
        assert current is not None
        shape = {
            "icespool_table_snapshots": 3,
            "icespool_table_manifests": len(current.manifests(table.io)),
            "icespool_table_data_files": len(
                list(table.scan().plan_files())  # live data files of main
            ),
            "icespool_table_metadata_bytes": os.path.getsize(_local(table.metadata_location)),
        }
        for name, value in shape.items():
            assert metrics(name, {"table": TABLE}) == value, name
        await asyncio.sleep(1.5)  # later runs find nothing more to do
        assert _files_on_disk(location) == after
    # A clean stop released the lease.
    catalog = load_catalog(on.catalog.name, **on.catalog.properties())
    table = await asyncio.to_thread(catalog.load_table, TABLE)
    assert table.metadata.properties[LEASE_PROPERTY] == ""


# ------------------------------------------------------------------ failing maintenance


async def test_a_table_whose_maintenance_keeps_failing_keeps_ingesting(
    make_config: MakeConfig, caplog: pytest.LogCaptureFixture
) -> None:
    """The object store refuses deletes: every run commits its expiry, fails its
    deletions (kept and retried) and backs off; the table acks and commits all along,
    and /v1/status, the metrics and the log say what fails. Once deletes work again
    the next run deletes what the failed ones left."""
    catalog = {"py-io-impl": "support.failing_io.RefusingDeletes"}
    config = _config(make_config, catalog=catalog, interval="1s", min_snapshots=1, max_snapshots=1)
    RefusingDeletes.refusing.set()
    caplog.set_level(logging.WARNING, logger="icespool.maintenance")
    try:
        async with Icespool(config) as service:
            table = await asyncio.to_thread(_table, service)
            location = Path(_local(table.metadata.location))
            for n in range(12):
                await _commit_ids(service, range(n * 10, n * 10 + 10))
                await asyncio.sleep(0.25)
            state = await _wait_for_run(service, outcome="failed")
            assert "PermissionError: test: deletes are refused" in state["last_run"]["error"]
            assert state["consecutive_failures"] >= 1 and state["pending_deletes"] > 0
            assert service.degraded() == {}
            failed = service.metrics.registry.get_sample_value(
                "icespool_maintenance_runs_total",
                {"table": TABLE, "task": "expire", "outcome": "failed"},
            )
            assert failed is not None and failed >= 1
            errors = service.metrics.registry.get_sample_value(
                "icespool_maintenance_delete_errors_total", {"table": TABLE}
            )
            assert errors is not None and errors >= state["pending_deletes"]
            assert any(
                "maintenance of m.events" in r.getMessage() and "failed" in r.getMessage()
                for r in caplog.records
            )
            # Expiry itself went on (its commits landed); only the deletions wait.
            table = await asyncio.to_thread(_table, service)
            assert len(table.metadata.snapshots) < 12  # 12 commits so far
            assert len(_files_on_disk(location)["manifest_list"]) > 1
            # Ingest never noticed.
            await _commit_ids(service, range(120, 130))
            assert await asyncio.to_thread(_ids, await asyncio.to_thread(_table, service)) == (
                list(range(130))
            )

            RefusingDeletes.refusing.clear()
            state = await _wait_for_run(service, outcome="ok", within=30)
            assert state["pending_deletes"] == 0 and state["consecutive_failures"] == 0
            table = await asyncio.to_thread(_table, service)
            assert _files_on_disk(location) == await asyncio.to_thread(_reachable, table)
            assert await asyncio.to_thread(_ids, table) == list(range(130))
    finally:
        RefusingDeletes.refusing.clear()
    assert RefusingDeletes.refused > 0


# ------------------------------------------------------------------ the lease


def _dead_lease(round_: int, _: object) -> dict[str, str]:
    return {LEASE_PROPERTY: f"dead {round_}"}


def _race(
    table: Table, i: int, barrier: threading.Barrier, results: list[Lease | LeaseHeld | None]
) -> None:
    table.refresh()
    barrier.wait()
    results[i] = acquire(table, f"replica-{i}", ttl=60)


@pytest.fixture
def postgres_catalogs(tmp_path: Path, postgres_uri: str) -> Iterator[tuple[Catalog, Catalog, str]]:
    """Two catalog objects on one fresh PostgreSQL database (as two replicas have) and a
    table in it."""
    props = {
        "type": "sql",
        "uri": postgres_uri,
        "warehouse": (tmp_path / "warehouse").as_uri(),
    }
    (tmp_path / "warehouse").mkdir()
    namespace = f"lease_{uuid.uuid4().hex[:12]}"
    a, b = load_catalog("lake", **props), load_catalog("lake", **props)
    a.create_namespace(namespace)
    name = f"{namespace}.t"
    a.create_table(name, Schema(NestedField(1, "id", LongType(), required=True)))
    try:
        yield a, b, name
    finally:
        a.drop_table(name)
        a.drop_namespace(namespace)
        for catalog in (a, b):
            catalog.engine.dispose()  # type: ignore[attr-defined]


def test_the_lease_is_won_by_exactly_one_of_two_racing_replicas(
    postgres_catalogs: tuple[Catalog, Catalog, str],
) -> None:
    a, b, name = postgres_catalogs
    tables = [a.load_table(name), b.load_table(name)]
    rounds = 8
    for round_ in range(rounds):
        # An expired lease of a third replica, then both race for it at once.
        commit_properties(tables[0], functools.partial(_dead_lease, round_))
        barrier = threading.Barrier(2)
        results: list[Lease | LeaseHeld | None] = [None, None]
        threads = [
            threading.Thread(target=_race, args=(tables[i], i, barrier, results)) for i in range(2)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        won = [r for r in results if isinstance(r, Lease)]
        lost = [r for r in results if isinstance(r, LeaseHeld)]
        assert len(won) == 1 and len(lost) == 1, results
        assert lost[0].holder == won[0].owner
        assert a.load_table(name).metadata.properties[LEASE_PROPERTY] == won[0].value

    # The holder renews only past half its TTL; the other keeps seeing it held.
    holder = won[0]
    i = int(holder.owner[-1])
    assert acquire(tables[i], holder.owner, ttl=60) == holder
    assert acquire(tables[1 - i], f"replica-{1 - i}", ttl=60) == LeaseHeld(
        holder.owner, holder.expires_ms
    )
    # A commit carrying a lease that is not the current one does not land.
    stale = Lease(f"replica-{1 - i}", holder.expires_ms)
    with pytest.raises(Exception, match="Requirement failed: property"):
        commit_properties(
            tables[1 - i],
            lambda _: {"x": "y"},
            requirements=[stale.requirement()],
            retry=Backoff(attempts=1),
        )
    assert "x" not in a.load_table(name).metadata.properties
    # Released: the other replica takes it at once.
    assert release(tables[i], holder)
    assert isinstance(acquire(tables[1 - i], f"replica-{1 - i}", ttl=60), Lease)
    # A release of a lease no longer held changes nothing.
    assert not release(tables[i], holder)


# ------------------------------------------------------------------ config


@pytest.mark.parametrize(
    ("maintenance", "override", "key"),
    [
        ({"min_snapshots": 20, "max_snapshots": 10}, None, "maintenance.min_snapshots"),
        ({"interval": "1m", "lease_ttl": "90s"}, None, "maintenance.lease_ttl"),
        ({}, {"max_snapshots": 5}, "tables[0].maintenance.max_snapshots"),
        ({"lease_ttl": "10m"}, {"interval": "6m"}, "tables[0].maintenance.interval"),
    ],
)
def test_check_config_names_the_maintenance_key_at_fault(
    maintenance: dict[str, Any], override: dict[str, Any] | None, key: str, tmp_path: Path
) -> None:
    raw = embedded_default(tmp_path)
    raw["maintenance"] = maintenance
    if override is not None:
        raw["tables"][0]["maintenance"] = override
    with pytest.raises(ConfigError) as caught:
        validate_config(raw)
    assert [p.key for p in caught.value.problems] == [key]


def test_a_tables_settings_come_from_its_override_then_its_properties_then_the_section(
    tmp_path: Path,
) -> None:
    raw = embedded_default(tmp_path)
    raw["maintenance"] = {"max_snapshot_age": "6h", "min_snapshots": 10, "interval": "2m"}
    raw["tables"][0]["maintenance"] = {"max_snapshot_age": "3d", "enabled": False}
    config = validate_config(raw)
    declared = config.tables[0]
    properties = {MAX_SNAPSHOT_AGE_PROPERTY: "60000", MIN_SNAPSHOTS_PROPERTY: "3"}
    settings = resolve(config, declared, properties)
    assert (settings.max_snapshot_age, settings.min_snapshots) == (3 * 86400, 3)
    assert (settings.enabled, settings.interval, settings.lease_ttl) == (False, 120, 360)
    undeclared = resolve(config, None, properties)
    assert (undeclared.max_snapshot_age, undeclared.min_snapshots) == (60, 3)
    assert undeclared.enabled and undeclared.max_snapshots == 500
    assert resolve(config, None, {MIN_SNAPSHOTS_PROPERTY: "junk"}).min_snapshots == 10
    assert resolve(config, None, {MIN_SNAPSHOTS_PROPERTY: "5000"}).max_snapshots == 5000


# ------------------------------------------------------------------ the scheduler


async def test_runs_are_bounded_in_number_and_time_and_a_hung_one_backs_off(
    make_config: MakeConfig,
) -> None:
    """Five tables, concurrency 2: never more than two runs at once (and two do run
    together). One table's task hangs: its run is abandoned after run_timeout, counted
    as a timeout and backed off, while the other tables are maintained and the hung
    table goes on committing."""
    names = [f"m.t{i}" for i in range(5)]
    config = make_config(
        tables=[{"name": n, "create": True, "schema": SCHEMA} for n in names],
        maintenance={"interval": "1s", "run_timeout": "1s", "concurrency": 2},
    )
    active: set[str] = set()
    most = 0
    runs: Counter[str] = Counter()

    async def probe(ctx: RunContext) -> TaskResult:
        nonlocal most
        active.add(ctx.name)
        most = max(most, len(active))
        runs[ctx.name] += 1
        try:
            await asyncio.sleep(60 if ctx.name == "m.t0" else 0.3)
        finally:
            active.discard(ctx.name)
        return TaskResult(detail="probed")

    async with Icespool(config) as service:
        service.maintenance.tasks = (Task("probe", probe),)
        deadline = time.monotonic() + 20
        while (
            min(runs[n] for n in names[1:]) < 3
            or not service.status()["tables"]["m.t0"]["maintenance"]["consecutive_failures"]
        ):
            assert time.monotonic() < deadline, (runs, service.status()["tables"]["m.t0"])
            await service.writer("m.t0").append(pa.record_batch({"id": pa.array([len(runs)])}))
            assert (await service.flush("m.t0")).records == 1
            await asyncio.sleep(0.2)
        hung = service.status()["tables"]["m.t0"]["maintenance"]
        assert hung["last_run"]["outcome"] == "timeout", hung
        assert hung["last_run"]["error"] == "abandoned after 1s"
        assert hung["next_due_in_seconds"] <= 8  # backed off: at most 8 x interval
        others = [service.status()["tables"][n]["maintenance"] for n in names[1:]]
        assert all(o["last_run"]["outcome"] == "ok" for o in others), others
        assert all(o["last_run"]["details"] == {"probe": "probed"} for o in others), others
        assert most == 2
        assert service.degraded() == {}


async def test_apply_to_existing_sets_only_the_defaults_a_table_lacks(
    make_config: MakeConfig,
) -> None:
    off = _config(make_config, enabled=False)
    async with Icespool(off) as service:
        table = await asyncio.to_thread(_table, service)
        # A table the daemon did not create: none of its defaults (they are set on
        # the tables it creates), one retention property of its own.
        with table.transaction() as strip:
            strip.remove_properties(*table_defaults())
        await asyncio.to_thread(commit_properties, table, lambda _: {MIN_SNAPSHOTS_PROPERTY: "42"})
        assert not set(table_defaults()) - {MIN_SNAPSHOTS_PROPERTY} & set(table.metadata.properties)
    on = _config(make_config, interval="1s", apply_to_existing=True, max_snapshot_age="2h")
    async with Icespool(on) as service:
        state = await _wait_for_run(service, outcome="ok")
        assert state["last_run"]["tasks"] == {
            "defaults": "ok",
            "convert": "ok",
            "compact": "ok",
            "expire": "ok",
            "orphans": "ok",
        }
        properties = (await asyncio.to_thread(_table, service)).metadata.properties
    assert properties[MIN_SNAPSHOTS_PROPERTY] == "42"  # the table's own value stays
    assert properties[MAX_SNAPSHOT_AGE_PROPERTY] == str(2 * HOUR_MS)
    assert properties["write.metadata.delete-after-commit.enabled"] == "true"
    assert properties["write.metadata.previous-versions-max"] == "20"
    assert properties["commit.manifest-merge.enabled"] == "true"
