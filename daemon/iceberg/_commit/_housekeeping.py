"""Commits that add no spooled rows: table properties, snapshot expiry, row deletes.

Each attempt refreshes the table and decides again on what it finds, and a conflict is
retried on the refreshed table (the engine, ``_engine``). Their callers retry on their
own terms (the next tick, the next maintenance run), so a catalog that cannot be reached
ends the call with its error. Everything here blocks; the daemon calls it through
``asyncio.to_thread``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from pyiceberg.expressions import BooleanExpression
from pyiceberg.table import Table, Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.table.update import (
    AssertRefSnapshotId,
    RemoveSnapshotsUpdate,
    ValidatableTableRequirement,
)

from icespool.iceberg._commit._engine import (
    Attempts,
    CommitKind,
    Staged,
    Unchanged,
    run,
    table_name,
)
from icespool.iceberg._commit._requirements import (
    AssertProperty,
    AssertUnreferenced,
    validates_locally,
)
from icespool.iceberg._upstream._refresh import refresh_table
from icespool.iceberg._upstream._transaction import Staging, stage, staged_updates
from icespool.runtime.retry import CONFLICTS, Backoff

__all__ = ["ExpiredSnapshots", "commit_expiry", "commit_properties", "delete_rows"]

_log = logging.getLogger("icespool.commit")


@dataclass
class _Properties(CommitKind[dict[str, str], bool]):
    """The properties ``updates`` returns that differ from the table's; the decision is
    those. Recognised by their values, when an attempt's outcome was unknown."""

    updates: Callable[[Mapping[str, str]], Mapping[str, str]]
    guard: Collection[str]
    requirements: Sequence[ValidatableTableRequirement]
    sent: dict[str, str] = field(default_factory=dict)
    noun = "property commit"
    retries_outages = False

    def landed(self, table: Table, attempts: Attempts) -> bool | None:
        if not attempts.unknown or not self.sent:
            return None
        current = table.metadata.properties
        return True if all(current.get(k) == v for k, v in self.sent.items()) else None

    def decide(self, table: Table) -> dict[str, str] | Unchanged[bool]:
        current = table.metadata.properties
        changed = {k: v for k, v in self.updates(current).items() if current.get(k) != v}
        return changed or Unchanged(False)

    def stage(self, table: Table, decision: dict[str, str]) -> Staged:
        current = table.metadata.properties
        self.sent = decision
        transaction = Staging(table)
        transaction.set_properties(decision)
        guards = [AssertProperty(key=key, value=current.get(key)) for key in self.guard]
        return Staged(transaction, [*guards, *self.requirements])

    def committed(self, table: Table, staged: Staged, attempts: Attempts) -> bool:
        refresh_table(table)
        return True


def commit_properties(
    table: Table,
    updates: Callable[[Mapping[str, str]], Mapping[str, str]],
    *,
    retry: Backoff = CONFLICTS,
    guard: Collection[str] = (),
    requirements: Sequence[ValidatableTableRequirement] = (),
) -> bool:
    """Set the properties ``updates(current properties)`` returns, in one metadata commit.

    Each attempt refreshes the table first and asks ``updates`` again, so a
    concurrent change is decided on what the other writer committed. Returns
    whether anything changed (``updates`` returned nothing new: no commit). After
    ``retry.attempts`` conflicts the last CommitFailedException is raised.

    ``guard``: properties whose values this attempt read must still hold when the
    catalog swaps (compare-and-swap, `AssertProperty`: a maintenance lease);
    ``requirements``: more such conditions.
    """
    return run(table, _Properties(updates, guard, requirements), retry)


@dataclass(frozen=True)
class ExpiredSnapshots:
    """What ``commit_expiry`` removed: the snapshots as they were (their manifest
    lists name the files only they may have reached)."""

    snapshots: tuple[Snapshot, ...]


def _unreferenced(
    table: Table, metadata: TableMetadata, ids: Collection[int]
) -> list[ValidatableTableRequirement]:
    if validates_locally(table.catalog):
        return [AssertUnreferenced(snapshot_ids=sorted(ids))]
    # Iceberg's own requirement, checked by any catalog: every ref is where it was
    # (stricter: a commit moving main conflicts, and the expiry is planned again).
    return [
        AssertRefSnapshotId(ref=name, snapshot_id=ref.snapshot_id)
        for name, ref in metadata.refs.items()
    ]


@dataclass
class _Expiry(CommitKind[ExpiredSnapshots, ExpiredSnapshots | None]):
    """The snapshots ``choose`` names removed from the metadata; the decision is those
    snapshots. Recognised by their absence, when an attempt's outcome was unknown."""

    choose: Callable[[TableMetadata], Collection[int]]
    requirements: Sequence[ValidatableTableRequirement]
    sent: ExpiredSnapshots = ExpiredSnapshots(())
    noun = "snapshot expiry"
    retries_outages = False

    def landed(self, table: Table, attempts: Attempts) -> ExpiredSnapshots | None:
        expired = self.sent.snapshots
        if not attempts.unknown or not expired:
            return None
        if any(table.metadata.snapshot_by_id(s.snapshot_id) is not None for s in expired):
            return None
        _log.info("table %s: expiry outcome was unknown; it landed", table_name(table))
        return self.sent

    def decide(self, table: Table) -> ExpiredSnapshots | Unchanged[None]:
        before = table.metadata
        ids = set(self.choose(before))
        if not ids:
            return Unchanged(None)
        heads = {ref.snapshot_id for ref in before.refs.values()}
        if ids & heads:
            raise ValueError(f"snapshots {sorted(ids & heads)} are branch or tag heads")
        return ExpiredSnapshots(tuple(s for s in before.snapshots if s.snapshot_id in ids))

    def stage(self, table: Table, decision: ExpiredSnapshots) -> Staged:
        self.sent = decision
        ids = sorted(s.snapshot_id for s in decision.snapshots)
        transaction = Staging(table)
        # The update ExpireSnapshots builds, without its per-id checks: each of those
        # deep-copies the whole metadata (minutes for thousands of snapshots).
        stage(transaction, (RemoveSnapshotsUpdate(snapshot_ids=ids),))
        unreferenced = _unreferenced(table, table.metadata, ids)
        return Staged(transaction, [*self.requirements, *unreferenced])

    def committed(self, table: Table, staged: Staged, attempts: Attempts) -> ExpiredSnapshots:
        return self.sent


def commit_expiry(
    table: Table,
    choose: Callable[[TableMetadata], Collection[int]],
    *,
    requirements: Sequence[ValidatableTableRequirement] = (),
    retry: Backoff = CONFLICTS,
) -> ExpiredSnapshots | None:
    """Remove the snapshots ``choose(refreshed metadata)`` names from the table's
    metadata in one commit (no file is deleted here). None: nothing to expire.

    Each attempt refreshes and chooses again. Branch and tag heads are never removed
    (``choose`` must not name them, and the commit requires that no ref points at a
    chosen snapshot when it lands, so a ref created meanwhile is not dropped). Table
    properties are untouched, so exactly-once (``icespool.spool.*``, Kafka offsets)
    never depends on what expiry keeps. An unknown outcome is resolved by looking:
    the snapshots are gone (it landed) or the error is raised (nothing changed).
    """
    return run(table, _Expiry(choose, requirements), retry)


@dataclass(frozen=True)
class _RowDelete(CommitKind[Transaction, bool]):
    """The rows matching ``row_filter`` removed (copy-on-write); the decision is the
    transaction rewriting the files that hold them. Recognised by its snapshot."""

    row_filter: BooleanExpression
    summary: Mapping[str, str]
    noun = "row delete"
    retries_outages = False

    def landed(self, table: Table, attempts: Attempts) -> bool | None:
        return None if attempts.landed_snapshot(table) is None else True

    def decide(self, table: Table) -> Transaction | Unchanged[bool]:
        transaction = Staging(table)
        transaction.delete(self.row_filter, snapshot_properties=dict(self.summary))
        return transaction if staged_updates(transaction) else Unchanged(False)

    def stage(self, table: Table, decision: Transaction) -> Staged:
        return Staged(decision)

    def committed(self, table: Table, staged: Staged, attempts: Attempts) -> bool:
        refresh_table(table)
        return True


def delete_rows(
    table: Table,
    row_filter: BooleanExpression,
    *,
    summary: Mapping[str, str],
    retry: Backoff = CONFLICTS,
) -> bool:
    """Remove the rows matching ``row_filter`` in one snapshot (copy-on-write: data
    files holding matches are rewritten without them). Returns whether anything was
    removed.

    Each attempt refreshes the table and decides again what to rewrite, so a writer
    that appended meanwhile is never overwritten; a conflict is retried like
    `commit_properties`. Deleting rows that are already gone commits nothing, so a
    repeated call is harmless.
    """
    return run(table, _RowDelete(row_filter, summary), retry)
