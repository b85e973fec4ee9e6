"""Maintenance on a bad day: what a hostile user or an unlucky moment does to expiry,
compaction and the commits around them, one small case each.

Real SQLite SQL catalog, local warehouse, real pyiceberg Table objects (as in
test_compaction.py and test_orphans.py).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from pyiceberg.table import Table
from support.maintenance_helpers import append_daemon_files, rows, sql_catalog, table_ids

from daemon.iceberg import commit_expiry, commit_properties
from daemon.iceberg._catalog import ensure_table
from daemon.maintenance import delete_files, find_garbage
from daemon.schema import parse_partition_spec, parse_schema

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
