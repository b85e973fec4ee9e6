"""Commits that add no spooled rows: table properties, snapshot expiry, row deletes.

Each attempt refreshes the table and decides again on what it finds, and a conflict is
retried on the refreshed table (``retry_conflicts``). Everything here blocks; the daemon
calls it through ``asyncio.to_thread``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from pyiceberg.exceptions import (
    CommitFailedException,
)
from pyiceberg.expressions import BooleanExpression
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import (
    Snapshot,
)
from pyiceberg.table.update import (
    AssertRefSnapshotId,
    RemoveSnapshotsUpdate,
    ValidatableTableRequirement,
)

from icespool.errors import CommitError
from icespool.iceberg._commit_common import (
    PERMANENT_ERRORS,
    AssertProperty,
    AssertUnreferenced,
    commit_once,
    table_name,
    try_refresh,
    validates_locally,
)
from icespool.iceberg._upstream._refresh import refresh_table
from icespool.iceberg._upstream._transaction import Staging, stage, staged_updates
from icespool.runtime.retry import CONFLICTS, Backoff, retry_conflicts

__all__ = ["ExpiredSnapshots", "commit_expiry", "commit_properties", "delete_rows"]

_log = logging.getLogger("icespool.commit")


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

    def attempt() -> bool:
        refresh_table(table)
        current = table.metadata.properties
        changed = {k: v for k, v in updates(current).items() if current.get(k) != v}
        if not changed:
            return False
        transaction = Staging(table)
        transaction.set_properties(changed)
        guards = [AssertProperty(key=key, value=current.get(key)) for key in guard]
        commit_once(transaction, [*guards, *requirements])
        refresh_table(table)
        return True

    return retry_conflicts(
        attempt, what=f"table {table_name(table)}: property commit", backoff=retry
    )


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

    def attempt() -> ExpiredSnapshots | None:
        refresh_table(table)
        before = table.metadata
        ids = set(choose(before))
        if not ids:
            return None
        heads = {ref.snapshot_id for ref in before.refs.values()}
        if ids & heads:
            raise ValueError(f"snapshots {sorted(ids & heads)} are branch or tag heads")
        expired = tuple(s for s in before.snapshots if s.snapshot_id in ids)
        transaction = Staging(table)
        # The update ExpireSnapshots builds, without its per-id checks: each of those
        # deep-copies the whole metadata (minutes for thousands of snapshots).
        stage(transaction, (RemoveSnapshotsUpdate(snapshot_ids=sorted(ids)),))
        try:
            commit_once(transaction, [*requirements, *_unreferenced(table, before, ids)])
        except (CommitFailedException, CommitError, *PERMANENT_ERRORS):
            raise
        except Exception:
            if try_refresh(table) is not None or any(
                table.metadata.snapshot_by_id(i) is not None for i in ids
            ):
                raise
            _log.info("table %s: expiry outcome was unknown; it landed", table_name(table))
        return ExpiredSnapshots(expired)

    return retry_conflicts(
        attempt, what=f"table {table_name(table)}: snapshot expiry", backoff=retry
    )


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

    def attempt() -> bool:
        refresh_table(table)
        transaction = Staging(table)
        transaction.delete(row_filter, snapshot_properties=dict(summary))
        if not staged_updates(transaction):
            return False
        commit_once(transaction)
        refresh_table(table)
        return True

    return retry_conflicts(attempt, what=f"table {table_name(table)}: row delete", backoff=retry)
