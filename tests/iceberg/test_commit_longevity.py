"""Commits that stay cheap as a table ages: manifest merging by the standard table
properties, a conflict in the middle of a merge, the defaults of tables the daemon
creates, and applying them to an existing table on opt-in.

Real SQLite SQL catalog (the daemon's own `IcespoolSqlCatalog`) and local warehouse.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.manifest import DataFile, ManifestFile
from pyiceberg.table import CommitTableResponse, Table
from pyiceberg.table.update import TableRequirement, TableUpdate

from icespool.iceberg import (
    SEGMENTS_SUMMARY_KEY,
    TABLE_DEFAULTS,
    IcespoolSqlCatalog,
    apply_defaults,
    commit_files,
    create_with,
    refresh_table,
    table_defaults,
)
from icespool.iceberg._catalog import ensure_table, load_catalog
from icespool.iceberg._parquet import encode_data_files
from icespool.runtime.retry import Backoff
from icespool.schema import arrow_schema_for, conform, parse_partition_spec, parse_schema

FAST = Backoff(attempts=6, base=0.001, cap=0.02)
NAME = "lon.events"
MIN_COUNT = "commit.manifest.min-count-to-merge"
MERGE = "commit.manifest-merge.enabled"
TARGET = "commit.manifest.target-size-bytes"
SCHEMA = parse_schema(
    [{"name": "id", "type": "long", "required": True}, {"name": "v", "type": "string"}]
)


def _props(tmp_path: Path) -> dict[str, str]:
    return {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path}/catalog.db",
        "warehouse": f"file://{tmp_path}/warehouse",
    }


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    return load_catalog("lake", _props(tmp_path))


def _create(catalog: Catalog, properties: dict[str, str]) -> Table:
    spec = parse_partition_spec(SCHEMA, [])
    return ensure_table(catalog, NAME, SCHEMA, spec, properties, create=True)


def _files(table: Table, n: int, rows: int = 3) -> list[DataFile]:
    batch = pa.table({"id": list(range(n * rows, (n + 1) * rows)), "v": [f"c{n}"] * rows})
    return encode_data_files(
        table,
        [conform(batch, arrow_schema_for(table))],
        target_file_size=1 << 20,
        row_group_records=1000,
        compression="zstd",
        file_prefix=f"seg-{n:04d}",
    )


def _commit(table: Table, n: int) -> int:
    result = commit_files(
        table, _files(table, n), segment_ids=[f"seg-{n:04d}"], summary={}, retry=FAST
    )
    assert not result.already_committed
    return result.snapshot_id


def _manifests(table: Table) -> list[ManifestFile]:
    snapshot = table.current_snapshot()
    assert snapshot is not None
    return snapshot.manifests(table.io)


def _ids(table: Table) -> list[int]:
    return sorted(table.scan().to_arrow().column("id").to_pylist())


def _metadata_dir(table: Table) -> Path:
    return Path(table.metadata_location.removeprefix("file://")).parent


def _reachable(table: Table) -> set[str]:
    """Every manifest list and manifest any snapshot in the metadata references."""
    paths: set[str] = set()
    for snapshot in table.metadata.snapshots:
        paths.add(snapshot.manifest_list)
        paths.update(m.manifest_path for m in snapshot.manifests(table.io))
    return paths


def _avro_files(table: Table) -> set[str]:
    return {f"file://{p}" for p in _metadata_dir(table).glob("*.avro")}


# ------------------------------------------------------------------ manifest merging


def test_manifests_merge_at_min_count_and_the_list_stays_bounded(catalog: Catalog) -> None:
    """min-count 5: every commit adds one manifest; the commit that makes it 5 merges
    them into one, so the manifest list never holds more than 4, over 100 commits."""
    table = _create(catalog, {MIN_COUNT: "5"})
    commits = 100
    counts = []
    for n in range(commits):
        snapshot_id = _commit(table, n)
        manifests = _manifests(table)
        counts.append(len(manifests))
        # Every data file committed so far is live exactly once across the manifests.
        live = sum((m.added_files_count or 0) + (m.existing_files_count or 0) for m in manifests)
        assert live == n + 1
        if len(manifests) == 1 and n > 0:
            (merged,) = manifests
            # The merging commit wrote the merged manifest: its file is new, and it
            # holds this commit's file as added, every earlier one as existing.
            assert merged.added_snapshot_id == snapshot_id
            assert (merged.added_files_count, merged.existing_files_count) == (1, n)
    assert counts[:9] == [1, 2, 3, 4, 1, 2, 3, 4, 1]
    assert max(counts) == 4
    assert counts.count(1) == len(range(0, commits, 4))
    assert _ids(table) == list(range(commits * 3))
    # One snapshot per commit, each naming its own segment.
    segments = [s.summary[SEGMENTS_SUMMARY_KEY] for s in table.snapshots() if s.summary]
    assert segments == [f"seg-{n:04d}" for n in range(commits)]


def test_merge_disabled_appends_one_manifest_per_commit(catalog: Catalog) -> None:
    table = _create(catalog, {MERGE: "false", MIN_COUNT: "2"})
    for n in range(12):
        _commit(table, n)
        manifests = _manifests(table)
        assert len(manifests) == n + 1
        assert all(m.added_files_count == 1 and m.existing_files_count == 0 for m in manifests)
    assert _ids(table) == list(range(36))


def test_manifests_at_the_target_size_are_never_rewritten(catalog: Catalog) -> None:
    """A merge bin-packs to commit.manifest.target-size-bytes: a merged manifest that
    has reached it stays as it is, so no commit rewrites more than the target."""
    table = _create(catalog, {MIN_COUNT: "3"})
    _commit(table, 0)
    single = _manifests(table)[0].manifest_length
    target = single * 5 // 2  # a merged manifest of ~40 entries
    with table.transaction() as transaction:
        transaction.set_properties({TARGET: str(target)})
    commits = 100
    previous = {m.manifest_path for m in _manifests(table)}
    frozen: set[str] = set()
    for n in range(1, commits):
        _commit(table, n)
        manifests = _manifests(table)
        # What this commit wrote: its own manifest or a merge of it, and merges of
        # older manifests that share a bin; none beyond the target size.
        written = [m for m in manifests if m.manifest_path not in previous]
        assert 1 <= len(written) <= 2
        assert all(m.manifest_length <= target for m in written)
        paths = {m.manifest_path for m in manifests}
        # A manifest no other manifest fits beside (the smallest holds one entry)
        # is never rewritten again.
        assert frozen <= paths
        frozen |= {m.manifest_path for m in manifests if m.manifest_length > target - single}
        previous = paths
    assert len(frozen) >= 2, "no merged manifest ever reached the target size"
    # The list stays bounded: every manifest but the newest few is full, not even the
    # smallest one in the list fits beside it. (Judged against that smallest, not the
    # first commit's: sizes differ by bytes with the ids and the warehouse path, and a
    # merged manifest just below `target - single` may be full all the same.)
    manifests = _manifests(table)
    smallest = min(m.manifest_length for m in manifests)
    # A pair that fits by less than those bytes is as good as full (seen: 6,423 + 4,295
    # bytes in a target of 10,720 with one tmp path length).
    slack = target // 100
    open_ = [m.manifest_length for m in manifests if m.manifest_length + smallest <= target - slack]
    assert len(open_) <= 3, (target, [m.manifest_length for m in manifests])
    assert _ids(table) == list(range(commits * 3))


# ------------------------------------------------------------------ conflicts


class _RacedCatalog(IcespoolSqlCatalog):
    """The daemon's SQL catalog; before its next ``races`` commits swap, another writer
    (its own catalog and Table) commits to the same table: ours conflicts."""

    races: list[Any]

    def commit_table(
        self,
        table: Table,
        requirements: tuple[TableRequirement, ...],
        updates: tuple[TableUpdate, ...],
    ) -> CommitTableResponse:
        if self.races:
            self.races.pop(0)()
        return super().commit_table(table, requirements, updates)


def test_a_conflict_during_a_merge_leaves_no_stray_files_and_commits_once(
    tmp_path: Path, catalog: Catalog
) -> None:
    setup = _create(catalog, {MIN_COUNT: "2"})
    _commit(setup, 0)  # one manifest: our next commit merges
    props = _props(tmp_path)
    del props["type"]
    raced = _RacedCatalog("lake", **props)
    ours = raced.load_table(NAME)
    other = load_catalog("lake", _props(tmp_path)).load_table(NAME)
    raced.races = [lambda: _commit(other, 1)]

    result = commit_files(ours, _files(ours, 2), segment_ids=["seg-0002"], summary={}, retry=FAST)

    assert result.attempts == 2 and not result.already_committed
    table = catalog.load_table(NAME)
    assert [s.summary[SEGMENTS_SUMMARY_KEY] for s in table.snapshots() if s.summary] == [
        "seg-0000",
        "seg-0001",
        "seg-0002",
    ]
    assert _ids(table) == list(range(9))
    # The retry merged again on top of the other writer's commit.
    (merged,) = _manifests(table)
    assert (merged.added_files_count, merged.existing_files_count) == (1, 2)
    # The failed attempt's manifest, merged manifest, manifest list and metadata.json
    # are gone: every file in the metadata directory is referenced.
    assert _avro_files(table) == _reachable(table)
    logged = {entry.metadata_file for entry in table.metadata.metadata_log}
    on_disk = {f"file://{p}" for p in _metadata_dir(table).glob("*.metadata.json")}
    assert on_disk == logged | {table.metadata_location}


def test_an_attempt_lost_before_the_catalog_is_cleaned_up_once_the_retry_lands(
    tmp_path: Path, catalog: Catalog
) -> None:
    """The first attempt dies on its way to the catalog (outcome unknown: its files
    are kept while it might still land); once the retry has landed it cannot, and
    what it wrote is deleted."""
    setup = _create(catalog, {MIN_COUNT: "2"})
    _commit(setup, 0)
    props = _props(tmp_path)
    del props["type"]
    raced = _RacedCatalog("lake", **props)
    ours = raced.load_table(NAME)

    def lost() -> None:
        raise ConnectionResetError("connection reset by peer (injected)")

    raced.races = [lost]
    result = commit_files(ours, _files(ours, 1), segment_ids=["seg-0001"], summary={}, retry=FAST)
    assert (result.attempts, result.already_committed) == (2, False)
    table = catalog.load_table(NAME)
    assert len(table.snapshots()) == 2
    assert _ids(table) == list(range(6))
    assert _avro_files(table) == _reachable(table)


def test_a_rejected_commit_deletes_what_it_staged(catalog: Catalog) -> None:
    """A commit refused while it is built (here: a property update the caller's hook
    rejects only after staging) leaves no manifest behind."""
    table = _create(catalog, {MIN_COUNT: "2"})
    _commit(table, 0)
    before = _avro_files(table)

    class Refused(Exception):
        pass

    def refuse(_current: object) -> dict[str, str]:
        raise Refused

    with pytest.raises(Refused):
        commit_files(
            table,
            _files(table, 1),
            segment_ids=["seg-0001"],
            summary={},
            retry=FAST,
            update_properties=refuse,
        )
    assert _avro_files(table) == before
    assert len(table.snapshots()) == 1


def test_refresh_skips_unchanged_metadata_and_sees_other_writers(
    tmp_path: Path, catalog: Catalog
) -> None:
    table = _create(catalog, {})
    _commit(table, 0)
    loaded = table.metadata
    refresh_table(table)
    assert table.metadata is loaded  # nothing changed: not re-read
    other = load_catalog("lake", _props(tmp_path)).load_table(NAME)
    second = _commit(other, 1)
    refresh_table(table)
    assert table.metadata is not loaded
    assert table.metadata_location == other.metadata_location
    current = table.current_snapshot()
    assert current is not None and current.snapshot_id == second


# ------------------------------------------------------------------ defaults


def test_created_tables_get_the_defaults_and_declared_properties_win(catalog: Catalog) -> None:
    table = _create(catalog, {MIN_COUNT: "7", "write.metadata.previous-versions-max": "3"})
    expected = {
        **TABLE_DEFAULTS,
        MIN_COUNT: "7",
        "write.metadata.previous-versions-max": "3",
    }
    assert {k: table.properties.get(k) for k in expected} == expected
    assert table.properties[MERGE] == "true"
    assert table.properties["write.metadata.delete-after-commit.enabled"] == "true"
    assert table.properties["history.expire.max-snapshot-age-ms"] == str(6 * 3600 * 1000)
    assert table.properties["history.expire.min-snapshots-to-keep"] == "10"

    # The retention values are the caller's (from [maintenance]); the dead-letter
    # table the daemon creates gets them too.
    retention = table_defaults(max_snapshot_age_ms=60_000, min_snapshots_to_keep=3)
    dead = create_with(catalog, "lon.dead", SCHEMA, retention)
    assert {k: dead.properties.get(k) for k in retention} == retention

    # An existing table is used as it is: loading it with other defaults changes nothing.
    again = ensure_table(
        catalog, NAME, SCHEMA, parse_partition_spec(SCHEMA, []), {}, create=True, defaults={}
    )
    assert again.metadata_location == table.metadata_location
    assert again.properties[MIN_COUNT] == "7"


def test_apply_defaults_adds_only_the_missing_keys(catalog: Catalog) -> None:
    spec = parse_partition_spec(SCHEMA, [])
    table = ensure_table(catalog, NAME, SCHEMA, spec, {MERGE: "false"}, create=True, defaults={})
    assert MIN_COUNT not in table.properties
    _commit(table, 0)
    added = apply_defaults(table, TABLE_DEFAULTS)
    assert added == {k: v for k, v in TABLE_DEFAULTS.items() if k != MERGE}
    fresh = catalog.load_table(NAME)
    assert fresh.properties[MERGE] == "false"  # the operator's choice stands
    assert {k: fresh.properties[k] for k in added} == added
    assert len(fresh.snapshots()) == 1  # a metadata-only commit
    location = fresh.metadata_location
    assert apply_defaults(fresh, TABLE_DEFAULTS) == {}
    assert catalog.load_table(NAME).metadata_location == location  # nothing committed
    assert os.path.exists(location.removeprefix("file://"))
