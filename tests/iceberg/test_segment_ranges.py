"""A table knows which of a spool's segments it holds after every snapshot expired: the
spool's segment ranges (``icespool.spool.<id>.segment-ranges``), per writer.

Commits go through `commit_files` into a real SQLite SQL catalog; then every snapshot but
the current one is expired (as a restore a day later finds the table), and
`committed_marks` answers what the ranges alone say."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from icespool.iceberg import (
    SpoolSegments,
    commit_files,
    committed_marks,
    encode_data_files,
    ensure_table,
    load_catalog,
    segment_ranges_key,
)
from icespool.schema import arrow_schema_for, conform, parse_partition_spec, parse_schema
from icespool.spool import new_uuid7

SPOOL = "5b1a2f9e-1111-4c4c-8d8d-000000000001"
WRITER = "a1b2c3d4e5f6"
OTHER = "0f0e0d0c0b0a"


@pytest.fixture
def table(tmp_path: Path) -> Table:
    catalog: Catalog = load_catalog(
        "lake",
        {
            "type": "sql",
            "uri": f"sqlite:///{tmp_path}/catalog.db",
            "warehouse": f"file://{tmp_path}/warehouse",
        },
    )
    schema = parse_schema([{"name": "id", "type": "long", "required": True}])
    table = ensure_table(catalog, "t.events", schema, parse_partition_spec(schema, []), {}, True)
    assert table is not None
    return table


def _commit(
    table: Table,
    spans: dict[str, tuple[int, int]],
    *,
    whole: set[str] | None = None,
    held: set[str] = frozenset(),  # type: ignore[assignment]
    writers: tuple[str, ...] = (WRITER, OTHER),
) -> None:
    rows = pa.table({"id": list(range(sum(end - start for start, end in spans.values())))})
    files = encode_data_files(
        table,
        [conform(rows, arrow_schema_for(table))],
        target_file_size=1 << 20,
        row_group_records=1000,
        compression="zstd",
        file_prefix=f"{min(spans)}-{WRITER}",
    )
    commit_files(
        table,
        files,
        segment_ids=list(spans),
        summary={},
        spool_id=SPOOL,
        segment_spans=spans,
        spool_segments=SpoolSegments(
            writers=frozenset(writers),
            whole=frozenset(spans if whole is None else whole),
            held=frozenset(held),
        ),
    )


def _expire_all_but_current(table: Table) -> None:
    table.refresh()
    current = table.current_snapshot()
    assert current is not None
    old = [s.snapshot_id for s in table.snapshots() if s.snapshot_id != current.snapshot_id]
    if old:
        table.maintenance.expire_snapshots().by_ids(old).commit()
    table.refresh()
    assert [s.snapshot_id for s in table.snapshots()] == [current.snapshot_id]


def _held(table: Table, ids: list[str]) -> dict[str, int | None]:
    """What the table says it holds of ``ids`` after expiry: records (None: all)."""
    return {s: mark[1] for s, mark in committed_marks(table, ids, SPOOL).items()}


def _ranges(table: Table) -> list[str]:
    return table.metadata.properties[segment_ranges_key(SPOOL)].split(",")


def test_every_segment_of_a_writer_is_known_after_its_snapshots_expired(table: Table) -> None:
    ids = [new_uuid7(WRITER) for _ in range(12)]
    for start in range(0, 12, 3):
        _commit(table, dict.fromkeys(ids[start : start + 3], (0, 10)))
    # One more commit by another writer of the same spool, so neither last-segments
    # nor a snapshot names the first writer's segments.
    late = new_uuid7(OTHER)
    _commit(table, {late: (0, 5)})
    _expire_all_but_current(table)
    assert _held(table, ids) == dict.fromkeys(ids, None)
    assert len(_ranges(table)) == 2  # one range per writer
    # Ids made since, by the same writer or another, are not held.
    assert _held(table, [new_uuid7(WRITER), new_uuid7(OTHER), new_uuid7()]) == {}


def test_a_segment_the_spool_still_holds_splits_the_range(table: Table) -> None:
    first, stuck, third = (new_uuid7(WRITER) for _ in range(3))
    _commit(table, {first: (0, 10)})
    # `stuck` failed (quarantined): the spool holds it while `third` commits.
    _commit(table, {third: (0, 10)}, held={stuck})
    _commit(table, {new_uuid7(OTHER): (0, 1)})
    _expire_all_but_current(table)
    assert _held(table, [first, stuck, third]) == {first: None, third: None}
    assert len(_ranges(table)) == 3
    # Replayed later: the ranges close over it again.
    _commit(table, {stuck: (0, 10)})
    _expire_all_but_current(table)
    assert _held(table, [first, stuck, third]) == {first: None, stuck: None, third: None}
    assert len(_ranges(table)) == 2


def test_a_segment_sealed_by_a_recovery_is_held_only_as_far_as_committed(table: Table) -> None:
    """A copy of the directory held the first 40 records of a segment its writer was
    still appending to: that much is held, and a longer copy commits the rest."""
    before, open_one, after = (new_uuid7(WRITER) for _ in range(3))
    _commit(table, {before: (0, 10)})
    _commit(table, {open_one: (0, 40)}, whole=set())
    _commit(table, {new_uuid7(OTHER): (0, 1)})
    _expire_all_but_current(table)
    assert _held(table, [before, open_one]) == {before: None, open_one: 40}
    # A later segment of the writer does not join a range ending in a partial one.
    _commit(table, {after: (0, 10)})
    assert _held(table, [before, open_one, after]) == {before: None, open_one: 40, after: None}
    # The writer's own copy, sealed whole with 70 records, commits records 40..70.
    _commit(table, {open_one: (40, 70)})
    _expire_all_but_current(table)
    assert _held(table, [before, open_one, after]) == dict.fromkeys([before, open_one, after])
    assert len(_ranges(table)) == 2


def test_segments_of_writers_the_spool_does_not_record_are_left_to_the_marks(
    table: Table,
) -> None:
    old_format = new_uuid7()  # random digits where a writer's tag goes
    _commit(table, {old_format: (0, 10)})
    _commit(table, {new_uuid7(WRITER): (0, 10)})
    assert segment_ranges_key(SPOOL) in table.metadata.properties
    assert all(r.startswith(f"{WRITER}:") for r in _ranges(table))


def test_another_writers_segments_made_meanwhile_are_never_covered(table: Table) -> None:
    """Two lineages of one spool (a copy started beside its original) write at the same
    time: each one's ranges cover only its own writer's ids."""
    mine = [new_uuid7(WRITER) for _ in range(3)]
    theirs = new_uuid7(OTHER)  # made between two of mine, never committed
    mine += [new_uuid7(WRITER) for _ in range(3)]
    _commit(table, dict.fromkeys(mine[:3], (0, 1)))
    _commit(table, dict.fromkeys(mine[3:], (0, 1)))
    _expire_all_but_current(table)
    assert _held(table, [*mine, theirs]) == dict.fromkeys(mine)


def test_the_ranges_stay_bounded(table: Table) -> None:
    writers = [f"{n:012x}" for n in range(1, 100)]
    first = {}
    for writer in writers:
        segment = new_uuid7(writer)
        first[writer] = segment
        _commit(table, {segment: (0, 1)}, writers=(writer,))
    assert len(_ranges(table)) == 64
    _expire_all_but_current(table)
    held = _held(table, list(first.values()))
    # The newest 64 writers' segments are known; the oldest were dropped.
    assert sorted(held) == sorted(first[w] for w in writers[-64:])
