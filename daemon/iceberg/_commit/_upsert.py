"""``commit_upsert``: an upsert table's commit, ONE snapshot of its new rows and the
deletes of the older rows of every key it changes (a row delta), idempotent per spool
segment as an append is (the segment marks: ``_marks``).

The deletes are resolved on every attempt, against the refreshed table that attempt
builds on (``resolve``): position deletes naming the rows the key index found live in
that state (or equality deletes when the index cannot answer). The catalog swaps only
if that state is still current, so a concurrent rewrite, delete or upsert by another
writer fails the swap, and the next attempt resolves again against the new files: a
position is never applied to a row that moved. The delete files of an attempt that
does not land are deleted with it (``Staged.files``).

Everything here blocks; the daemon calls it through ``asyncio.to_thread``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NoReturn

from pyiceberg.manifest import DataFile
from pyiceberg.table import Table

from icespool.cdc import Located
from icespool.iceberg._commit._append import PropertyUpdate, check_spec, stage_files
from icespool.iceberg._commit._engine import Attempts, CommitKind, Staged, run
from icespool.iceberg._commit._marks import SegmentMarks
from icespool.iceberg._commit._snapshot import (
    CommitResult,
    cannot_load,
    check_summary,
    rejected,
    result_from_snapshot,
)
from icespool.iceberg._parquet import remove_files
from icespool.runtime.retry import CONFLICTS, Backoff

__all__ = ["AttemptDeletes", "UpsertResult", "commit_upsert"]


@dataclass(frozen=True)
class AttemptDeletes:
    """The delete files one attempt adds, written for the table it builds on, and where
    the rows they delete were (None: equality deletes, which name keys, not rows)."""

    files: Sequence[DataFile]
    located: Located | None = None


#: Writes the delete files for the refreshed table (each attempt calls it once).
Resolve = Callable[[Table], AttemptDeletes]


@dataclass(frozen=True)
class UpsertResult:
    """What `commit_upsert` committed, and (when an attempt of this call landed) the
    snapshot that attempt built on and the deletes it added."""

    commit: CommitResult
    parent_id: int | None = None
    deletes: AttemptDeletes | None = None


@dataclass(frozen=True)
class _Attempt:
    parent_id: int | None
    deletes: AttemptDeletes


@dataclass(frozen=True)
class _Upsert(CommitKind[dict[str, str], CommitResult]):
    """The data files, plus the deletes ``resolve`` writes for each attempt's base."""

    data_files: Sequence[DataFile]
    resolve: Resolve
    marks: SegmentMarks
    summary: Mapping[str, str]
    update_properties: PropertyUpdate | None
    noun = "commit"
    retries_outages = True
    # Snapshot id of each attempt staged -> what it built on and deleted.
    staged: dict[int, _Attempt] = field(default_factory=dict)

    def landed(self, table: Table, attempts: Attempts) -> CommitResult | None:
        return self.marks.landed(table, attempts)

    def decide(self, table: Table) -> dict[str, str]:
        check_spec(table, self.data_files)
        update = self.update_properties
        return {**(update(table.metadata.properties) if update else {}), **self.marks.properties()}

    def stage(self, table: Table, decision: dict[str, str]) -> Staged:
        current = table.metadata.current_snapshot()
        deletes = self.resolve(table)
        try:
            summary = {**self.summary, **self.marks.summary()}
            transaction = stage_files(table, [*self.data_files, *deletes.files], summary, decision)
        except BaseException:
            remove_files(table, deletes.files)
            raise
        staged = Staged(transaction, files=deletes.files)
        parent = None if current is None else current.snapshot_id
        self.staged[staged.snapshot_id] = _Attempt(parent, deletes)
        return staged

    def committed(self, table: Table, staged: Staged, attempts: Attempts) -> CommitResult:
        return result_from_snapshot(table, staged.snapshot_id, attempts, ours=True)

    def rejected(self, table: Table, error: BaseException) -> NoReturn:
        raise rejected(table, error) from error

    def unloadable(self, table: Table, error: BaseException) -> NoReturn:
        raise cannot_load(table, error) from error

    def gave_up(self, table: Table, attempts: Attempts, last: BaseException) -> NoReturn:
        raise self.marks.not_committed(table, attempts, last) from last


def commit_upsert(
    table: Table,
    data_files: Sequence[DataFile],
    resolve: Resolve,
    *,
    segment_ids: Sequence[str],
    summary: Mapping[str, str],
    retry: Backoff = CONFLICTS,
    update_properties: PropertyUpdate | None = None,
    spool_id: str | None = None,
    segment_spans: Mapping[str, tuple[int, int]] | None = None,
) -> UpsertResult:
    """Commit ``data_files`` (an upsert table's new rows, possibly none) with the
    deletes ``resolve`` writes for each attempt's base, as ONE snapshot tagged with
    ``segment_ids``. Everything else as `commit_files` (the marks, ``spool_id``,
    ``segment_spans``, ``update_properties``, conflicts and unknown outcomes)."""
    marks = SegmentMarks.of(segment_ids, segment_spans, spool_id)
    check_summary(summary)
    kind = _Upsert(data_files, resolve, marks, summary, update_properties)
    result = run(table, kind, retry)
    attempt = kind.staged.get(result.snapshot_id) if not result.already_committed else None
    if attempt is None:
        return UpsertResult(result)
    return UpsertResult(result, attempt.parent_id, attempt.deletes)
