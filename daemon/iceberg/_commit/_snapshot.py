"""What the kinds that add a data snapshot (append, replace) share: the summary keys a
caller may not set, the result a caller gets, and the errors for a table that cannot be
loaded or a commit Iceberg refuses."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from pyiceberg.table import Table
from pyiceberg.table.snapshots import (
    ADDED_DATA_FILES,
    ADDED_FILE_SIZE,
    ADDED_RECORDS,
    CHANGED_PARTITION_COUNT_PROP,
    CHANGED_PARTITION_PREFIX,
    OPERATION,
    PARTITION_SUMMARY_PROP,
    Snapshot,
)

from icespool.errors import CommitError
from icespool.iceberg._commit._engine import TABLE_GONE, Attempts, table_name
from icespool.iceberg._segments import SEGMENT_RECORDS_SUMMARY_KEY, SEGMENTS_SUMMARY_KEY

__all__ = [
    "RESERVED_SUMMARY_KEYS",
    "CommitRejectedError",
    "CommitResult",
    "cannot_load",
    "check_summary",
    "rejected",
    "result_from_snapshot",
]

# Summary keys pyiceberg computes itself; a caller key with one of these names would
# make pyiceberg's Summary(...) fail or lie.
RESERVED_SUMMARY_KEYS: Final = frozenset(
    {
        OPERATION,
        SEGMENTS_SUMMARY_KEY,
        SEGMENT_RECORDS_SUMMARY_KEY,
        CHANGED_PARTITION_COUNT_PROP,
        PARTITION_SUMMARY_PROP,
        "added-data-files",
        "added-delete-files",
        "added-equality-delete-files",
        "added-equality-deletes",
        "added-files-size",
        "added-position-delete-files",
        "added-position-deletes",
        "added-records",
        "deleted-data-files",
        "deleted-records",
        "removed-delete-files",
        "removed-equality-delete-files",
        "removed-equality-deletes",
        "removed-files-size",
        "removed-position-delete-files",
        "removed-position-deletes",
        "total-data-files",
        "total-delete-files",
        "total-equality-deletes",
        "total-files-size",
        "total-position-deletes",
        "total-records",
    }
)


class CommitRejectedError(CommitError):
    """Iceberg rejected what the commit adds (validation, a value the table cannot
    hold): the data's fault, not the catalog's; retrying the same files cannot help.
    Nothing was committed."""


@dataclass(frozen=True)
class CommitResult:
    """Outcome of ``commit_files``.

    ``already_committed`` is true when the segments were found in a snapshot that
    this call did not create (a retry after a crash between commit and spool delete);
    the figures then come from that snapshot's summary.
    """

    snapshot_id: int
    records: int
    files: int
    bytes: int
    already_committed: bool
    attempts: int = 1
    # Attempts whose outcome was unknown (lost answer, 5xx, reset) and were resolved by
    # looking for the segments in the refreshed table.
    unknown_outcomes: int = 0
    # Attempts the catalog refused because another writer committed first (each was
    # retried on the refreshed table).
    conflicts: int = 0


def _summary_int(snapshot: Snapshot, key: str) -> int:
    value = snapshot.summary.get(key) if snapshot.summary is not None else None
    return int(value) if value else 0


def result_from_snapshot(
    table: Table, snapshot_id: int, attempts: Attempts, *, ours: bool
) -> CommitResult:
    """The result of a call whose change is ``snapshot_id`` (``ours``: one of its
    attempts added it), with the figures of its ``attempts``."""
    snapshot = table.metadata.snapshot_by_id(snapshot_id)
    if snapshot is None:  # pragma: no cover - the id was read from the same metadata
        raise CommitError(f"snapshot {snapshot_id} vanished from table {table_name(table)}")
    return CommitResult(
        snapshot_id=snapshot_id,
        records=_summary_int(snapshot, ADDED_RECORDS),
        files=_summary_int(snapshot, ADDED_DATA_FILES),
        bytes=_summary_int(snapshot, ADDED_FILE_SIZE),
        already_committed=not ours,
        attempts=attempts.number,
        unknown_outcomes=attempts.unknown,
        conflicts=attempts.conflicts,
    )


def rejected(table: Table, exc: BaseException) -> CommitError:
    """The error for a permanent failure: the data's fault, or the table's when the table
    or namespace is gone."""
    error = CommitError if isinstance(exc, TABLE_GONE) else CommitRejectedError
    return error(
        f"table {table_name(table)}: commit rejected ({type(exc).__name__}: {exc}); "
        "the spool still holds the records"
    )


def cannot_load(table: Table, exc: BaseException) -> CommitError:
    """The error for a table the refresh cannot load (gone, or re-created)."""
    return CommitError(
        f"table {table_name(table)}: cannot load it ({type(exc).__name__}: {exc}); "
        "the spool still holds the records"
    )


def check_summary(summary: Mapping[str, str]) -> None:
    """Refuse summary keys Iceberg or icespool computes, and values that are no strings."""
    for key, value in summary.items():
        if key in RESERVED_SUMMARY_KEYS or key.startswith(CHANGED_PARTITION_PREFIX):
            raise ValueError(f"summary key {key!r} is reserved by Iceberg or icespool")
        if not isinstance(value, str):
            raise ValueError(f"summary value for {key!r} must be a string")
