"""The marks a data commit leaves for the spool segments whose rows it adds, and how an
attempt recognises them: the engine's doc (``_engine``) says why they make the commit
exactly once. Any kind of commit that adds spooled rows composes a `SegmentMarks`."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pyiceberg.table import Table

from icespool.errors import CommitError
from icespool.iceberg._commit._engine import Attempts, table_name
from icespool.iceberg._commit._snapshot import CommitResult, result_from_snapshot
from icespool.iceberg._segment_ranges import SpoolSegments, segment_ranges_key, with_segments
from icespool.iceberg._segments import (
    SEGMENT_RECORDS_SUMMARY_KEY,
    SEGMENTS_SUMMARY_KEY,
    committed_marks,
    covers,
    last_segment_records_key,
    last_segments_key,
)

__all__ = ["ClaimsMovedError", "SegmentMarks"]

_log = logging.getLogger("icespool.commit")


class ClaimsMovedError(CommitError):
    """Another writer committed positions these claims cover since they were filtered.

    Nothing was committed; filter the spooled rows again and retry.
    """


@dataclass(frozen=True)
class SegmentMarks:
    """The spool segments one commit adds: ``spans`` maps each to the records
    ``[start, end)`` of it the commit adds (``(0, 0)`` when the count is unknown: the mark
    then covers the whole segment, and any earlier mark holds it); ``spool`` what the
    committing process knows of its spool, to add them to the spool's segment ranges."""

    segments: tuple[str, ...]
    spans: Mapping[str, tuple[int, int]]
    counted: bool
    spool_id: str | None
    spool: SpoolSegments | None = None

    @classmethod
    def of(
        cls,
        segment_ids: Sequence[str],
        spans: Mapping[str, tuple[int, int]] | None,
        spool_id: str | None,
        spool: SpoolSegments | None = None,
    ) -> SegmentMarks:
        """The marks for ``segment_ids``; ValueError for ids a summary cannot list."""
        segments = tuple(segment_ids)
        if not segments:
            raise ValueError("commit_files needs the spool segment ids the files come from")
        for segment in segments:
            if not segment or "," in segment or segment != segment.strip():
                raise ValueError(
                    f"segment id {segment!r} must be non-empty, without commas or outer spaces"
                )
        if len(set(segments)) != len(segments):
            raise ValueError(f"segment ids contain duplicates: {list(segments)}")
        if spans is not None and set(spans) != set(segments):
            raise ValueError(f"segment_spans must name exactly the segments {list(segments)}")
        whole = dict.fromkeys(segments, (0, 0))
        return cls(segments, spans or whole, spans is not None, spool_id, spool)

    @property
    def text(self) -> str:
        return ",".join(self.segments)

    def _counts(self) -> str:
        return ",".join(str(self.spans[segment][1]) for segment in self.segments)

    def summary(self) -> dict[str, str]:
        """The snapshot summary entries naming the segments (and their record counts)."""
        marks = {SEGMENTS_SUMMARY_KEY: self.text}
        if self.counted:
            marks[SEGMENT_RECORDS_SUMMARY_KEY] = self._counts()
        return marks

    def properties(self, current: Mapping[str, str]) -> dict[str, str]:
        """The table properties recording them as the spool's latest commit and among
        its segment ranges (none without a spool id); ``current``: the properties of
        the table the attempt builds on."""
        if self.spool_id is None:
            return {}
        counts = self._counts() if self.counted else ""
        properties = {
            last_segments_key(self.spool_id): self.text,
            last_segment_records_key(self.spool_id): counts,
        }
        if self.spool is not None and self.counted:
            key = segment_ranges_key(self.spool_id)
            properties[key] = with_segments(current.get(key), self.spans, self.spool)
        return properties

    def landed(self, table: Table, attempts: Attempts) -> CommitResult | None:
        """The result when a snapshot of ``table`` holds the segments already, this
        call's or another (an earlier process's, a copy of the spool's)."""
        existing = self._holder(table)
        if existing is None:
            return None
        ours = attempts.ours(existing)
        if ours:
            _log.info(
                "table %s: an earlier attempt whose outcome was unknown did land "
                "(snapshot %d holds segments %s); not committing again",
                table_name(table),
                existing,
                self.text,
            )
        return result_from_snapshot(table, existing, attempts, ours=ours)

    def not_committed(self, table: Table, attempts: Attempts, last: BaseException) -> CommitError:
        """The error when the attempts ran out (``last``: the final one's error)."""
        return CommitError(
            f"table {table_name(table)}: commit of segments {list(self.segments)} failed "
            f"after {attempts.number} attempts ({type(last).__name__}: {last}); "
            "the spool still holds the records; a later attempt first checks the table for "
            "them, so nothing is committed twice"
        )

    def _holder(self, table: Table) -> int | None:
        """The snapshot already holding all of the spans' records, or None if none holds
        any.

        Raises `ClaimsMovedError` when another writer (a copy of this spool) committed a
        part of a segment past ``start`` since the caller read the table: the caller
        reads the table again and commits what is left."""
        spans = self.spans
        committed: dict[str, int] = {}
        for segment, (snapshot_id, covered) in committed_marks(table, spans).items():
            start, end = spans[segment]
            if covers(covered, end):
                committed[segment] = snapshot_id
            elif covered is not None and covered > start:
                raise ClaimsMovedError(
                    f"table {table_name(table)}: segment {segment} has {covered} of its "
                    f"records committed now, not {start} as they were when this commit was "
                    "built"
                )
        if not committed:
            return None
        missing = [segment for segment in spans if segment not in committed]
        if missing:
            # Committing the files would duplicate the committed segments' rows, and they
            # cannot be told apart inside the encoded files.
            raise CommitError(
                f"table {table_name(table)}: segments {sorted(committed)} are already "
                f"committed (snapshots {sorted(set(committed.values()))}) but {missing} are "
                "not; encode and commit the uncommitted segments on their own "
                "(the spool still holds their records)"
            )
        snapshots = set(committed.values())
        if len(snapshots) > 1:
            raise CommitError(
                f"table {table_name(table)}: segments {list(spans)} were committed by "
                f"several snapshots {sorted(snapshots)}; delete them from the spool only "
                "after checking"
            )
        return snapshots.pop()
