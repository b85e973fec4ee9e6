"""Every commit the daemon makes to a table: one engine, and the kinds it commits.

    _engine          the protocol, written once: refresh, look for the change, decide
                     and stage, send once, classify the error, retry, the last look;
                     its doc holds the exactly-once argument
    _requirements    icespool's own commit requirements (a lease's property, the refs
                     an expiry relies on) and the catalogs that can check them
    _snapshot        what the kinds adding a data snapshot share: reserved summary
                     keys, their result and errors
    _marks           the spool segments a data commit adds: its summary marks and
                     properties, and how an attempt recognises them
    _append          ONE snapshot per flush (rows, and an upsert table's equality
                     deletes), idempotent per spool segment
    _replace         maintenance rewrites (compaction) as ONE ``replace`` snapshot
    _housekeeping    table properties, snapshot expiry, row deletes
    _schema          a schema change for incoming data

A new kind implements `_engine.CommitKind`: what it decides and stages on the refreshed
table, how it recognises its change, its result. A row delta adding data files with
position deletes, say: ``landed`` by its `_marks.SegmentMarks`, ``decide`` resolving the
deletes against the refreshed table (raising when a data file they point at is no longer
live, or a delete file added since its base conflicts), ``stage`` the row delta, the
errors as the append's; a conflict resolves them again on the next attempt. The pieces
of pyiceberg they extend or replace (transactions, snapshot producers, manifest writers)
live in the fence, ``_upstream``.

Everything here blocks; the daemon calls it through ``asyncio.to_thread``. A Table
instance must not be shared between threads while a commit runs (it is refreshed in
place).
"""

from __future__ import annotations

from icespool.iceberg._commit._append import PropertyUpdate, StaleEncodingError, commit_files
from icespool.iceberg._commit._housekeeping import (
    ExpiredSnapshots,
    commit_expiry,
    commit_properties,
    delete_rows,
)
from icespool.iceberg._commit._marks import ClaimsMovedError
from icespool.iceberg._commit._replace import (
    CommitOutcomeUnknownError,
    ReplaceConflictError,
    commit_replace,
)
from icespool.iceberg._commit._requirements import (
    AssertProperty,
    AssertUnreferenced,
    validates_locally,
)
from icespool.iceberg._commit._schema import commit_evolution
from icespool.iceberg._commit._snapshot import CommitRejectedError, CommitResult

__all__ = [
    "AssertProperty",
    "AssertUnreferenced",
    "ClaimsMovedError",
    "CommitOutcomeUnknownError",
    "CommitRejectedError",
    "CommitResult",
    "ExpiredSnapshots",
    "PropertyUpdate",
    "ReplaceConflictError",
    "StaleEncodingError",
    "commit_evolution",
    "commit_expiry",
    "commit_files",
    "commit_properties",
    "commit_replace",
    "delete_rows",
    "validates_locally",
]
