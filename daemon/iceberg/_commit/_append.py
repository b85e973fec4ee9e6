"""``commit_files``: one append snapshot per flush, idempotent per spool segment (its
marks: ``_marks``; why they make it exactly once: the engine's doc, ``_engine``).

Commit cost stays flat as the table ages. The append merges manifests as Iceberg's
MergeAppend does (the table properties ``commit.manifest-merge.enabled``,
``commit.manifest.min-count-to-merge``, ``commit.manifest.target-size-bytes``), so the
manifest list a commit reads and writes stays bounded instead of growing by one
manifest per commit. Refreshes skip re-reading unchanged metadata (``refresh_table``), a
staged commit derives the table's pending metadata once per change and without
copying it (``Staging``), and a SQL catalog commits without re-reading the table's
history (``_upstream/_sql.py``). What is left grows with the snapshots the table
retains (the metadata file written per commit holds them all), which expiry bounds.

Everything here blocks; the daemon calls it through ``asyncio.to_thread``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NoReturn

from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.table import Table, Transaction
from pyiceberg.table.snapshots import Operation

from icespool.errors import CommitError
from icespool.iceberg._commit._engine import Attempts, CommitKind, Staged, run, table_name
from icespool.iceberg._commit._marks import SegmentMarks
from icespool.iceberg._commit._snapshot import (
    CommitResult,
    cannot_load,
    check_summary,
    rejected,
    result_from_snapshot,
)
from icespool.iceberg._segment_ranges import SpoolSegments
from icespool.iceberg._upstream._merge_append import MergeAppend, MergeRowDelta
from icespool.iceberg._upstream._transaction import Staging, abandon
from icespool.runtime.retry import CONFLICTS, Backoff

__all__ = ["PropertyUpdate", "StaleEncodingError", "check_spec", "commit_files", "stage_files"]


#: Called inside every commit attempt with the refreshed table's properties; returns the
#: properties to set in the same metadata commit, or raises (nothing is committed).
PropertyUpdate = Callable[[Mapping[str, str]], Mapping[str, str]]


class StaleEncodingError(CommitError):
    """The data files were encoded for a partition spec the table no longer has.

    pyiceberg writes appended files into a manifest of the table's current spec, so
    committing them would record wrong partition values. Re-encode the segments (the
    spool still holds them) and commit again.
    """


def check_spec(table: Table, data_files: Sequence[DataFile]) -> None:
    """Refuse data files encoded for a partition spec the table no longer has."""
    current = table.metadata.default_spec_id
    for data_file in data_files:
        try:
            spec_id = data_file.spec_id
        except AttributeError:  # built elsewhere without a spec id: nothing to compare
            continue
        if spec_id != current:
            raise StaleEncodingError(
                f"table {table_name(table)}: {data_file.file_path} was encoded for partition spec "
                f"{spec_id} but the table now uses spec {current}; re-encode the segments "
                "(the spool still holds the records)"
            )


def _operation(files: Sequence[DataFile]) -> Operation:
    """Iceberg's operation for a commit adding ``files`` (RowDelta's rule): delete
    files with data files overwrite, delete files alone delete, data files append."""
    deletes = any(f.content != DataFileContent.DATA for f in files)
    data = any(f.content == DataFileContent.DATA for f in files)
    if not deletes:
        return Operation.APPEND
    return Operation.OVERWRITE if data else Operation.DELETE


def stage_files(
    table: Table,
    files: Sequence[DataFile],
    summary: Mapping[str, str],
    properties: Mapping[str, str],
) -> Transaction:
    """Build the snapshot adding ``files`` (writes manifests), with ``properties`` set
    in the same commit.

    A merge append (``MergeAppend``): with ``commit.manifest-merge.enabled`` (the
    table's choice; unset: true, Iceberg's default) the new manifest is merged with the
    existing small ones once ``commit.manifest.min-count-to-merge`` of them are due,
    bin-packed to ``commit.manifest.target-size-bytes``; disabled, it adds one manifest
    like a fast append. With delete files among the files (an upsert table's deletes)
    the same merge append also writes delete manifests (``MergeRowDelta``) and the
    operation is ``overwrite`` (``delete`` when only delete files are added). Nothing is
    committed here; a failure deletes what was written.
    """
    transaction = Staging(table)
    try:
        if properties:
            transaction.set_properties(dict(properties))
        operation = _operation(files)
        producer = MergeAppend if operation == Operation.APPEND else MergeRowDelta
        with producer(transaction, table.io, dict(summary), operation) as append:
            for data_file in files:
                append.append_data_file(data_file)
    except BaseException:
        abandon(transaction)  # certainly not committed: nothing was sent
        raise
    return transaction


@dataclass(frozen=True)
class _Append(CommitKind[dict[str, str], CommitResult]):
    """``data_files`` as one snapshot marked with the segments they come from; the
    decision is the table properties set in the same commit."""

    data_files: Sequence[DataFile]
    marks: SegmentMarks
    summary: Mapping[str, str]
    update_properties: PropertyUpdate | None
    noun = "commit"
    retries_outages = True

    def landed(self, table: Table, attempts: Attempts) -> CommitResult | None:
        return self.marks.landed(table, attempts)

    def decide(self, table: Table) -> dict[str, str]:
        check_spec(table, self.data_files)
        # Raises (nothing committed) when the refreshed table contradicts the caller.
        update = self.update_properties
        properties = table.metadata.properties
        return {**(update(properties) if update else {}), **self.marks.properties(properties)}

    def stage(self, table: Table, decision: dict[str, str]) -> Staged:
        summary = {**self.summary, **self.marks.summary()}
        return Staged(stage_files(table, self.data_files, summary, decision))

    def committed(self, table: Table, staged: Staged, attempts: Attempts) -> CommitResult:
        return result_from_snapshot(table, staged.snapshot_id, attempts, ours=True)

    def rejected(self, table: Table, error: BaseException) -> NoReturn:
        raise rejected(table, error) from error

    def unloadable(self, table: Table, error: BaseException) -> NoReturn:
        raise cannot_load(table, error) from error

    def gave_up(self, table: Table, attempts: Attempts, last: BaseException) -> NoReturn:
        raise self.marks.not_committed(table, attempts, last) from last


def commit_files(
    table: Table,
    data_files: Sequence[DataFile],
    *,
    segment_ids: Sequence[str],
    summary: Mapping[str, str],
    retry: Backoff = CONFLICTS,
    update_properties: PropertyUpdate | None = None,
    spool_id: str | None = None,
    segment_spans: Mapping[str, tuple[int, int]] | None = None,
    spool_segments: SpoolSegments | None = None,
) -> CommitResult:
    """Commit ``data_files`` as ONE append snapshot tagged with ``segment_ids``.

    ``data_files`` may include equality-delete files (content EQUALITY_DELETES): the
    snapshot then adds both (operation ``overwrite``, or ``delete`` without data files).

    Idempotent per segment set: if the table already has a snapshot covering
    ``segment_ids``, nothing is committed and that snapshot is returned with
    ``already_committed=True``. Conflicts with other writers are retried on a
    refreshed table; an error with an unknown outcome is resolved by looking for the
    segment ids in the refreshed table, never by committing blindly. Gives up with
    ``CommitError`` after ``retry.attempts`` attempts; the caller keeps the spool
    segments and tries again later. The attempts refused by a conflict are counted in
    ``CommitResult.conflicts``, or in ``CommitError.conflicts`` when the call raises.

    ``update_properties`` (Kafka offsets) is called in every attempt with the
    refreshed table's properties; what it returns is set in the same commit, and
    an exception from it aborts the commit.

    ``spool_id`` (the spool the segments come from) records them as that spool's
    latest commit in a table property, in the same commit (the engine's doc says why).

    ``segment_spans`` (segment id -> ``(start, end)``): the files hold records
    ``[start, end)`` of each segment, whose first ``start`` records an earlier commit
    holds; the snapshot records ``end`` as the segment's committed count. Without it
    the count is unknown and the mark covers the whole segment. Raises
    `ClaimsMovedError` (nothing committed) when another writer committed more of a
    segment meanwhile.

    ``spool_segments`` (with ``spool_id`` and ``segment_spans``): what the committing
    process knows of its spool; the segments join the spool's segment ranges in the
    same commit, so the table recognises them after their snapshot expired.
    """
    if not data_files:
        raise ValueError("commit_files needs at least one data file")
    marks = SegmentMarks.of(segment_ids, segment_spans, spool_id, spool_segments)
    check_summary(summary)
    return run(table, _Append(data_files, marks, summary, update_properties), retry)
