"""Compaction of the daemon's small files: one `replace` snapshot, every row exactly once.

Real SQLite SQL catalog, local warehouse, real pyiceberg Table objects. "Another writer"
is a second Table object loaded from a second catalog instance on the same database.
Races at the instant of the commit go through `RacingCatalog`, this test's own seam: a
SqlCatalog whose next `commit_table` first runs the other writer's commit (or fails).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.expressions import EqualTo
from pyiceberg.table import CommitTableResponse, Table
from pyiceberg.table.snapshots import Operation
from pyiceberg.table.sorting import NullOrder
from pyiceberg.table.update import AssertCurrentSchemaId, TableRequirement, TableUpdate
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import LongType, StringType
from support.json_values import storage_type
from support.maintenance_helpers import (
    ENCODE,
    INCARNATION,
    append_daemon_files,
    encode_daemon_files,
    live_files,
    local_path,
    rows,
    sql_catalog,
    table_ids,
)
from support.matrix_values import arrow_value, column_values, columns, every_type

from icespool.errors import CommitError
from icespool.iceberg import CommitOutcomeUnknownError, commit_files
from icespool.iceberg._catalog import ensure_table
from icespool.maintenance import (
    COMPACTION_SUMMARY_KEY,
    CompactionConflictError,
    CompactionError,
    CompactionPlan,
    IoBudget,
    commit_rewrite,
    is_daemon_file,
    plan_compaction,
    rewrite,
)
from icespool.maintenance._compact import payload_bytes
from icespool.runtime.retry import Backoff
from icespool.schema import arrow_schema_for, conform, parse_partition_spec, parse_schema

TARGET = 64 * 1024
FAST = Backoff(attempts=4, base=0.001, cap=0.01)
COLUMNS: list[dict[str, object]] = [
    {"name": "id", "type": "long", "required": True},
    {"name": "payload", "type": "string"},
    {"name": "kind", "type": "string"},
]
WRITER = {
    "row_group_records": ENCODE["row_group_records"],
    "compression": "zstd",
    "incarnation": INCARNATION,
}
UNLIMITED = IoBudget(None)


class RacingCatalog(SqlCatalog):
    """The seam: the next commit first runs ``race`` (another writer's commit), or
    lands and then raises ``lose_answer`` (a lost response), or raises ``refuse``
    without landing, for ``refuse_times`` commits."""

    race: Callable[[], None] | None = None
    lose_answer: Exception | None = None
    refuse: Exception | None = None
    refuse_times = 0

    def commit_table(
        self,
        table: Table,
        requirements: tuple[TableRequirement, ...],
        updates: tuple[TableUpdate, ...],
    ) -> CommitTableResponse:
        race, self.race = self.race, None
        if race is not None:
            race()
        if self.refuse is not None and self.refuse_times > 0:
            self.refuse_times -= 1
            raise self.refuse
        response = super().commit_table(table, requirements, updates)
        lost, self.lose_answer = self.lose_answer, None
        if lost is not None:
            raise lost
        return response


@pytest.fixture
def catalog(tmp_path: Path) -> RacingCatalog:
    return RacingCatalog(
        "lake",
        uri=f"sqlite:///{tmp_path}/catalog.db",
        warehouse=(tmp_path / "warehouse").as_uri(),
    )


@pytest.fixture
def other(tmp_path: Path, catalog: RacingCatalog) -> Catalog:
    """Another writer's catalog on the same database."""
    return sql_catalog(tmp_path)


def _table(catalog: Catalog, partition_by: list[str] | None = None) -> Table:
    schema = parse_schema(COLUMNS)
    spec = parse_partition_spec(schema, partition_by or [])
    return ensure_table(catalog, "m.events", schema, spec, {}, create=True)


def _chunks(count: int, per_file: int, start: int = 0, kind: str = "k") -> list[pa.Table]:
    return [
        rows(range(start + n * per_file, start + (n + 1) * per_file), kind=[kind] * per_file)
        for n in range(count)
    ]


def _compact(table: Table, **plan: Any) -> tuple[CompactionPlan, list[Any], Any]:
    table.refresh()
    plans = plan_compaction(table, target_file_size=TARGET, max_bytes=1 << 30, **plan)
    assert len(plans) == 1
    new = rewrite(table, plans[0], budget=UNLIMITED, **WRITER)
    return plans[0], new, commit_rewrite(table, plans[0], new, retry=FAST)


def _foreign_append(table: Table, ids: range) -> None:
    data = rows(ids, kind=["f"] * len(ids))
    table.append(pa.Table.from_batches([conform(data, arrow_schema_for(table))]))


def _replace_snapshots(table: Table) -> list[int]:
    table.refresh()
    return [
        s.snapshot_id
        for s in table.metadata.snapshots
        if s.summary is not None and s.summary.operation == Operation.REPLACE
    ]


# ------------------------------------------------------------------ the happy path


def test_small_files_merge_into_target_sized_files_in_one_replace_snapshot(
    catalog: RacingCatalog, other: Catalog
) -> None:
    table = _table(catalog)
    daemon_files = append_daemon_files(table, _chunks(120, 40))
    foreign = other.load_table("m.events")
    for n in range(3):  # another writer's small files: not the daemon's to compact
        _foreign_append(foreign, range(10_000 + 10 * n, 10_010 + 10 * n))
    foreign_paths = set(live_files(foreign)) - {f.file_path for f in daemon_files}
    assert len(foreign_paths) == 3 and not any(is_daemon_file(p) for p in foreign_paths)
    table.refresh()
    before = table.current_snapshot()
    assert before is not None

    plan, new, result = _compact(table)

    payload = sum(payload_bytes(f) for f in daemon_files)
    assert {f.file_path for f in plan.files} == {f.file_path for f in daemon_files}
    assert result.outcome == "committed" and result.files_replaced == 120
    assert len(new) == len(plan.bins) == math.ceil(payload / TARGET)
    assert all(f.file_size_in_bytes <= TARGET for f in new)
    assert all(local_path(f.file_path).name.startswith("c-") for f in new)
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.snapshot_id == result.snapshot_id
    assert snapshot.parent_snapshot_id == before.snapshot_id
    summary = snapshot.summary
    assert summary is not None and summary.operation == Operation.REPLACE
    assert summary[COMPACTION_SUMMARY_KEY] == plan.plan_id
    assert summary["icespool.segments"] is None  # never mistaken for a flush
    assert summary["deleted-data-files"] == "120" and summary["added-data-files"] == str(len(new))
    assert summary["total-records"] == str(120 * 40 + 30)
    assert table_ids(table) == list(range(120 * 40)) + list(range(10_000, 10_030))
    assert set(live_files(table)) == foreign_paths | {f.file_path for f in new}
    # The inputs stay on disk for time travel: expiry removes them with their snapshot.
    assert all(local_path(f.file_path).exists() for f in daemon_files)
    old = table.scan(snapshot_id=before.snapshot_id).to_arrow().column("id").to_pylist()
    assert sorted(old) == table_ids(table)

    # Outputs are merged only with outputs (tiers): new flush files are compacted on
    # their own, the compacted files stay as they are.
    fresh = append_daemon_files(table, _chunks(6, 40, start=50_000))
    plan2, new2, result2 = _compact(table)
    assert {f.file_path for f in plan2.files} == {f.file_path for f in fresh}
    assert result2.outcome == "committed" and len(new2) == 1
    assert set(live_files(table)) == foreign_paths | {f.file_path for f in [*new, *new2]}
    assert table_ids(table) == sorted(
        [*range(120 * 40), *range(10_000, 10_030), *range(50_000, 50_240)]
    )
    table.refresh()
    assert plan_compaction(table, target_file_size=TARGET, max_bytes=1 << 30) == []


def test_partitioned_table_compacts_each_partition_of_the_current_spec_only(
    catalog: RacingCatalog,
) -> None:
    table = _table(catalog)
    old_spec = append_daemon_files(table, _chunks(6, 20, start=0, kind="a"))
    with table.update_spec() as update:
        update.add_identity("kind")
    a = append_daemon_files(table, _chunks(6, 20, start=1_000, kind="a"))
    b = append_daemon_files(table, _chunks(7, 20, start=2_000, kind="b"))
    c = append_daemon_files(table, _chunks(3, 20, start=3_000, kind="c"))  # under min files

    plan, new, result = _compact(table)

    assert result.outcome == "committed"
    assert {f.file_path for f in plan.files} == {f.file_path for f in a + b}
    assert plan.partitions == 2
    assert sorted((f.partition for f in new), key=str) == [Record("a"), Record("b")]
    for data_file in new:
        with table.io.new_input(data_file.file_path).open() as stream:
            kinds = set(pq.read_table(stream).column("kind").to_pylist())
        assert kinds == {data_file.partition[0]}
    live = set(live_files(table))
    assert live == {f.file_path for f in [*old_spec, *c, *new]}
    assert table_ids(table) == sorted(
        [*range(120), *range(1_000, 1_120), *range(2_000, 2_140), *range(3_000, 3_060)]
    )


def test_a_sorted_table_gets_sorted_files(catalog: RacingCatalog) -> None:
    table = _table(catalog)
    with table.update_sort_order() as order:
        order.asc("kind", IdentityTransform(), NullOrder.NULLS_FIRST)
        order.desc("id", IdentityTransform())
    kinds = ["b", None, "a"]
    chunks = [
        rows(range(n * 10, n * 10 + 10), kind=[kinds[(n + i) % 3] for i in range(10)])
        for n in range(6)
    ]
    append_daemon_files(table, chunks)

    _, new, result = _compact(table)

    assert result.outcome == "committed" and len(new) == 1
    assert new[0].sort_order_id == table.sort_order().order_id != 0
    with table.io.new_input(new[0].file_path).open() as stream:
        got = pq.read_table(stream).select(["kind", "id"]).to_pylist()
    rank = {None: 0, "a": 1, "b": 2}
    assert got == sorted(got, key=lambda r: (rank[r["kind"]], -r["id"]))
    assert table_ids(table) == list(range(60))


def _raw_rows(table: Table) -> list[dict[str, Any]]:
    """Every row of the live files as pyarrow reads them (pyiceberg's scan would turn a
    null list of structs into an empty one), sorted by id."""
    found: list[dict[str, Any]] = []
    for path in live_files(table):
        with table.io.new_input(path).open() as stream:
            found += pq.read_table(stream).to_pylist()
    return sorted(found, key=lambda row: row["id"])


def test_every_type_survives_compaction_value_for_value(catalog: RacingCatalog) -> None:
    shape = every_type()
    schema = parse_schema(columns(shape))
    spec = parse_partition_spec(schema, ["bucket(3, id)"])
    table = ensure_table(catalog, "m.types", schema, spec, {}, create=True)
    arrow = arrow_schema_for(table)
    chunks = []
    for n in range(6):
        ids = list(range(n * 40, n * 40 + 40))
        data = {"id": pa.array(ids, pa.int64())}
        for column in shape:
            values = column_values(column.node, ids)
            data[column.name] = pa.array(
                [arrow_value(column.node, v) for v in values],
                storage_type(arrow.field(column.name).type),
            )
        chunks.append(pa.table(data))
    append_daemon_files(table, chunks)
    before = _raw_rows(table)
    assert [row["id"] for row in before] == list(range(240))

    plan, new, result = _compact(table)

    assert result.outcome == "committed" and plan.partitions == 3 and len(new) == 3
    assert _raw_rows(table) == before


def test_files_of_older_schemas_are_read_by_field_id(catalog: RacingCatalog) -> None:
    schema = parse_schema([*COLUMNS, {"name": "n", "type": "int"}])
    table = ensure_table(catalog, "m.evolved", schema, parse_partition_spec(schema, []), {}, True)
    append_daemon_files(table, [rows(range(i * 5, i * 5 + 5), n=[i] * 5) for i in range(3)])
    with table.update_schema() as update:
        update.rename_column("payload", "body")
        update.update_column("n", LongType())
        update.add_column("extra", StringType())
    fresh = [
        pa.table(
            {
                "id": list(range(i * 5, i * 5 + 5)),
                "body": ["b"] * 5,
                "n": [2**40] * 5,
                "extra": ["e"] * 5,
            }
        )
        for i in range(3, 6)
    ]
    append_daemon_files(table, fresh)
    expected = table.scan().to_arrow().sort_by("id").to_pylist()
    assert (
        expected[0]["body"] == rows(range(1))["payload"][0].as_py() and expected[0]["extra"] is None
    )

    _, new, result = _compact(table)

    assert result.outcome == "committed" and len(new) == 1
    assert table.scan().to_arrow().sort_by("id").to_pylist() == expected


# ------------------------------------------------------------------ other writers


@pytest.mark.parametrize("move", ["row delete", "overwrite", "row delete at the commit"])
def test_another_writer_removing_an_input_ends_in_conflict_with_nothing_committed(
    catalog: RacingCatalog, other: Catalog, move: str
) -> None:
    table = _table(catalog)
    append_daemon_files(table, _chunks(8, 10))
    table.refresh()
    (plan,) = plan_compaction(table, target_file_size=TARGET, max_bytes=1 << 30)
    new = rewrite(table, plan, budget=UNLIMITED, **WRITER)
    assert all(local_path(f.file_path).exists() for f in new)
    writer = other.load_table("m.events")
    expected = [i for i in range(80) if i != 7]
    if move == "row delete":
        writer.delete(EqualTo("id", 7))  # copy-on-write: the file holding 7 is replaced
    elif move == "overwrite":
        replacement = conform(rows(range(500, 505), kind=["o"] * 5), arrow_schema_for(writer))
        writer.overwrite(pa.Table.from_batches([replacement]))
        expected = list(range(500, 505))
    else:
        catalog.race = lambda: writer.delete(EqualTo("id", 7))

    result = commit_rewrite(table, plan, new, retry=FAST)

    assert result.outcome == "conflict" and result.snapshot_id is None
    assert "no longer live" in result.detail
    assert not any(local_path(f.file_path).exists() for f in new)  # nothing left behind
    assert _replace_snapshots(table) == []
    assert table_ids(table) == expected


@pytest.mark.parametrize("when", ["before the commit", "at the commit"])
def test_a_concurrent_append_does_not_stop_compaction_and_its_rows_survive(
    catalog: RacingCatalog, other: Catalog, when: str
) -> None:
    table = _table(catalog)
    append_daemon_files(table, _chunks(8, 10))
    table.refresh()
    (plan,) = plan_compaction(table, target_file_size=TARGET, max_bytes=1 << 30)
    new = rewrite(table, plan, budget=UNLIMITED, **WRITER)
    writer = other.load_table("m.events")
    appended: list[str] = []

    def append() -> None:
        segment, files = encode_daemon_files(writer, rows(range(900, 920), kind=["z"] * 20))
        commit_files(writer, files, segment_ids=[segment], summary={}, retry=FAST)
        appended.extend(f.file_path for f in files)

    if when == "before the commit":
        append()
    else:
        catalog.race = append

    result = commit_rewrite(table, plan, new, retry=FAST)

    assert result.outcome == "committed"
    assert result.attempts == (1 if when == "before the commit" else 2)
    assert set(live_files(table)) == {f.file_path for f in new} | set(appended)
    assert table_ids(table) == [*range(80), *range(900, 920)]
    assert _replace_snapshots(table) == [result.snapshot_id]


def test_a_lost_answer_is_resolved_by_looking_and_an_unseen_outcome_keeps_the_files(
    catalog: RacingCatalog,
) -> None:
    table = _table(catalog)
    append_daemon_files(table, _chunks(12, 10))
    table.refresh()
    (plan,) = plan_compaction(table, target_file_size=TARGET, max_bytes=1 << 30)

    # Never seen: the files may be referenced, so they stay (for the orphan sweep).
    new = rewrite(table, plan, budget=UNLIMITED, **WRITER)
    catalog.refuse, catalog.refuse_times = ConnectionError("catalog unreachable"), FAST.attempts
    with pytest.raises(CommitOutcomeUnknownError):
        commit_rewrite(table, plan, new, retry=FAST)
    assert all(local_path(f.file_path).exists() for f in new)  # may be referenced: kept
    assert _replace_snapshots(table) == []
    assert table_ids(table) == list(range(120))

    # Landed, answer lost: the next attempt finds its own snapshot; one replace, not two.
    catalog.refuse_times = 0
    catalog.lose_answer = ConnectionResetError("answer lost")
    result = commit_rewrite(table, plan, new, retry=FAST)
    assert result.outcome == "committed" and result.attempts == 2
    assert _replace_snapshots(table) == [result.snapshot_id]
    assert set(live_files(table)) == {f.file_path for f in new}
    assert table_ids(table) == list(range(120))


def test_a_failing_requirement_such_as_a_lost_lease_commits_nothing(
    catalog: RacingCatalog,
) -> None:
    table = _table(catalog)
    append_daemon_files(table, _chunks(6, 10))
    table.refresh()
    (plan,) = plan_compaction(table, target_file_size=TARGET, max_bytes=1 << 30)
    new = rewrite(table, plan, budget=UNLIMITED, **WRITER)
    lost = AssertCurrentSchemaId(current_schema_id=table.schema().schema_id + 1)

    with pytest.raises(CommitError, match="not committed after 4 attempts"):
        commit_rewrite(table, plan, new, retry=FAST, requirements=[lost])

    assert not any(local_path(f.file_path).exists() for f in new)
    assert _replace_snapshots(table) == []
    assert table_ids(table) == list(range(60))


def test_an_input_gone_from_storage_is_a_conflict_and_leaves_nothing(
    catalog: RacingCatalog,
) -> None:
    table = _table(catalog)
    files = append_daemon_files(table, _chunks(6, 10))
    table.refresh()
    (plan,) = plan_compaction(table, target_file_size=TARGET, max_bytes=1 << 30)
    local_path(files[-1].file_path).unlink()
    data = local_path(files[0].file_path).parent

    with pytest.raises(CompactionConflictError, match="is gone"):
        rewrite(table, plan, budget=UNLIMITED, **WRITER)
    assert not list(data.glob("c-*"))


def test_max_bytes_and_max_files_bound_a_run_and_min_input_files_a_partition(
    catalog: RacingCatalog,
) -> None:
    table = _table(catalog)
    files = append_daemon_files(table, _chunks(10, 10))
    table.refresh()
    sizes = [f.file_size_in_bytes for f in files]
    (plan,) = plan_compaction(
        table, target_file_size=TARGET, max_bytes=sum(sizes[:4]) + sizes[4] // 2
    )
    assert [f.file_path for f in plan.files] == [f.file_path for f in files[:4]]
    (plan,) = plan_compaction(table, target_file_size=TARGET, max_bytes=1 << 30, max_files=3)
    assert [f.file_path for f in plan.files] == [f.file_path for f in files[:3]]
    assert (
        plan_compaction(table, target_file_size=TARGET, max_bytes=1 << 30, min_input_files=11) == []
    )
    # The table's write.target-file-size-bytes wins: files over 3/4 of it are not small.
    with table.transaction() as transaction:
        transaction.set_properties({"write.target-file-size-bytes": str(min(sizes))})
    assert plan_compaction(table, target_file_size=TARGET, max_bytes=1 << 30) == []


# ------------------------------------------------------------------ the I/O budget


def test_the_budget_holds_a_rewrite_to_its_rate(catalog: RacingCatalog) -> None:
    table = _table(catalog)
    append_daemon_files(table, _chunks(40, 400))
    table.refresh()
    (plan,) = plan_compaction(table, target_file_size=1 << 20, max_bytes=1 << 30)
    # The same rewrite without a budget, in the same run: the work's own time (the
    # files have the plan's names, so the budgeted run below overwrites them).
    started = time.monotonic()
    rewrite(table, plan, budget=IoBudget(None), **WRITER)
    unbudgeted = time.monotonic() - started
    rate = 800_000.0  # bytes/s: ~1.2 s for this plan's reads and writes
    budget = IoBudget(rate, burst_seconds=0.05)

    started = time.monotonic()
    new = rewrite(table, plan, budget=budget, **WRITER)
    elapsed = time.monotonic() - started

    written = sum(f.file_size_in_bytes for f in new)
    assert budget.used >= plan.bytes + written * 0.9  # every read and write charged
    owed = (budget.used - rate * 0.05) / rate  # seconds the budget must take
    # (At rest the work alone takes ~0.3 s: the budget is what limits this run.)
    # Never faster than the budget; no slower than the budget or the work needs.
    assert owed * 0.98 <= elapsed <= max(owed, unbudgeted) * 1.25 + 0.3, (
        owed,
        unbudgeted,
        elapsed,
    )
    assert commit_rewrite(table, plan, new, retry=FAST).outcome == "committed"


def test_the_budget_is_shared_fairly_by_threads_and_honours_deadlines() -> None:
    rate = 2_000_000.0
    budget = IoBudget(rate, burst_seconds=0.01)
    started = time.monotonic()
    threads = [
        threading.Thread(target=lambda: [budget.acquire(10_000) for _ in range(40)])
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    assert budget.used == 1_600_000
    assert (1_600_000 - rate * 0.01) / rate * 0.98 <= elapsed <= 1_600_000 / rate + 1.0

    with pytest.raises(TimeoutError):
        budget.acquire(10_000_000, deadline=time.monotonic() + 0.5)
    assert budget.used == 1_600_000  # a refused request takes nothing
    assert IoBudget(None).acquire(1 << 40) == 0.0


def test_closing_the_budget_stops_a_waiting_rewrite_at_once(catalog: RacingCatalog) -> None:
    table = _table(catalog)
    files = append_daemon_files(table, _chunks(12, 40))
    table.refresh()
    (plan,) = plan_compaction(table, target_file_size=8 * 1024, max_bytes=1 << 30)
    budget = IoBudget(1_000.0, burst_seconds=0.001)  # the first file alone waits seconds
    failure: list[BaseException] = []

    def run() -> None:
        try:
            rewrite(table, plan, budget=budget, **WRITER)
        except BaseException as exc:
            failure.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    time.sleep(0.2)
    started = time.monotonic()
    budget.close()
    worker.join(timeout=5)
    assert not worker.is_alive() and time.monotonic() - started < 3  # not the ~20 s the budget asks
    assert isinstance(failure[0], CompactionError) and "closed" in str(failure[0])
    assert not list(local_path(files[0].file_path).parent.glob("c-*"))
    with pytest.raises(CompactionError):
        budget.acquire(1)


def test_a_rewrite_past_its_deadline_stops_and_leaves_nothing(catalog: RacingCatalog) -> None:
    table = _table(catalog)
    files = append_daemon_files(table, _chunks(12, 40))
    table.refresh()
    (plan,) = plan_compaction(table, target_file_size=8 * 1024, max_bytes=1 << 30)
    assert len(plan.bins) > 1
    budget = IoBudget(plan.bins[0].bytes * 1.2, burst_seconds=1.0)  # one bin, then waits
    with pytest.raises(TimeoutError):
        rewrite(table, plan, budget=budget, deadline=time.monotonic() + 0.6, **WRITER)
    assert not list(local_path(files[0].file_path).parent.glob("c-*"))
