"""Which spool segments a table already holds: the marks every daemon commit leaves.

Every snapshot the daemon commits carries ``icespool.segments`` = the comma-joined ids of
the spool segments whose rows it adds, and ``icespool.segment-records`` = how many of
each segment's records the table holds after it. The same commit sets the table property
``icespool.spool.<spool-id>.last-segments`` (and its record counts), and adds its segments
to the spool's ranges (``_segment_ranges``), properties snapshot expiry never removes.
Why these marks make commits idempotent: ``_commit/_engine``'s doc.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from pyiceberg.table import Table
from pyiceberg.table.snapshots import (
    Snapshot,
)

from icespool.iceberg._segment_ranges import held_by_ranges, segment_ranges_key
from icespool.iceberg._upstream._summary import summary_value

__all__ = [
    "SEGMENTS_SUMMARY_KEY",
    "SEGMENT_RECORDS_SUMMARY_KEY",
    "committed_marks",
    "covers",
    "find_committed_segments",
    "last_segment_records_key",
    "last_segments_key",
]


#: Snapshot summary key listing the spool segment ids a snapshot covers.
SEGMENTS_SUMMARY_KEY: Final = "icespool.segments"
# How many records of each segment (aligned with SEGMENTS_SUMMARY_KEY) the table holds
# after the commit: a segment is committed in order, and a commit of its remainder
# records the segment's whole count.
SEGMENT_RECORDS_SUMMARY_KEY: Final = "icespool.segment-records"
_SPOOL_PREFIX: Final = "icespool.spool."
# Marks found in table properties have no snapshot left to name.
_EXPIRED: Final = -1


def last_segments_key(spool_id: str) -> str:
    """Table property naming the segments of ``spool_id``'s latest commit to the table."""
    return f"{_SPOOL_PREFIX}{spool_id}.last-segments"


def last_segment_records_key(spool_id: str) -> str:
    """Table property with the record counts (aligned) of `last_segments_key`'s ids."""
    return f"{_SPOOL_PREFIX}{spool_id}.last-segment-records"


def _marks(segments: str | None, records: str | None) -> list[tuple[str, int | None]]:
    """``(segment id, records covered)`` of a commit's segment list and its aligned
    record counts; None where the count is unknown (written before counts were kept, or
    a list that does not align): such a mark covers the whole segment, as it always did."""
    ids = segments.split(",") if segments else []
    counts = records.split(",") if records else []
    if len(counts) != len(ids) or not all(count.isdigit() for count in counts):
        return [(segment, None) for segment in ids]
    return [(segment, int(count)) for segment, count in zip(ids, counts, strict=True)]


def _segments_of(snapshot: Snapshot) -> list[tuple[str, int | None]]:
    return _marks(
        summary_value(snapshot, SEGMENTS_SUMMARY_KEY),
        summary_value(snapshot, SEGMENT_RECORDS_SUMMARY_KEY),
    )


def covers(records: int | None, wanted: int) -> bool:
    return records is None or records >= wanted


def committed_marks(
    table: Table, segment_ids: Iterable[str], spool_id: str | None = None
) -> dict[str, tuple[int, int | None]]:
    """``segment id -> (snapshot id, records covered)`` for each of ``segment_ids`` some
    commit to ``table`` covers, keeping the mark that covers the most records (None:
    the whole segment). A segment's records are committed in order, so a mark covering
    ``n`` records means its first ``n`` records are in the table.

    Looks at every snapshot in the table's metadata as loaded (refresh first for the
    catalog's current state), not only the current ancestry. With ``spool_id``, the
    marks of that spool's ``last-segments`` property and segment ranges count too (their
    snapshot may have expired; the snapshot id is then -1).
    """
    wanted = set(segment_ids)
    found: dict[str, tuple[int, int | None]] = {}
    if not wanted:
        return found

    def keep(segment: str, snapshot_id: int, records: int | None) -> None:
        if segment not in wanted:
            return
        best = found.get(segment)
        if best is None or (best[1] is not None and (records is None or records > best[1])):
            found[segment] = (snapshot_id, records)

    for snapshot in table.metadata.snapshots:
        for segment, records in _segments_of(snapshot):
            keep(segment, snapshot.snapshot_id, records)
    if spool_id is not None:
        properties = table.metadata.properties
        for segment, records in _marks(
            properties.get(last_segments_key(spool_id)),
            properties.get(last_segment_records_key(spool_id)),
        ):
            keep(segment, _EXPIRED, records)
        ranges = properties.get(segment_ranges_key(spool_id))
        for segment, held in held_by_ranges(ranges, wanted).items():
            keep(segment, _EXPIRED, held)
    return found


def find_committed_segments(
    table: Table,
    segment_ids: Iterable[str],
    spool_id: str | None = None,
    *,
    records: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """Map each of ``segment_ids`` that a snapshot of ``table`` covers to that snapshot
    (-1: its snapshot expired, the spool's ``last-segments`` property says so; see
    `committed_marks`). With ``records`` (segment id -> its record count), a segment
    counts only where a commit covered at least that many of its records: a copy of a
    spool may have committed the first part of a segment that grew afterwards.
    """
    wanted = records or {}
    return {
        segment: snapshot_id
        for segment, (snapshot_id, covered) in committed_marks(table, segment_ids, spool_id).items()
        if covers(covered, wanted.get(segment, 0))
    }
