"""Overrides ``Transaction.table_metadata`` and ``Transaction._stage``, and reaches into a
transaction's staged state: building and sending one commit attempt.

- ``Staging``: pyiceberg's ``Transaction.table_metadata`` applies the staged updates and
  deep-copies the result on every read (a dozen per append); this one derives it once
  per staged change, without the copy (``_metadata.apply_updates``), and stamps a new
  snapshot no earlier than the table's last change (``clock_floor``).
- ``send``: one attempt through ``Table._do_commit``, a conflict back to the caller
  (``commit_transaction`` would retry it blindly).
- ``abandon`` / ``tidy``: the manifests a producer wrote (``_SnapshotProducer``'s
  ``_clean_all_uncommitted`` and ``_written_manifests``), deleted when an attempt did not
  land, or when a merge left the first one unlisted.
- ``staged_snapshot_ids``: the snapshots a transaction's producers add (how a later look
  recognises an attempt that landed); ``staged_row_ids``: the row ids their data files
  were given (v3 tables: ``_row_lineage``).

Relies on (checked by ``_contract``): ``Transaction`` keeping ``_table``, ``_updates``
(replaced, never mutated, by ``_stage``), ``_requirements`` and ``_snapshot_producers``;
``Transaction._stage`` / ``_apply(updates, requirements)``; ``Table._do_commit(updates,
requirements)``; ``_SnapshotProducer._clean_all_uncommitted`` and ``_written_manifests``.
"""

from __future__ import annotations

from pyiceberg.table import Table, Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    TableRequirement,
    TableUpdate,
)

from icespool.iceberg._upstream._metadata import apply_updates, clock_floor

__all__ = [
    "Staging",
    "abandon",
    "send",
    "stage",
    "staged_row_ids",
    "staged_snapshot_ids",
    "staged_table",
    "staged_updates",
    "tidy",
]


class Staging(Transaction):
    """A transaction that derives its pending metadata once per staged change,
    without copying every retained snapshot (``_metadata.py`` here).

    pyiceberg's ``Transaction.table_metadata`` applies the staged updates to the
    table's metadata and deep-copies the result on every access, and building one
    append reads it a dozen times: a dozen copies of every retained snapshot per
    commit. ``_updates`` is replaced, never mutated, on each stage, so identity says
    when to derive again.
    """

    def __init__(self, table: Table) -> None:
        super().__init__(table)
        self._derived_from: tuple[TableMetadata, tuple[TableUpdate, ...]] | None = None
        self._derived: TableMetadata | None = None

    def _stage(
        self, updates: tuple[TableUpdate, ...], requirements: tuple[TableRequirement, ...] = ()
    ) -> Transaction:
        # A snapshot is stamped with this process's clock when it is built; one
        # behind the table's last change is stamped just after it instead
        # (`clock_floor`), or other engines could no longer read the table.
        floor = clock_floor(self.table_metadata)
        updates = tuple(
            AddSnapshotUpdate(snapshot=update.snapshot.model_copy(update={"timestamp_ms": floor}))
            if isinstance(update, AddSnapshotUpdate) and update.snapshot.timestamp_ms < floor
            else update
            for update in updates
        )
        return super()._stage(updates, requirements)

    @property
    def table_metadata(self) -> TableMetadata:
        base, updates = self._table.metadata, self._updates
        memo = self._derived_from
        if self._derived is None or memo is None or memo[0] is not base or memo[1] is not updates:
            self._derived = apply_updates(base, updates)
            self._derived_from = (base, updates)
        return self._derived


def abandon(transaction: Transaction) -> None:
    """Delete the manifests and manifest lists staged for a commit that did not land
    (merged manifests included: pyiceberg tracks every manifest an append writes)."""
    for producer in transaction._snapshot_producers:
        producer._clean_all_uncommitted()


def tidy(table: Table, transaction: Transaction) -> None:
    """After ``transaction`` landed: delete the manifests it wrote that its snapshot
    does not list. A merge writes the commit's new manifest, then merges it into
    another; pyiceberg leaves the first one behind (one orphan per merge)."""
    for producer in transaction._snapshot_producers:
        if len(producer._written_manifests) < 2:
            continue  # no merge: the one manifest written is listed
        snapshot = table.metadata.snapshot_by_id(producer.snapshot_id)
        if snapshot is None:  # pragma: no cover - called for landed commits only
            continue
        listed = {manifest.manifest_path for manifest in snapshot.manifests(table.io)}
        for path in producer._written_manifests:
            if path not in listed:
                table.io.delete(path)


def staged_table(transaction: Transaction) -> Table:
    """The table ``transaction`` was opened on (the object it refreshes and commits)."""
    table: Table = transaction._table
    return table


def staged_updates(transaction: Transaction) -> tuple[TableUpdate, ...]:
    """The updates staged so far (empty: the transaction would change nothing)."""
    updates: tuple[TableUpdate, ...] = transaction._updates
    return updates


def staged_snapshot_ids(transaction: Transaction) -> tuple[int, ...]:
    """The ids of the snapshots ``transaction`` adds, in order (none: it changes only
    metadata, as a property or schema update)."""
    return tuple(producer.snapshot_id for producer in transaction._snapshot_producers)


def staged_row_ids(transaction: Transaction) -> dict[str, int]:
    """The ``first_row_id`` each data file ``transaction``'s snapshots add was given, by
    path (empty for a table without row lineage)."""
    found: dict[str, int] = {}
    for producer in transaction._snapshot_producers:
        found.update(getattr(producer, "first_row_ids", {}))
    return found


def stage(transaction: Transaction, updates: tuple[TableUpdate, ...]) -> None:
    """Stage ``updates`` as pyiceberg's update builders do, without their checks."""
    transaction._apply(updates)


def send(transaction: Transaction, requirements: tuple[TableRequirement, ...]) -> None:
    """Send the staged updates to the catalog once, with the transaction's own
    requirements followed by ``requirements``; CommitFailedException on a conflict.

    ``Transaction.commit_transaction`` would do the same through ``Table._do_commit`` but
    retries a conflict by re-applying the updates to the refreshed table, skipping the
    caller's own checks against what the other writer committed.
    """
    table = staged_table(transaction)
    table._do_commit(
        updates=transaction._updates, requirements=(*transaction._requirements, *requirements)
    )
