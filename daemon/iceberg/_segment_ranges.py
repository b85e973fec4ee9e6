"""Which of a spool's segments a table holds, at any age: ranges of segment ids per writer.

A snapshot's summary names the segments it adds, but expiry removes snapshots, and the
``last-segments`` property names only a spool's latest commit. A spool volume restored
from an old snapshot holds segments committed long ago by commits that are gone: without
more, they would be committed again. So each commit also carries, in the table property
``icespool.spool.<spool-id>.segment-ranges``, ranges of the segment ids that spool's
commits put into the table, per *writer*: the incarnation whose tag ends every segment
id it made (`icespool.spool.segment_writer`). One writer's ids sort in the order it made
them, and a range claims every segment of its writer between its ends, so ranges stay
few: one per process that wrote to the table, a few more where segments were left out.

A range may only be stretched over ids the committing process knows about:

- never over a segment of the writer its spool still holds (pending, quarantined, left
  by a recovery: `Spool.held_ids`): those are not in the table;
- a segment no copy can hold more of (sealed by its writer: `SegmentInfo.whole`) is held
  whole; any other (sealed by a recovery: a copy of a directory taken while its writer
  appended, or a writer that died) ends its range, with the count of its records the
  table holds, so a longer copy of it commits the rest;
- only for writers the spool records (``incarnations``): ids made by older versions end
  in random digits, not a writer's tag.

Between two segments of a range, a segment of the writer that the spool no longer holds
left it after the table held all its records (a spool deletes a segment only then).
Copies of the directory taken later hold the same or fewer of them; a copy's writers are
new incarnations with ids of their own, so what a copy writes after the copy was taken
never falls into another lineage's ranges.

The value is bounded (`MAX_RANGES`, the newest kept): a restored volume is recognised
as long as the table keeps the ranges of the processes that wrote it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from icespool.spool import segment_writer

__all__ = [
    "MAX_RANGES",
    "SpoolSegments",
    "held_by_ranges",
    "segment_ranges_key",
    "with_segments",
]

#: Ranges kept per spool and table (about 50 bytes each): the oldest go first.
MAX_RANGES: Final = 64
_SPOOL_PREFIX: Final = "icespool.spool."
# writer:first-last or writer:first-last@records (records of `last` the table holds).
_RANGE: Final = re.compile(r"([0-9a-f]{12}):([0-9a-f]{16})-([0-9a-f]{16})(?:@(\d+))?")


def segment_ranges_key(spool_id: str) -> str:
    """Table property holding the ranges of ``spool_id``'s segments the table holds."""
    return f"{_SPOOL_PREFIX}{spool_id}.segment-ranges"


@dataclass(frozen=True)
class SpoolSegments:
    """What the committing process knows of its spool, for stretching ranges.

    ``writers``: the tags of every incarnation its spool records (its own included);
    ``whole``: of the commit's segments, those sealed by their writer; ``held``: every
    segment id of the table the spool still holds besides the commit's own."""

    writers: frozenset[str]
    whole: frozenset[str]
    held: frozenset[str]


@dataclass
class _Range:
    writer: str
    first: str
    last: str
    records: int | None  # records of `last` the table holds; None: all of them

    @property
    def text(self) -> str:
        tail = "" if self.records is None else f"@{self.records}"
        return f"{self.writer}:{self.first}-{self.last}{tail}"


def _order(segment_id: str) -> str:
    """The part of an id its writer made in order: time and counter (16 hex digits)."""
    return segment_id.replace("-", "")[:16].lower()


def _parse(value: str | None) -> list[_Range]:
    """The ranges of a property value; anything unreadable is left out (a range left
    out only makes a segment look uncommitted, never the reverse)."""
    found = []
    for part in (value or "").split(","):
        match = _RANGE.fullmatch(part.strip())
        if match is not None and match[2] <= match[3]:
            records = int(match[4]) if match[4] is not None else None
            found.append(_Range(match[1], match[2], match[3], records))
    return found


def held_by_ranges(value: str | None, segment_ids: Iterable[str]) -> dict[str, int | None]:
    """``segment id -> records held`` (None: all of them) for each of ``segment_ids``
    the ranges ``value`` cover."""
    ranges: dict[str, list[_Range]] = {}
    for found in _parse(value):
        ranges.setdefault(found.writer, []).append(found)
    held: dict[str, int | None] = {}
    for segment in segment_ids:
        order = _order(segment)
        for found in ranges.get(segment_writer(segment), ()):
            if found.first <= order < found.last:
                held[segment] = None
                break
            if order == found.last:
                held[segment] = found.records
                break
    return held


def with_segments(
    value: str | None, spans: Mapping[str, tuple[int, int]], spool: SpoolSegments
) -> str:
    """``value`` with the segments of one commit added: ``spans`` maps each to the
    records ``[start, end)`` of it the commit adds (the table then holds ``end``)."""
    ranges = _parse(value)
    for segment in sorted(spans, key=_order):
        writer = segment_writer(segment)
        if writer not in spool.writers:
            continue  # an id of an older version: its commit's marks name it
        records = None if segment in spool.whole else spans[segment][1]
        held = {_order(s) for s in spool.held if segment_writer(s) == writer}
        _add(ranges, writer, _order(segment), records, held)
    ranges.sort(key=lambda r: r.last)
    return ",".join(r.text for r in ranges[-MAX_RANGES:])


def _add(
    ranges: list[_Range], writer: str, order: str, records: int | None, held: set[str]
) -> None:
    """Add one segment of ``writer`` (``records`` held; None: whole) to ``ranges``."""
    mine = sorted((r for r in ranges if r.writer == writer), key=lambda r: r.first)

    def clear(low: str, high: str) -> bool:
        return not any(low < h < high for h in held)

    joined = next((r for r in mine if r.first <= order <= r.last), None)
    if joined is not None:
        if order < joined.last or joined.records is None:
            return  # held whole already
        joined.records = None if records is None else max(records, joined.records)
    else:
        below = next((r for r in reversed(mine) if r.last < order), None)
        if below is not None and below.records is None and clear(below.last, order):
            below.last, below.records = order, records
            joined = below
        else:
            joined = _Range(writer, order, order, records)
            ranges.append(joined)
    above = next((r for r in mine if r.first > order), None)
    if above is not None and joined.records is None and clear(order, above.first):
        joined.last, joined.records = above.last, above.records
        ranges.remove(above)
