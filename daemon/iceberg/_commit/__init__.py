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
    _append          ONE snapshot per flush of rows, idempotent per spool segment
    _upsert          an upsert table's flush: its rows and the deletes resolved on each
                     attempt's base (position deletes of the rows the key index finds)
    _replace         maintenance rewrites (compaction) as ONE ``replace`` snapshot
    _housekeeping    table properties, snapshot expiry, row deletes
    _schema          a schema change for incoming data

A new kind implements `_engine.CommitKind`: what it decides and stages on the refreshed
table, how it recognises its change, its result. The pieces of pyiceberg they extend or
replace (transactions, snapshot producers, manifest writers) live in the fence,
``_upstream``.

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
    ReplaceExtra,
    commit_replace,
)
from icespool.iceberg._commit._requirements import (
    AssertProperty,
    AssertUnreferenced,
    validates_locally,
)
from icespool.iceberg._commit._schema import commit_evolution
from icespool.iceberg._commit._snapshot import CommitRejectedError, CommitResult
from icespool.iceberg._commit._upsert import AttemptChanges, UpsertResult, commit_upsert

__all__ = [
    "AssertProperty",
    "AssertUnreferenced",
    "AttemptChanges",
    "ClaimsMovedError",
    "CommitOutcomeUnknownError",
    "CommitRejectedError",
    "CommitResult",
    "ExpiredSnapshots",
    "PropertyUpdate",
    "ReplaceConflictError",
    "ReplaceExtra",
    "StaleEncodingError",
    "UpsertResult",
    "commit_evolution",
    "commit_expiry",
    "commit_files",
    "commit_properties",
    "commit_replace",
    "commit_upsert",
    "delete_rows",
    "validates_locally",
]
