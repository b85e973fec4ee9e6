"""``commit_upsert``: an upsert table's commit, ONE snapshot of its new rows and the
deletes of the older rows of every key it changes (a row delta), idempotent per spool
segment as an append is (the segment marks: ``_marks``).

What the snapshot adds and removes is decided on every attempt, against the refreshed
table that attempt builds on (``resolve``): position deletes naming the rows the key
index found live in that state (or equality deletes when the index cannot answer), and
possibly data files rewritten with the changes applied (the writer's small last file)
in place of the old ones. The catalog swaps only if that state is still current, so a
concurrent rewrite, delete or upsert by another writer fails the swap, and the next
attempt resolves again against the new files: a position is never applied to a row
that moved. The files written for an attempt that does not land are deleted with it
(``Staged.files``).

Everything here blocks; the daemon calls it through ``asyncio.to_thread``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NoReturn

from pyiceberg.exceptions import ValidationException
from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.table import Table, Transaction
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.table.snapshots import Operation

from icespool.iceberg._commit._append import PropertyUpdate, check_spec, stage_files
from icespool.iceberg._commit._engine import Attempts, CommitKind, Staged, run, table_name
from icespool.iceberg._commit._marks import SegmentMarks
from icespool.iceberg._commit._snapshot import (
    CommitResult,
    cannot_load,
    check_summary,
    rejected,
    result_from_snapshot,
)
from icespool.iceberg._parquet import remove_files
from icespool.iceberg._segment_ranges import SpoolSegments
from icespool.iceberg._upstream._replace import ReplaceFiles
from icespool.iceberg._upstream._transaction import Staging, abandon, staged_row_ids
from icespool.runtime.retry import CONFLICTS, Backoff

__all__ = ["AttemptChanges", "UpsertResult", "commit_upsert"]


class StaleChangesError(Exception):
    """An attempt's changes remove a file its base no longer holds: the attempt fails
    (nothing sent) and the next one decides again."""


@dataclass(frozen=True)
class AttemptChanges:
    """What one attempt's snapshot adds and removes, decided for the table it builds on.

    ``added``: data and delete files; ``removed``: files the snapshot takes out (data
    files rewritten with the changes applied, delete files merged into new ones);
    ``written``: those of ``added`` written for this attempt alone (deleted if it does
    not land); ``detail``: the caller's own record of the attempt, handed back with the
    result of the attempt that lands."""

    added: Sequence[DataFile]
    removed: Sequence[DataFile] = ()
    written: Sequence[DataFile] = ()
    detail: object = None


#: Decides an attempt's changes for the refreshed table (called once per attempt).
Resolve = Callable[[Table], AttemptChanges]


@dataclass(frozen=True)
class UpsertResult:
    """What `commit_upsert` committed, and (when an attempt of this call landed) the
    snapshot that attempt built on, its changes and (a table with row lineage) the
    ``first_row_id`` each data file it added was given, by path."""

    commit: CommitResult
    parent_id: int | None = None
    changes: AttemptChanges | None = None
    row_ids: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class _Attempt:
    parent_id: int | None
    changes: AttemptChanges
    row_ids: Mapping[str, int]


@dataclass(frozen=True)
class _Upsert(CommitKind[dict[str, str], CommitResult]):
    """The files ``resolve`` decides for each attempt's base, as one snapshot."""

    resolve: Resolve
    marks: SegmentMarks
    summary: Mapping[str, str]
    update_properties: PropertyUpdate | None
    noun = "commit"
    retries_outages = True
    # Snapshot id of each attempt staged -> what it built on and changed.
    staged: dict[int, _Attempt] = field(default_factory=dict)

    def landed(self, table: Table, attempts: Attempts) -> CommitResult | None:
        return self.marks.landed(table, attempts)

    def decide(self, table: Table) -> dict[str, str]:
        update = self.update_properties
        properties = table.metadata.properties
        return {**(update(properties) if update else {}), **self.marks.properties(properties)}

    def stage(self, table: Table, decision: dict[str, str]) -> Staged:
        current = table.metadata.current_snapshot()
        changes = self.resolve(table)
        try:
            check_spec(table, [f for f in changes.added if f.content == DataFileContent.DATA])
            summary = {**self.summary, **self.marks.summary()}
            if changes.removed:
                transaction = _stage_overwrite(table, changes, summary, decision)
            else:
                transaction = stage_files(table, changes.added, summary, decision)
        except BaseException:
            remove_files(table, changes.written)
            raise
        staged = Staged(transaction, files=changes.written)
        parent = None if current is None else current.snapshot_id
        self.staged[staged.snapshot_id] = _Attempt(parent, changes, staged_row_ids(transaction))
        return staged

    def committed(self, table: Table, staged: Staged, attempts: Attempts) -> CommitResult:
        return result_from_snapshot(table, staged.snapshot_id, attempts, ours=True)

    def rejected(self, table: Table, error: BaseException) -> NoReturn:
        raise rejected(table, error) from error

    def unloadable(self, table: Table, error: BaseException) -> NoReturn:
        raise cannot_load(table, error) from error

    def gave_up(self, table: Table, attempts: Attempts, last: BaseException) -> NoReturn:
        raise self.marks.not_committed(table, attempts, last) from last


def _stage_overwrite(
    table: Table,
    changes: AttemptChanges,
    summary: Mapping[str, str],
    properties: Mapping[str, str],
) -> Transaction:
    """The snapshot taking ``changes.removed`` out and putting ``changes.added`` in: an
    ``overwrite`` (rows changed), by the producer that can remove delete files too."""
    transaction = Staging(table)
    try:
        if properties:
            transaction.set_properties(dict(properties))
        producer = ReplaceFiles(
            operation=Operation.OVERWRITE,
            transaction=transaction,
            io=table.io,
            snapshot_properties=dict(summary),
            branch=MAIN_BRANCH,
        )
        producer.label = Operation.OVERWRITE
        for data_file in changes.removed:
            producer.delete_data_file(data_file)
        for data_file in changes.added:
            producer.append_data_file(data_file)
        producer.commit()
    except ValidationException as exc:  # "Missing required files to delete"
        abandon(transaction)
        # The changes named a file the refreshed table no longer holds. Nothing was
        # sent; the next attempt decides again on the table as it is then.
        raise StaleChangesError(f"table {table_name(table)}: {exc}") from exc
    except BaseException:
        abandon(transaction)
        raise
    return transaction


def commit_upsert(
    table: Table,
    resolve: Resolve,
    *,
    segment_ids: Sequence[str],
    summary: Mapping[str, str],
    retry: Backoff = CONFLICTS,
    update_properties: PropertyUpdate | None = None,
    spool_id: str | None = None,
    segment_spans: Mapping[str, tuple[int, int]] | None = None,
    spool_segments: SpoolSegments | None = None,
) -> UpsertResult:
    """Commit the files ``resolve`` decides for each attempt's base (an upsert table's
    new rows and the deletes of its keys' older rows), as ONE snapshot tagged with
    ``segment_ids``. Everything else as `commit_files` (the marks, ``spool_id``,
    ``segment_spans``, ``spool_segments``, ``update_properties``, conflicts and unknown
    outcomes)."""
    marks = SegmentMarks.of(segment_ids, segment_spans, spool_id, spool_segments)
    check_summary(summary)
    kind = _Upsert(resolve, marks, summary, update_properties)
    result = run(table, kind, retry)
    attempt = kind.staged.get(result.snapshot_id) if not result.already_committed else None
    if attempt is None:
        return UpsertResult(result)
    return UpsertResult(result, attempt.parent_id, attempt.changes, attempt.row_ids)
