"""Compaction of upsert tables: equality and position deletes applied, seq-aware, and the
delete files nothing live needs dropped in the same ONE replace snapshot.

Real SQLite SQL catalog, local warehouse. Change sets are committed as an upsert commit
commits them (support/cdc_tables.py: data files plus equality deletes on the key for
every touched key, in one snapshot). The expected state is a dict the test keeps; the
table's merged state is read by the test's own row-by-row reader (``merged_rows``).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import random
import time
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.manifest import DataFileContent, ManifestContent
from pyiceberg.table import Table
from support.cdc_tables import (
    commit_changes,
    commit_position_delete_across,
    commit_position_deletes,
    delete_files,
    merged_rows,
)
from support.maintenance_helpers import ENCODE, INCARNATION, local_path, sql_catalog, uuid7_at

from icespool.cdc import DELETE, UPSERT, live_files, read_merged, with_ops
from icespool.iceberg import commit_expiry
from icespool.iceberg._catalog import ensure_table
from icespool.lifecycle.service import Icespool
from icespool.maintenance import (
    CompactionPlan,
    FileOwner,
    IoBudget,
    commit_rewrite,
    find_garbage,
    is_daemon_file,
    plan_compaction,
    remove_orphans,
    rewrite,
)
from icespool.maintenance._compact import CompactionResult
from icespool.maintenance._expire import DATA_FILE, DELETE_FILE
from icespool.maintenance._expire import delete_files as delete_files_on_disk
from icespool.runtime.retry import Backoff
from icespool.schema import parse_partition_spec, parse_schema

HOUR = 3600.0
TARGET = 256 * 1024
FAST = Backoff(attempts=4, base=0.001, cap=0.01)
WRITER = {
    "row_group_records": ENCODE["row_group_records"],
    "compression": "zstd",
    "incarnation": INCARNATION,
}
UNLIMITED = IoBudget(None)
COLUMNS: list[dict[str, object]] = [
    {"name": "region", "type": "string", "required": True},
    {"name": "id", "type": "long", "required": True},
    {"name": "payload", "type": "string"},
    {"name": "version", "type": "long"},
]

KEY = ("region", "id")
State = dict[tuple[Any, ...], dict[str, Any]]


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    return sql_catalog(tmp_path)


def _table(
    catalog: Catalog, partition_by: list[str] | None = None, name: str = "m.upserts"
) -> Table:
    schema = parse_schema(COLUMNS)
    spec = parse_partition_spec(schema, partition_by or [])
    return ensure_table(catalog, name, schema, spec, {}, create=True)


def _rows(keys: list[tuple[str, int]], version: int) -> pa.Table:
    return pa.table(
        {
            "region": [r for r, _ in keys],
            "id": [i for _, i in keys],
            "payload": [f"{r}-{i}-v{version}" for r, i in keys],
            "version": [version] * len(keys),
        }
    )


def _keys(keys: list[tuple[str, int]]) -> pa.Table:
    return pa.table({"region": [r for r, _ in keys], "id": [i for _, i in keys]})


def _change_rounds(
    table: Table,
    state: State,
    *,
    commits: int,
    keys: int,
    per_commit: int,
    regions: tuple[str, ...] = ("eu", "us"),
    key: tuple[str, ...] = ("region", "id"),
    seed: int = 7,
    start: int = 0,
) -> None:
    """``commits`` change sets over ``keys`` keys per region: upserts, deletes and
    re-inserts at random; ``state`` follows them (the last change per key wins)."""
    rng = random.Random(seed)
    universe = [(r, i) for r in regions for i in range(keys)]
    for n in range(start, start + commits):
        touched = rng.sample(universe, per_commit)
        cut = rng.randrange(len(touched) + 1)
        upserts, deletes = touched[:cut], touched[cut:]
        commit_changes(
            table,
            _rows(upserts, n) if upserts else None,
            _keys(deletes) if deletes else None,
            key,
        )
        for r, i in upserts:
            state[(r, i) if len(key) == 2 else (i,)] = {
                "region": r,
                "id": i,
                "payload": f"{r}-{i}-v{n}",
                "version": n,
            }
        for r, i in deletes:
            state.pop((r, i) if len(key) == 2 else (i,), None)


def _compact(table: Table, **plan: Any) -> tuple[CompactionPlan, CompactionResult]:
    table.refresh()
    options = {"target_file_size": TARGET, "max_bytes": 1 << 30, **plan}
    (found,) = plan_compaction(table, **options)
    new = rewrite(table, found, budget=UNLIMITED, **WRITER)
    return found, commit_rewrite(table, found, new, retry=FAST)


def _paths(table: Table) -> list[str]:
    return [d.file.file_path for d in _data_files(table)]


def _data_files(table: Table) -> list[Any]:
    table.refresh()
    live = live_files(table.io, table.metadata, table.metadata.current_snapshot())  # type: ignore[arg-type]
    return list(live.data.values())


def test_equality_deletes_over_200_commits_unpartitioned(catalog: Catalog) -> None:
    """200 change sets over 1,000 keys: before and after ONE compaction the merged state
    is exact; afterwards no delete file is left, a few data files hold every live
    key once, and pyiceberg's own scan can read the table again."""
    table = _table(catalog)
    state: State = {}
    _change_rounds(
        table, state, commits=200, keys=1_000, per_commit=25, regions=("eu",), key=("id",)
    )
    assert merged_rows(table, ("id",)) == state
    assert len(delete_files(table)) == 200
    _assert_equality_ids_declared_int(table)
    with pytest.raises(ValueError, match="does not yet support equality deletes"):
        table.scan().to_arrow()  # pyiceberg 0.12 cannot apply equality deletes

    plan, result = _compact(table)
    assert result.outcome == "committed"
    assert plan.applies_deletes and plan.sequence_number == 200
    assert result.delete_files_removed == 200
    assert merged_rows(table, ("id",)) == state
    assert delete_files(table) == []
    files = _data_files(table)
    assert len(files) <= 2
    # The new files carry the data sequence number of the snapshot the rewrite read.
    assert {f.sequence_number for f in files} == {plan.sequence_number}
    scanned = table.scan().to_arrow()
    assert sorted(scanned.column("id").to_pylist()) == sorted(k[0] for k in state)
    assert table.metadata.current_snapshot().summary.operation.value == "replace"  # type: ignore[union-attr]


def test_partitioned_multi_column_key_in_budgeted_runs(catalog: Catalog) -> None:
    """Identity partitions on a key column, key (region, id): a run whose byte budget
    takes one partition drops only that partition's delete files; the next takes the
    rest. The merged state is exact after every step."""
    table = _table(catalog, ["region"])
    state: State = {}
    regions = ("eu", "us", "ap")
    _change_rounds(table, state, commits=40, keys=300, per_commit=30, regions=regions)
    assert merged_rows(table, ("region", "id")) == state
    before = delete_files(table)
    by_region = {r: sum(1 for d in before if d.partition[0] == r) for r in regions}
    assert sum(by_region.values()) == len(before)

    # Exactly what the partition with the most files (planned first) reads: its data
    # and delete files.
    files = _data_files(table)
    first = max(regions, key=lambda r: sum(1 for f in files if f.file.partition[0] == r))
    budget = sum(f.file.file_size_in_bytes for f in files if f.file.partition[0] == first)
    budget += sum(d.file_size_in_bytes for d in before if d.partition[0] == first)
    plan, result = _compact(table, max_bytes=budget)
    assert result.outcome == "committed"
    compacted = {piece.partition[0] for piece in plan.bins}
    assert compacted == {first}
    assert merged_rows(table, ("region", "id")) == state
    left = delete_files(table)
    # Only the delete files of the partitions rewritten went (and ones applying to nothing).
    assert all(d.partition[0] not in compacted for d in left)
    # (Less at most the first delete of each other partition: it applies to nothing.)
    untouched = sum(n for r, n in by_region.items() if r not in compacted)
    assert untouched - (len(regions) - 1) <= len(left) <= untouched

    while delete_files(table):
        _compact(table)
    assert merged_rows(table, ("region", "id")) == state
    assert len(_data_files(table)) <= len(regions) * 2


def test_position_deletes_applied_and_dropped(catalog: Catalog) -> None:
    """Position deletes (file-scoped, as Spark writes them) beside equality deletes: the
    rows they name go, and so do the delete files."""
    table = _table(catalog)
    state: State = {}
    _change_rounds(table, state, commits=12, keys=200, per_commit=20, regions=("eu",))
    data = sorted(_data_files(table), key=lambda d: d.sequence_number)
    victims: dict[str, list[int]] = {}
    for live in data[:3]:
        rows = merged_positions(table, live.file.file_path)
        chosen = {rows[0], rows[-1]}
        victims[live.file.file_path] = sorted(pos for pos, _ in chosen)
        for _, key in chosen:
            state.pop(key)
    commit_position_deletes(table, victims)
    assert merged_rows(table, ("region", "id")) == state
    assert any(d.content == DataFileContent.POSITION_DELETES for d in delete_files(table))

    _, result = _compact(table)
    assert result.outcome == "committed"
    assert merged_rows(table, ("region", "id")) == state
    assert delete_files(table) == []


def merged_positions(table: Table, path: str) -> list[tuple[int, tuple[str, int]]]:
    """(position, key) of a data file's rows still live in the merged state."""
    with table.io.new_input(path).open() as stream:
        rows = pq.read_table(stream).to_pylist()
    live = merged_rows(table, ("region", "id"))
    return [
        (pos, (row["region"], row["id"]))
        for pos, row in enumerate(rows)
        if live.get((row["region"], row["id"])) == row
    ]


def test_a_delete_committed_during_the_rewrite_still_applies(
    catalog: Catalog, tmp_path: Path
) -> None:
    """An upsert commit lands between the rewrite and its commit, deleting and
    re-upserting keys the rewrite read: the replace commits, and the new equality
    deletes apply to the rewritten rows (they carry the older data sequence number)."""
    table = _table(catalog)
    state: State = {}
    _change_rounds(table, state, commits=15, keys=100, per_commit=20, regions=("eu",))
    table.refresh()
    (plan,) = plan_compaction(table, target_file_size=TARGET, max_bytes=1 << 30)
    new = rewrite(table, plan, budget=UNLIMITED, **WRITER)

    other = sql_catalog(tmp_path).load_table("m.upserts")  # the ingest lane's Table
    live = sorted(state)[:10]
    commit_changes(other, _rows(live[:4], 99), _keys(live[4:]), ("region", "id"))
    for r, i in live[:4]:
        state[(r, i)] = {"region": r, "id": i, "payload": f"{r}-{i}-v99", "version": 99}
    for k in live[4:]:
        state.pop(k)

    result = commit_rewrite(table, plan, new, retry=FAST)
    assert result.outcome == "committed"
    assert merged_rows(table, ("region", "id")) == state
    # The one delete file left is the late one (it still applies to the new files).
    (late,) = delete_files(table)
    assert late.file_path not in plan.known_deletes


def test_a_position_delete_committed_during_the_rewrite_moves_to_the_new_files(
    catalog: Catalog, tmp_path: Path
) -> None:
    """A position delete (another engine's row delete, or an upsert's) naming only
    inputs, committed after planning, would be lost by the replace: it moves to the new
    files instead (the rewrite knows where each row went), in the same snapshot."""
    table = _table(catalog)
    state: State = {}
    _change_rounds(table, state, commits=10, keys=100, per_commit=20, regions=("eu",))
    table.refresh()
    (plan,) = plan_compaction(table, target_file_size=TARGET, max_bytes=1 << 30)
    new = rewrite(table, plan, budget=UNLIMITED, **WRITER)

    other = sql_catalog(tmp_path).load_table("m.upserts")
    victim = plan.files[-1].file_path
    (pos, key), *_ = merged_positions(other, victim)
    commit_position_deletes(other, {victim: [pos]})
    state.pop(key)

    result = commit_rewrite(table, plan, new, retry=FAST)
    assert result.outcome == "committed"
    assert merged_rows(table, ("region", "id")) == state
    # The late delete is gone with the input it named; one delete file, naming the
    # new file that holds the row now.
    (moved,) = delete_files(table)
    assert moved.content == DataFileContent.POSITION_DELETES and moved.record_count == 1
    assert moved.lower_bounds[2147483546].decode() in {f.file_path for f in new}


def test_a_delete_naming_inputs_and_other_files_committed_during_the_rewrite_is_a_conflict(
    catalog: Catalog, tmp_path: Path
) -> None:
    """A position delete naming an input AND a file the compaction keeps cannot be
    split: ``conflict``, the new files deleted, nothing lost."""
    table = _table(catalog)
    state: State = {}
    foreign = [("eu", i) for i in range(1000, 1010)]
    table.append(_rows(foreign, -1).cast(table.schema().as_arrow()))  # kept: not the daemon's
    for k in foreign:
        state[k] = {"region": k[0], "id": k[1], "payload": f"{k[0]}-{k[1]}-v-1", "version": -1}
    _change_rounds(table, state, commits=10, keys=100, per_commit=20, regions=("eu",))
    table.refresh()
    options = {"target_file_size": TARGET, "max_bytes": 1 << 30, "rewrite_foreign": False}
    (plan,) = plan_compaction(table, **options)
    new = rewrite(table, plan, budget=UNLIMITED, **WRITER)
    other = sql_catalog(tmp_path).load_table("m.upserts")
    victim = plan.files[-1].file_path
    kept = next(p for p in _paths(other) if not is_daemon_file(p))
    (pos, key), *_ = merged_positions(other, victim)
    (kept_pos, kept_key), *_ = merged_positions(other, kept)
    commit_position_delete_across(other, {victim: [pos], kept: [kept_pos]})
    state.pop(key)
    state.pop(kept_key)

    result = commit_rewrite(table, plan, new, retry=FAST)
    assert result.outcome == "conflict" and "applies to files being replaced" in result.detail
    assert all(not local_path(f.file_path).exists() for f in new)
    assert merged_rows(table, ("region", "id")) == state


def test_delete_files_stay_while_a_file_the_compaction_keeps_needs_them(
    catalog: Catalog,
) -> None:
    """Another writer's data file holds rows that later equality deletes apply to. Kept
    (``rewrite_foreign=False``), those delete files stay and every other one goes;
    rewritten (the default), they go too. The merged state is exact throughout."""
    table = _table(catalog)
    state: State = {}
    foreign_keys = [("eu", i) for i in range(1000, 1010)]
    table.append(_rows(foreign_keys, -1).cast(table.schema().as_arrow()))  # pyiceberg's file
    for k in foreign_keys:
        state[k] = {"region": k[0], "id": k[1], "payload": f"{k[0]}-{k[1]}-v-1", "version": -1}
    _change_rounds(table, state, commits=10, keys=100, per_commit=20, regions=("eu",))
    commit_changes(table, _rows(foreign_keys[:3], 50), _keys(foreign_keys[3:5]), ("region", "id"))
    for r, i in foreign_keys[:3]:
        state[(r, i)] = {"region": r, "id": i, "payload": f"{r}-{i}-v50", "version": 50}
    for k in foreign_keys[3:5]:
        state.pop(k)
    _change_rounds(table, state, commits=5, keys=100, per_commit=20, regions=("eu",), start=11)
    assert merged_rows(table, ("region", "id")) == state

    _, result = _compact(table, rewrite_foreign=False)
    assert result.outcome == "committed"
    assert merged_rows(table, ("region", "id")) == state
    # Every delete file committed after the foreign append applies to it: all stay.
    assert len(delete_files(table)) == 16
    foreign = [d for d in _data_files(table) if not is_daemon_file(d.file.file_path)]
    assert len(foreign) == 1

    plan, result = _compact(table)
    assert result.outcome == "committed" and result.delete_files_removed == 16
    assert foreign[0].file in plan.files
    assert merged_rows(table, ("region", "id")) == state
    assert delete_files(table) == []
    assert all(is_daemon_file(d.file.file_path) for d in _data_files(table))


def test_delete_files_that_apply_to_nothing_are_dropped_alone(catalog: Catalog) -> None:
    """The first upsert commit into a partition: its equality delete applies to no
    older row. A run with nothing to rewrite drops it (and nothing else changes)."""
    table = _table(catalog, ["region"])
    commit_changes(table, _rows([("eu", 1), ("eu", 2)], 0), None, ("region", "id"))
    commit_changes(table, _rows([("us", 1)], 0), None, ("region", "id"))
    commit_changes(table, _rows([("us", 2)], 1), _keys([("us", 1)]), ("region", "id"))
    assert len(delete_files(table)) == 3
    state = merged_rows(table, ("region", "id"))
    assert sorted(state) == [("eu", 1), ("eu", 2), ("us", 2)]
    data_before = {d.file.file_path for d in _data_files(table)}

    table.refresh()
    (plan,) = plan_compaction(table, target_file_size=TARGET, max_bytes=1 << 30, min_input_files=5)
    # us: the 2nd commit's delete applies to the 1st commit's file (seq 2 < 3): kept
    # unless rewritten; the dirty us files are rewritten, both us deletes dropped.
    assert {piece.partition[0] for piece in plan.bins} == {"us"}
    new = rewrite(table, plan, budget=UNLIMITED, **WRITER)
    result = commit_rewrite(table, plan, new, retry=FAST)
    assert result.outcome == "committed" and result.delete_files_removed == 3
    assert delete_files(table) == []
    assert merged_rows(table, ("region", "id")) == state
    assert {d.file.file_path for d in _data_files(table)} & data_before == {
        f for f in data_before if "region=eu" in f
    }


def test_expiry_and_orphan_sweep_handle_delete_files(catalog: Catalog) -> None:
    """After a compaction dropped delete files, expiring the older snapshots deletes
    them (reached only through expired delete manifests) and keeps the live ones; the
    orphan sweep removes an uncommitted daemon delete file and keeps committed ones."""
    table = _table(catalog)
    state: State = {}
    _change_rounds(table, state, commits=8, keys=100, per_commit=20, regions=("eu",))
    dropped = {d.file_path for d in delete_files(table)}
    _, result = _compact(table)
    assert result.outcome == "committed"
    _change_rounds(table, state, commits=2, keys=100, per_commit=20, regions=("eu",), start=8)
    kept = {d.file_path for d in delete_files(table)}
    assert len(kept) == 2 and not kept & dropped

    table.refresh()
    current = table.metadata.current_snapshot()
    assert current is not None
    older = {
        s.snapshot_id for s in table.metadata.snapshots if s.snapshot_id != current.snapshot_id
    }
    expired = commit_expiry(table, lambda metadata: older)
    assert expired is not None
    garbage = find_garbage(
        table.io, expired.snapshots, table.metadata, deadline=time.monotonic() + 60
    )
    found = {path for kind, path in garbage.files if kind == DELETE_FILE}
    assert dropped <= found and not kept & found
    assert not dropped & {path for kind, path in garbage.files if kind == DATA_FILE}
    outcome = delete_files_on_disk(
        table.io, garbage.files, limit=10_000, deadline=time.monotonic() + 60
    )
    assert not outcome.failed
    assert all(not local_path(p).exists() for p in dropped)
    assert all(local_path(p).exists() for p in kept)
    assert merged_rows(table, ("region", "id")) == state

    # An uncommitted delete file of a segment written hours ago, and the live ones.
    stray = local_path(next(iter(kept))).with_name(
        f"{uuid7_at(time.time() - 3 * HOUR)}-{INCARNATION}-eq-00000-00000.parquet"
    )
    stray.write_bytes(local_path(next(iter(kept))).read_bytes())
    for path in [stray, *(local_path(p) for p in kept)]:
        then = time.time() - 3 * HOUR
        os.utime(path, (then, then))
    assert is_daemon_file(str(stray))
    swept = remove_orphans(
        table,
        owner=FileOwner("aaaaaaaaaaaa", frozenset({INCARNATION})),
        is_spooled=lambda _: False,
    )
    assert swept.removed == 1 and not stray.exists()
    assert all(local_path(p).exists() for p in kept)
    assert merged_rows(table, ("region", "id")) == state


def _assert_equality_ids_declared_int(table: Table) -> None:
    """Delete manifests declare equality_ids list<int> as the spec does (pyiceberg 0.12
    writes long, which Spark cannot read: "Long cannot be cast to Integer")."""
    snapshot = table.metadata.current_snapshot()
    assert snapshot is not None
    manifest = next(m for m in snapshot.manifests(table.io) if m.content == ManifestContent.DELETES)
    with table.io.new_input(manifest.manifest_path).open() as stream:
        header = stream.read(64 * 1024)
    declared = header[header.index(b'"name": "equality_ids"') :][:200]
    assert b'"items": "int"' in declared, declared


async def test_the_daemons_scheduled_maintenance_keeps_an_upsert_table_bounded(
    make_config: Any,
) -> None:
    """A real `Icespool` ingesting change batches into an upsert table, maintenance every
    half second: runs apply the deletes and drop the delete files while changes arrive;
    once they stop, no delete file is left and the merged state is exact."""
    config = make_config(
        tables=[
            {
                "name": "m.upserts",
                "create": True,
                "schema": COLUMNS,
                "key": ["region", "id"],
                "partition_by": ["region"],
            }
        ],
        maintenance={"interval": "500ms", "lease_ttl": "30s", "compaction_min_files": 2},
    )
    rng = random.Random(3)
    state: State = {}
    async with Icespool(config) as service:
        writer = service.writer("m.upserts")
        for n in range(40):
            touched = rng.sample([(r, i) for r in ("eu", "us") for i in range(150)], 30)
            ops = [DELETE if rng.random() < 0.3 else UPSERT for _ in touched]
            await writer.append(with_ops(_rows(touched, n), pa.array(ops, pa.int8()), KEY))
            await writer.flush()
            for key, op in zip(touched, ops, strict=True):
                if op == UPSERT:
                    state[key] = _rows([key], n).to_pylist()[0]
                else:
                    state.pop(key, None)
            await asyncio.sleep(0.05)
        assert service._catalog is not None
        table = service._catalog.load_table("m.upserts")
        deadline = time.monotonic() + 30
        while delete_files(table):
            assert time.monotonic() < deadline, service.maintenance.status("m.upserts")
            await asyncio.sleep(0.2)
        status = service.maintenance.status("m.upserts")
        assert status is not None and status["last_run"]["outcome"] == "ok", status
        assert merged_rows(table, KEY) == state
        assert {(r["region"], r["id"]): r for r in read_merged(table).to_pylist()} == state
        assert len(_data_files(table)) <= 4


_KEY_SAMPLES: dict[str, list[Any]] = {
    "uuid": [uuid.UUID(int=i * 7919 + 1) for i in range(30)],
    "fixed(4)": [bytes([i, 1, 2, 3]) for i in range(30)],
    "binary": [bytes(range(i + 1)) for i in range(30)],
    "decimal(12, 2)": [Decimal(i * 37).scaleb(-2) for i in range(30)],
    "date": [dt.date(2024, 1, 1) + dt.timedelta(days=i) for i in range(30)],
    "timestamptz": [
        dt.datetime(2024, 1, 1, tzinfo=dt.UTC) + dt.timedelta(hours=i) for i in range(30)
    ],
    "string": [f"k{i}" for i in range(30)],
}


@pytest.mark.parametrize("kind", sorted(_KEY_SAMPLES))
def test_compaction_applies_equality_deletes_for_every_key_type(
    catalog: Catalog, kind: str
) -> None:
    """The deletes of a table keyed by any column type Iceberg allows are applied when
    its files are rewritten (a uuid key once failed every compaction: Arrow cannot hash
    its extension type), and the merged state stays the same."""
    schema = parse_schema(
        [{"name": "k", "type": kind, "required": True}, {"name": "v", "type": "long"}]
    )
    table = ensure_table(
        catalog, "m.typed", schema, parse_partition_spec(schema, []), {}, create=True
    )
    values = _KEY_SAMPLES[kind]
    first = pa.table({"k": values, "v": list(range(len(values)))})
    commit_changes(table, first, None, ("k",))
    commit_changes(
        table,
        first.slice(0, 10).set_column(1, "v", pa.array([-1] * 10)),
        first.slice(20).select(["k"]),
        ("k",),
    )
    before = merged_rows(table, ("k",))
    assert len(before) == 20
    _compact(table)
    assert not delete_files(table)
    assert merged_rows(table, ("k",)) == before
