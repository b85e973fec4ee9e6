"""What every kind of commit shares: its errors and result, one attempt sent to the
catalog, the requirements icespool adds, and the cleanup after a call's attempts.

One attempt (``commit_once``) is sent once: a conflict comes back to the caller's loop,
which refreshes the table and checks again before building the next attempt.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal, cast

from pydantic import Field
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NoSuchNamespaceError,
    NoSuchTableError,
    ResolveError,
    ValidationException,
)
from pyiceberg.table import Table, Transaction
from pyiceberg.table.metadata import TableMetadata
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
from pyiceberg.table.update import (
    AssertTableUUID,
    TableRequirement,
    ValidatableTableRequirement,
)

from icespool.errors import CommitError
from icespool.iceberg._segments import SEGMENT_RECORDS_SUMMARY_KEY, SEGMENTS_SUMMARY_KEY
from icespool.iceberg._upstream._refresh import refresh_table
from icespool.iceberg._upstream._transaction import Staging, abandon, send, staged_table, tidy

__all__ = [
    "PERMANENT_ERRORS",
    "RESERVED_SUMMARY_KEYS",
    "TABLE_GONE",
    "AssertProperty",
    "AssertUnreferenced",
    "CommitRejectedError",
    "CommitResult",
    "check_summary",
    "commit_once",
    "new_transaction",
    "rejected",
    "result_from_snapshot",
    "settle",
    "summary_int",
    "table_name",
    "try_refresh",
    "validates_locally",
]

_log = logging.getLogger("icespool.commit")


# Errors that say the request itself is wrong: retrying cannot help, and the commit
# certainly did not land (they are raised while building or validating it).
PERMANENT_ERRORS: Final = (
    NoSuchTableError,
    NoSuchNamespaceError,
    ValidationException,
    ResolveError,
    ValueError,
    TypeError,
)

TABLE_GONE: Final = (NoSuchTableError, NoSuchNamespaceError)

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


def summary_int(snapshot: Snapshot, key: str) -> int:
    value = snapshot.summary.get(key) if snapshot.summary is not None else None
    return int(value) if value else 0


def result_from_snapshot(
    table: Table,
    snapshot_id: int,
    *,
    attempts: int,
    ours: bool,
    unknown: int = 0,
    conflicts: int = 0,
) -> CommitResult:
    snapshot = table.metadata.snapshot_by_id(snapshot_id)
    if snapshot is None:  # pragma: no cover - the id was read from the same metadata
        raise CommitError(f"snapshot {snapshot_id} vanished from table {table_name(table)}")
    return CommitResult(
        snapshot_id=snapshot_id,
        records=summary_int(snapshot, ADDED_RECORDS),
        files=summary_int(snapshot, ADDED_DATA_FILES),
        bytes=summary_int(snapshot, ADDED_FILE_SIZE),
        already_committed=not ours,
        attempts=attempts,
        unknown_outcomes=unknown,
        conflicts=conflicts,
    )


def table_name(table: Table) -> str:
    return ".".join(table.name())


def new_transaction(table: Table) -> Transaction:
    """A transaction on ``table`` for pyiceberg's update APIs (``ExpireSnapshots(...)``,
    ``update_snapshot()``...) that does not deep-copy the table's metadata on every
    read. Send it with ``commit_once`` (one attempt; conflicts come back to the
    caller), never with ``commit_transaction``."""
    return Staging(table)


def settle(table: Table, attempts: Mapping[int, Transaction], landed: int) -> None:
    """Clean up after this call's attempts once the one that holds ``landed`` is known.

    The others certainly never land: each attempt was built after seeing the ones
    before it absent, and the catalog's compare-and-swap fails an attempt whose base
    is no longer current, so at most one of them can ever land. Cleanup is best effort:
    a file left behind is an orphan, never a failure of the commit.
    """
    for snapshot_id, transaction in attempts.items():
        try:
            if snapshot_id == landed:
                tidy(table, transaction)
            else:
                abandon(transaction)
        except Exception as exc:
            _log.warning(
                "table %s: could not delete files of an earlier commit attempt: %s: %s",
                table_name(table),
                type(exc).__name__,
                exc,
            )


class AssertProperty(ValidatableTableRequirement):
    """Compare-and-swap on one table property: the commit lands only if ``key`` still
    has ``value`` (None: absent) in the metadata it is applied to.

    Iceberg has no such requirement, so only a catalog that validates requirements
    itself, against the metadata it swaps (`validates_locally`), can honour it; a REST
    catalog would send it to a server that does not know it. ``commit_once`` refuses
    it elsewhere rather than commit unguarded.
    """

    type: Literal["icespool-assert-property"] = Field(default="icespool-assert-property")
    key: str
    value: str | None = None

    def validate(self, base_metadata: TableMetadata | None) -> None:  # type: ignore[override]
        if base_metadata is None:
            raise CommitFailedException("Requirement failed: current table metadata is missing")
        current = base_metadata.properties.get(self.key)
        if current != self.value:
            raise CommitFailedException(
                f"Requirement failed: property {self.key} is {current!r}, expected {self.value!r}"
            )


class AssertUnreferenced(ValidatableTableRequirement):
    """No branch or tag points at any of ``snapshot_ids`` (an expiry must not remove a
    ref someone created, or a branch rolled back, since it chose what to expire:
    removing a snapshot drops the refs that point at it). Local validation only, as
    `AssertProperty`; elsewhere `commit_expiry` asserts every ref's position instead."""

    type: Literal["icespool-assert-unreferenced"] = Field(default="icespool-assert-unreferenced")
    snapshot_ids: list[int]

    def validate(self, base_metadata: TableMetadata | None) -> None:  # type: ignore[override]
        if base_metadata is None:
            raise CommitFailedException("Requirement failed: current table metadata is missing")
        wanted = set(self.snapshot_ids)
        for name, ref in base_metadata.refs.items():
            if ref.snapshot_id in wanted:
                raise CommitFailedException(
                    f"Requirement failed: ref {name} now points at snapshot {ref.snapshot_id}, "
                    "which this commit would expire"
                )


_LOCAL_REQUIREMENTS: Final = (AssertProperty, AssertUnreferenced)


def validates_locally(catalog: Catalog) -> bool:
    """Whether ``catalog`` checks a commit's requirements itself against the metadata it
    then swaps by compare-and-swap, so `AssertProperty` / `AssertUnreferenced` hold.

    pyiceberg's SqlCatalog does (``_update_and_stage_table`` validates every requirement
    on the metadata it loaded, and the UPDATE swaps metadata_location only if it is still
    that one; `IcespoolSqlCatalog` validates on the base it swaps from), and so does its
    GlueCatalog (the same validation, then UpdateTable conditional on the table's
    VersionId). REST sends requirements to the server, which knows only Iceberg's own.
    """
    if isinstance(catalog, SqlCatalog):
        return True
    try:
        from pyiceberg.catalog.glue import GlueCatalog  # the glue extra (boto3)
    except ImportError:
        return False
    return isinstance(catalog, GlueCatalog)


def commit_once(
    transaction: Transaction, requirements: Sequence[ValidatableTableRequirement] = ()
) -> None:
    """Send the staged commit once; a conflict raises CommitFailedException.

    pyiceberg's ``commit_transaction`` retries a conflict by re-applying our updates
    on the refreshed table. That would skip our own checks (segment ids, Kafka
    offset ranges) against what the other writer just committed, so conflicts come
    back to ``commit_files``' loop, which refreshes and checks again (the sending itself
    is ``_upstream/_transaction.send``); tests/test_committer.py covers conflicts.

    ``requirements``: more conditions the catalog checks at the swap (a lease, the
    refs an expiry relies on). icespool's own kinds need `validates_locally`.
    """
    table = staged_table(transaction)
    if any(isinstance(r, _LOCAL_REQUIREMENTS) for r in requirements) and not validates_locally(
        table.catalog
    ):
        raise CommitError(
            f"table {table_name(table)}: catalog type {type(table.catalog).__name__} cannot check "
            "icespool's commit requirements (a maintenance lease); nothing was committed"
        )
    # pyiceberg types requirements as the union of Iceberg's kinds; a catalog that
    # validates locally (checked above) only calls validate() on them.
    every = cast(
        "tuple[TableRequirement, ...]",
        (
            *requirements,
            # The staged updates never change the uuid: read it without deriving metadata.
            AssertTableUUID(uuid=table.metadata.table_uuid),
        ),
    )
    try:
        send(transaction, every)
    except CommitFailedException:
        # Certainly not landed: the manifests written for this attempt are garbage.
        abandon(transaction)
        raise


def rejected(table: Table, exc: BaseException) -> CommitError:
    """The error for a permanent failure: the data's fault, or the table's when the table
    or namespace is gone."""
    error = CommitError if isinstance(exc, TABLE_GONE) else CommitRejectedError
    return error(
        f"table {table_name(table)}: commit rejected ({type(exc).__name__}: {exc}); "
        "the spool still holds the records"
    )


def try_refresh(table: Table) -> BaseException | None:
    """Refresh the table; return the error if the catalog could not be read."""
    try:
        refresh_table(table)
    except PERMANENT_ERRORS as exc:
        raise CommitError(
            f"table {table_name(table)}: cannot load it ({type(exc).__name__}: {exc}); "
            "the spool still holds the records"
        ) from exc
    except Exception as exc:  # catalog unreachable: the caller retries with backoff
        _log.warning("table %s: refresh failed: %s: %s", table_name(table), type(exc).__name__, exc)
        return exc
    return None


def check_summary(summary: Mapping[str, str]) -> None:
    """Refuse summary keys Iceberg or icespool computes, and values that are no strings."""
    for key, value in summary.items():
        if key in RESERVED_SUMMARY_KEYS or key.startswith(CHANGED_PARTITION_PREFIX):
            raise ValueError(f"summary key {key!r} is reserved by Iceberg or icespool")
        if not isinstance(value, str):
            raise ValueError(f"summary value for {key!r} must be a string")
