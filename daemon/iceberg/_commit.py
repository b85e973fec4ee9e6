"""Every commit the daemon makes to a table, by kind; this module gathers their names.

    _append          ONE snapshot per flush (rows, and an upsert table's equality
                     deletes), idempotent per spool segment
    _segments        the marks those commits leave: which segments a table holds
    _replace         maintenance rewrites (compaction) as ONE ``replace`` snapshot
    _housekeeping    table properties, snapshot expiry, row deletes
    _commit_common   what they share: errors, results, one attempt sent to the catalog,
                     icespool's own commit requirements

The pieces of pyiceberg they extend or replace (transactions, snapshot producers,
manifest writers) live in the fence, ``_upstream``.

Everything here blocks; the daemon calls it through ``asyncio.to_thread``. A Table
instance must not be shared between threads while a commit runs (it is refreshed in
place).
"""

from __future__ import annotations

from icespool.iceberg._append import PropertyUpdate, StaleEncodingError, commit_files
from icespool.iceberg._commit_common import (
    AssertProperty,
    AssertUnreferenced,
    CommitRejectedError,
    CommitResult,
    new_transaction,
    validates_locally,
)
from icespool.iceberg._housekeeping import (
    ExpiredSnapshots,
    commit_expiry,
    commit_properties,
    delete_rows,
)
from icespool.iceberg._replace import (
    CommitOutcomeUnknownError,
    ReplaceConflictError,
    commit_replace,
)
from icespool.iceberg._segments import (
    SEGMENT_RECORDS_SUMMARY_KEY,
    SEGMENTS_SUMMARY_KEY,
    committed_marks,
    find_committed_segments,
    last_segment_records_key,
    last_segments_key,
)

__all__ = [
    "SEGMENTS_SUMMARY_KEY",
    "SEGMENT_RECORDS_SUMMARY_KEY",
    "AssertProperty",
    "AssertUnreferenced",
    "CommitOutcomeUnknownError",
    "CommitRejectedError",
    "CommitResult",
    "ExpiredSnapshots",
    "PropertyUpdate",
    "ReplaceConflictError",
    "StaleEncodingError",
    "commit_expiry",
    "commit_files",
    "commit_properties",
    "commit_replace",
    "committed_marks",
    "delete_rows",
    "find_committed_segments",
    "last_segment_records_key",
    "last_segments_key",
    "new_transaction",
    "validates_locally",
]
