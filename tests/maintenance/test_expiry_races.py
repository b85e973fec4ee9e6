"""Expiry's garbage search when another writer's expiry (Spark's ``expire_snapshots``)
deletes files between the daemon's expiry commit and its search.

The table: three appends of daemon files, then a compaction replacing all of them (the
appends' manifests are then listed by no newer snapshot), then one more append. The
daemon expires the three appends; "Spark" then deletes what it would have deleted.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation, Snapshot
from support.maintenance_helpers import (
    ENCODE,
    INCARNATION,
    append_daemon_files,
    local_path,
    rows,
    sql_catalog,
    table_ids,
)

from icespool.iceberg import commit_expiry
from icespool.iceberg._catalog import ensure_table
from icespool.maintenance import IoBudget, commit_rewrite, find_garbage, plan_compaction, rewrite
from icespool.maintenance._expire import DATA_FILE, MANIFEST, ExpiryConflictError
from icespool.schema import parse_partition_spec, parse_schema

COLUMNS: list[dict[str, object]] = [
    {"name": "id", "type": "long", "required": True},
    {"name": "payload", "type": "string"},
]


def _table(tmp_path: Path) -> tuple[Table, list[Snapshot]]:
    """The table described above, and the three expired append snapshots."""
    schema = parse_schema(COLUMNS)
    table = ensure_table(
        sql_catalog(tmp_path), "m.t", schema, parse_partition_spec(schema, []), {}, True
    )
    for n in range(3):
        append_daemon_files(table, [rows(range(n * 10, n * 10 + 10))])
    table.refresh()
    (plan,) = plan_compaction(table, target_file_size=1 << 20, min_input_files=2, max_bytes=1 << 30)
    new = rewrite(
        table,
        plan,
        budget=IoBudget(None),
        row_group_records=ENCODE["row_group_records"],
        compression="zstd",
        incarnation=INCARNATION,
    )
    assert commit_rewrite(table, plan, new).outcome == "committed"
    append_daemon_files(table, [rows(range(30, 40))])
    table.refresh()
    appends = [
        s for s in table.metadata.snapshots if s.summary and s.summary.operation == Operation.APPEND
    ]
    expired = commit_expiry(table, lambda metadata: {s.snapshot_id for s in appends[:3]})
    assert expired is not None and len(expired.snapshots) == 3
    return table, list(expired.snapshots)


def test_a_manifest_another_writer_deleted_is_skipped_and_the_rest_is_found(
    tmp_path: Path,
) -> None:
    table, expired = _table(tmp_path)
    whole = find_garbage(table.io, expired, table.metadata, deadline=time.monotonic() + 60)
    manifests = [path for kind, path in whole.files if kind == MANIFEST]
    assert len(manifests) == 3  # the three appends' own manifests
    gone = manifests[0]
    listed = next(m for s in expired for m in s.manifests(table.io) if m.manifest_path == gone)
    its_files = {(DATA_FILE, e.data_file.file_path) for e in listed.fetch_manifest_entry(table.io)}
    assert len(its_files) == 1 and its_files < set(whole.files)
    local_path(gone).unlink()  # "Spark" expired it (and deleted its data file) first

    garbage = find_garbage(table.io, expired, table.metadata, deadline=time.monotonic() + 60)
    # The rest is found; what only the vanished manifest named is left alone.
    assert set(garbage.files) == set(whole.files) - {(MANIFEST, gone)} - its_files
    assert table_ids(table) == list(range(40))


def test_a_retained_snapshots_list_another_writer_deleted_is_a_conflict_not_garbage(
    tmp_path: Path,
) -> None:
    """Skipping the vanished list could let files its successors still reach look
    unreferenced; the search gives up and is repeated on the table as it is then."""
    table, expired = _table(tmp_path)
    current = table.metadata.current_snapshot()
    assert current is not None and current.parent_snapshot_id is not None
    replace = table.metadata.snapshot_by_id(current.parent_snapshot_id)
    assert replace is not None
    local_path(replace.manifest_list).unlink()
    with pytest.raises(ExpiryConflictError, match="is gone"):
        find_garbage(table.io, expired, table.metadata, deadline=time.monotonic() + 60)
