"""Which Kafka offsets a table already holds, kept in the table itself.

Every table a Kafka source writes has, per (group, topic, partition), a table
property ``icespool.kafka.<group>/<topic>/<partition>`` (``offsets_key``) whose value is the list of
offset ranges the table *covers*: "every record of those offsets that routes to
this table is in the table". It is updated in the same metadata commit as the rows
(catalogs swap metadata atomically), so rows and offsets can never disagree.

Why ranges and not one high-water mark: a replica that stalled (and lost its
partitions) may still hold older records in its spool. A single watermark would
make those look committed once another replica moved it past them; ranges tell
"already in the table" from "not seen by anyone yet" exactly. In steady state the
list collapses to one range ``first-last``.

Why table properties and not snapshot summaries: properties survive
``expire_snapshots`` and are read in O(1) from the current metadata.
"""

from __future__ import annotations

import bisect
import logging
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from icespool.errors import CommitError
from icespool.metrics import Metrics
from icespool.source_claims import ClaimsMovedError

__all__ = [
    "MARKS_PREFIX",
    "META_KEY",
    "OFFSETS_PREFIX",
    "SUMMARY_KEY",
    "OffsetBook",
    "OffsetClaims",
    "OffsetsMovedError",
    "Ranges",
    "RecordMark",
    "batch_meta",
    "mark_key",
    "offsets_key",
    "parse_offsets_key",
    "ranges_from_properties",
    "resume_position",
]

_log = logging.getLogger("icespool.kafka")

OFFSETS_PREFIX: Final = "icespool.kafka."
#: Snapshot summary key: "<group>/<topic>/<partition>=<ranges>;..." of the commit.
SUMMARY_KEY: Final = "icespool.kafka-offsets"
#: Spool batch metadata key: [group, topic, partition, claimed ranges, row offsets,
#: the last claimed record's mark (optional)].
META_KEY: Final = "kafka"
#: Table property prefix of the partitions' marks (`RecordMark`): which record the
#: table's ranges end with, so a topic re-created under the same name is told apart.
MARKS_PREFIX: Final = "icespool.kafka-mark."


class OffsetsMovedError(ClaimsMovedError):
    """Another replica committed some of these offsets since they were filtered.

    Nothing was committed; filter the spooled rows again and retry.
    """


def offsets_key(group: str, topic: str, partition: int) -> str:
    """The table property holding the ranges of one (group, topic, partition)."""
    # Topic names cannot contain '/' (Kafka allows [a-zA-Z0-9._-]); the group id can
    # contain anything, so it is the part that is escaped.
    return f"{OFFSETS_PREFIX}{group.replace('/', '%2F')}/{topic}/{partition}"


def mark_key(group: str, topic: str, partition: int) -> str:
    """The table property holding the `RecordMark` of one (group, topic, partition)."""
    return MARKS_PREFIX + offsets_key(group, topic, partition)[len(OFFSETS_PREFIX) :]


@dataclass(frozen=True, slots=True)
class RecordMark:
    """One Kafka record, told apart from another at the same offset: its timestamp and
    a CRC-32 of its key and value. A topic deleted and re-created under the same name
    (or a log truncated and written again) has other records at the old offsets."""

    offset: int
    timestamp: int
    crc: int

    @classmethod
    def of(cls, offset: int, timestamp: int, key: bytes | None, value: bytes | None) -> RecordMark:
        crc = zlib.crc32(value or b"", zlib.crc32(key or b""))
        return cls(offset, timestamp, crc)

    @classmethod
    def parse(cls, text: str | None) -> RecordMark | None:
        """A mark as `__str__` writes it; None when absent or not a mark."""
        parts = (text or "").split(":")
        if len(parts) != 3:
            return None
        try:
            return cls(int(parts[0]), int(parts[1]), int(parts[2]))
        except ValueError:
            return None

    def __str__(self) -> str:
        return f"{self.offset}:{self.timestamp}:{self.crc}"


def parse_offsets_key(key: str) -> tuple[str, str, int] | None:
    if not key.startswith(OFFSETS_PREFIX):
        return None
    parts = key[len(OFFSETS_PREFIX) :].rsplit("/", 2)
    if len(parts) != 3 or not parts[2].isdigit():
        return None
    return parts[0].replace("%2F", "/"), parts[1], int(parts[2])


@dataclass(frozen=True, slots=True)
class Ranges:
    """Sorted, disjoint, non-adjacent closed ranges of offsets."""

    spans: tuple[tuple[int, int], ...] = ()

    # ------------------------------------------------------------------ text form

    @classmethod
    def parse(cls, text: str | None) -> Ranges:
        """Read ``"0-99,120-130"``; raises ValueError naming the bad part."""
        if not text:
            return cls()
        spans: list[tuple[int, int]] = []
        for part in text.split(","):
            first, sep, last = part.partition("-")
            if not sep or not first.isdigit() or not last.isdigit() or int(first) > int(last):
                raise ValueError(f"bad offset range {part!r} in {text!r}")
            spans.append((int(first), int(last)))
        return cls.of(spans)

    def __str__(self) -> str:
        return ",".join(f"{a}-{b}" for a, b in self.spans)

    @classmethod
    def of(cls, spans: Iterable[tuple[int, int]]) -> Ranges:
        merged: list[tuple[int, int]] = []
        for first, last in sorted(spans):
            if merged and first <= merged[-1][1] + 1:
                if last > merged[-1][1]:
                    merged[-1] = (merged[-1][0], last)
            else:
                merged.append((first, last))
        return cls(tuple(merged))

    @classmethod
    def runs(cls, offsets: Sequence[int] | npt.NDArray[np.int64]) -> Ranges:
        """The ranges of a sorted list of offsets (consecutive offsets form one run)."""
        values = np.asarray(offsets, dtype=np.int64)
        if values.size == 0:
            return cls()
        breaks = np.flatnonzero(np.diff(values) != 1)
        starts = np.concatenate(([0], breaks + 1))
        ends = np.concatenate((breaks, [values.size - 1]))
        return cls.of((int(values[s]), int(values[e])) for s, e in zip(starts, ends, strict=True))

    # ------------------------------------------------------------------ queries

    def __bool__(self) -> bool:
        return bool(self.spans)

    def union(self, other: Ranges) -> Ranges:
        return Ranges.of(self.spans + other.spans)

    def minus(self, other: Ranges) -> Ranges:
        """The offsets of ``self`` that are not in ``other``."""
        kept: list[tuple[int, int]] = []
        for first, last in self.spans:
            start = first
            for a, b in other.spans:
                if b < start or a > last:
                    continue
                if a > start:
                    kept.append((start, a - 1))
                start = b + 1
                if start > last:
                    break
            if start <= last:
                kept.append((start, last))
        return Ranges(tuple(kept))

    def overlaps(self, other: Ranges) -> bool:
        i = j = 0
        while i < len(self.spans) and j < len(other.spans):
            a0, a1 = self.spans[i]
            b0, b1 = other.spans[j]
            if a0 <= b1 and b0 <= a1:
                return True
            if a1 < b1:
                i += 1
            else:
                j += 1
        return False

    def contains(self, offset: int) -> bool:
        i = bisect.bisect_right(self.spans, (offset, float("inf"))) - 1
        return i >= 0 and self.spans[i][0] <= offset <= self.spans[i][1]

    def mask(self, offsets: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """Vectorized ``contains`` for each of ``offsets``."""
        if not self.spans or offsets.size == 0:
            return np.zeros(offsets.size, dtype=np.bool_)
        starts = np.fromiter((a for a, _ in self.spans), np.int64, len(self.spans))
        ends = np.fromiter((b for _, b in self.spans), np.int64, len(self.spans))
        i = np.searchsorted(starts, offsets, side="right") - 1
        inside = i >= 0
        safe = np.where(inside, i, 0)
        result: npt.NDArray[np.bool_] = inside & (offsets <= ends[safe])
        return result

    def offsets(self) -> npt.NDArray[np.int64]:
        """Every offset, in order (for the runs of one spooled batch)."""
        if not self.spans:
            return np.empty(0, dtype=np.int64)
        return np.concatenate([np.arange(a, b + 1, dtype=np.int64) for a, b in self.spans])

    def next_position(self) -> int | None:
        """Where a consumer resumes: just past the first range (None when empty).

        Records before the first range were never this table's to hold (the source
        started later); a gap after it may be held by another replica's spool, so
        consumption resumes at the gap and de-duplicates what follows.
        """
        return self.spans[0][1] + 1 if self.spans else None


def ranges_from_properties(
    properties: Mapping[str, str], group: str, topic: str, partition: int
) -> Ranges:
    """The ranges a table (its ``properties``) covers of one (group, topic, partition)."""
    return Ranges.parse(properties.get(offsets_key(group, topic, partition)))


def resume_position(ranges: Iterable[Ranges]) -> int | None:
    """The lowest position any table needs (None: no table knows this partition)."""
    positions = [p for r in ranges if (p := r.next_position()) is not None]
    return min(positions) if positions else None


def batch_meta(
    group: str,
    topic: str,
    partition: int,
    claim: Ranges,
    rows: Ranges,
    mark: RecordMark | None = None,
) -> dict[str, object]:
    """Spool metadata of one batch: its rows' offsets, the range it covers, and the
    mark of the range's last record.

    ``claim`` may be wider than ``rows``: records of the range that were routed to
    another table, dead-lettered, or dropped as duplicates are covered too.
    """
    info: list[object] = [group, topic, partition, str(claim), str(rows)]
    if mark is not None:
        info.append(str(mark))
    return {META_KEY: info}


@dataclass(slots=True)
class _Claim:
    covers: Ranges
    rows: Ranges
    mark: RecordMark | None = None


class OffsetBook:
    """The Kafka bookkeeping of one table that outlives single commits.

    The table's writer gets ``claims`` as its `icespool.source_claims.ClaimsFactory`; the
    sources read ``withheld`` when they record consumed ranges without data.
    """

    def __init__(self, table: str, metrics: Metrics) -> None:
        self.table = table
        self._metrics = metrics
        # Offsets of this run's quarantined segments: never recorded as held, so the
        # source re-reads them after a restart or a replay commits them.
        self.withheld: dict[str, Ranges] = {}

    def claims(self) -> OffsetClaims:
        return OffsetClaims(self)

    def dropped(self, records: int) -> None:
        self._metrics.kafka_duplicates.labels(table=self.table).inc(records)
        _log.warning(
            "%s: dropped %d spooled Kafka records another replica already committed",
            self.table,
            records,
            extra={"table": self.table, "records": records},
        )

    def consumed(
        self, claims: Mapping[str, Ranges]
    ) -> Callable[[Mapping[str, str]], dict[str, str]]:
        """Property updates recording ``claims`` (consumed ranges with nothing pending
        for this table) as held, except what is withheld; for ``update_properties``."""

        def updates(current: Mapping[str, str]) -> dict[str, str]:
            return {
                key: str(
                    Ranges.parse(current.get(key)).union(
                        ranges.minus(self.withheld.get(key, Ranges()))
                    )
                )
                for key, ranges in claims.items()
            }

        return updates


class OffsetClaims:
    """The Kafka offsets of the batches one commit adds, per partition property
    (a `icespool.source_claims.Claims`)."""

    def __init__(self, book: OffsetBook) -> None:
        self._book = book
        self._claims: dict[str, _Claim] = {}

    def __bool__(self) -> bool:
        return bool(self._claims)

    def filter(
        self,
        batches: Sequence[pa.RecordBatch],
        metas: Sequence[Mapping[str, object] | None],
        properties: Mapping[str, str],
    ) -> list[pa.RecordBatch]:
        """Drop rows whose offsets the table already covers; remember the claims.

        Returns the kept batches. Batches without Kafka metadata (HTTP, Python API)
        pass unchanged.
        """
        kept: list[pa.RecordBatch] = []
        dropped = 0
        for batch, meta in zip(batches, metas, strict=True):
            info = meta.get(META_KEY) if meta else None
            if not isinstance(info, list):
                kept.append(batch)
                continue
            group, topic, partition, covers, rows = info[:5]
            key = offsets_key(str(group), str(topic), int(partition))
            row_offsets = Ranges.parse(str(rows)).offsets()
            if row_offsets.size != batch.num_rows:
                raise CommitError(
                    f"spooled batch of {topic}[{partition}] has {batch.num_rows} rows but "
                    f"{row_offsets.size} offsets; the segment's metadata is inconsistent"
                )
            claim = self._claims.setdefault(key, _Claim(Ranges(), Ranges()))
            # Held by the table, or by an earlier batch of this commit (a source that
            # re-read offsets still spooled from before a restart spooled them twice).
            held = Ranges.parse(properties.get(key)).union(claim.rows)
            duplicate = held.mask(row_offsets)
            if duplicate.any():
                dropped += int(duplicate.sum())
                keep = ~duplicate
                batch = batch.filter(pa.array(keep))
                row_offsets = row_offsets[keep]
            claim.covers = claim.covers.union(Ranges.parse(str(covers)))
            claim.rows = claim.rows.union(Ranges.runs(row_offsets))
            mark = RecordMark.parse(str(info[5])) if len(info) > 5 else None
            if mark is not None and (claim.mark is None or mark.offset > claim.mark.offset):
                claim.mark = mark
            if batch.num_rows:
                kept.append(batch)
        if dropped:
            self._book.dropped(dropped)
        return kept

    def positional(self, meta: Mapping[str, object] | None) -> bool:
        return meta is not None and isinstance(meta.get(META_KEY), list)

    def withhold(self) -> None:
        for key, ranges in self.covered().items():
            self._book.withheld[key] = self._book.withheld.get(key, Ranges()).union(ranges)

    def covered(self) -> dict[str, Ranges]:
        """The offset ranges these claims cover, per partition property."""
        return {key: claim.covers for key, claim in self._claims.items()}

    def summary(self) -> dict[str, str]:
        """Snapshot summary entry naming the offsets this commit covers (for people
        and tools reading history; the table properties are what the daemon trusts)."""
        if not self._claims:
            return {}
        covered = ";".join(
            f"{key[len(OFFSETS_PREFIX) :]}={claim.covers}" for key, claim in self._claims.items()
        )
        return {SUMMARY_KEY: covered}

    def properties(self, current: Mapping[str, str]) -> dict[str, str]:
        """The offset properties after this commit, checked against ``current``.

        Called inside each commit attempt with the refreshed table: if a row offset
        of ours is now covered (a fenced-out replica racing the new owner), nothing
        may be committed (`OffsetsMovedError`).
        """
        updated: dict[str, str] = {}
        for key, claim in self._claims.items():
            committed = Ranges.parse(current.get(key))
            if committed.overlaps(claim.rows):
                raise OffsetsMovedError(
                    f"offsets {claim.rows} of {key} overlap what the table now holds "
                    f"({committed}); another replica committed them first"
                )
            merged = committed.union(claim.covers)
            if str(merged) != current.get(key):
                updated[key] = str(merged)
            if claim.mark is not None:
                marked = MARKS_PREFIX + key[len(OFFSETS_PREFIX) :]
                known = RecordMark.parse(current.get(marked))
                if known is None or claim.mark.offset > known.offset:
                    updated[marked] = str(claim.mark)
        return updated
