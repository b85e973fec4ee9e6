"""Replaces ``pyiceberg.table.update.update_table_metadata`` (and its
``RemoveSnapshotsUpdate`` handler): table metadata with updates applied, without
copying the table's whole history.

pyiceberg's ``update_table_metadata`` ends with ``model_copy(deep=True)`` of the
result: a deep copy of every retained snapshot (and its summary, and the snapshot
log), each time it is called. A transaction calls it on every read of its pending
metadata and a SQL commit once more; at 2,000 snapshots one copy costs 40-140 ms,
far more than the rest of a commit. The copy protects nothing: the metadata models
are frozen and every update builds new models from its input instead of changing
it, so the result without the copy is equal and safe to share.

Relies on (checked by ``_contract``): ``_apply_table_update`` (a singledispatch of
``(update, base_metadata, context)`` whose handlers are the update types pinned
there: a new one upstream means a step this copy may lack), ``_TableMetadataUpdateContext``
(``add_update``, ``has_changes``) and ``_update_table_metadata_log``.
"""

from __future__ import annotations

from datetime import datetime

from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import (
    RemoveSnapshotRefUpdate,
    RemoveSnapshotsUpdate,
    RemoveStatisticsUpdate,
    TableUpdate,
    _apply_table_update,
    _TableMetadataUpdateContext,
    _update_table_metadata_log,
)
from pyiceberg.utils.datetime import datetime_to_millis

__all__ = ["apply_updates", "clock_floor"]


def clock_floor(metadata: TableMetadata) -> int:
    """The earliest time (epoch ms) the next change of ``metadata`` may carry.

    Iceberg's Java, Go and Rust readers refuse metadata whose snapshot log or metadata
    log runs backwards by more than a minute, or whose ``last-updated-ms`` precedes
    them: a writer whose clock is behind the table's (this process's own clock stepped
    back since its last commit, another replica's running ahead) would make the table
    unreadable to them. A change stamped no earlier than this keeps every log in order;
    the stamp then says "after the table's last change" rather than this clock's time.
    """
    floor = metadata.last_updated_ms
    if metadata.snapshot_log:
        floor = max(floor, metadata.snapshot_log[-1].timestamp_ms)
    if metadata.metadata_log:
        floor = max(floor, metadata.metadata_log[-1].timestamp_ms)
    return floor


def apply_updates(
    base: TableMetadata, updates: tuple[TableUpdate, ...], metadata_location: str | None = None
) -> TableMetadata:
    """``update_table_metadata(base, updates, metadata_location=...)`` without the deep
    copy (pyiceberg pinned <0.13: the same steps in the same order). Returns ``base``
    itself when the updates change nothing.

    ``metadata_location`` (the location ``base`` was read from) is recorded in the
    metadata log, as a catalog commit does.
    """
    context = _TableMetadataUpdateContext()
    metadata = base
    for update in updates:
        if isinstance(update, RemoveSnapshotsUpdate):
            metadata = _remove_snapshots(update, metadata, context)
        else:
            metadata = _apply_table_update(update, metadata, context)
    if not context.has_changes():
        return base
    if metadata_location:
        metadata = _update_table_metadata_log(metadata, metadata_location, base.last_updated_ms)
    if base.last_updated_ms == metadata.last_updated_ms:
        now = max(datetime_to_millis(datetime.now().astimezone()), clock_floor(base))
        metadata = metadata.model_copy(update={"last_updated_ms": now})
    metadata.spec().check_compatible(metadata.schema())
    metadata.sort_order().check_compatible(metadata.schema())
    return metadata


def _remove_snapshots(
    update: RemoveSnapshotsUpdate, base: TableMetadata, context: _TableMetadataUpdateContext
) -> TableMetadata:
    """pyiceberg's ``RemoveSnapshotsUpdate`` (pinned <0.13: the same checks and result)
    with sets. pyiceberg's looks each id up in the snapshots and each snapshot up in the
    id list: quadratic, 3 s for an expiry of 10,000 snapshots, minutes for 100,000 (the
    first expiry of a table that went unmaintained), run twice per commit in the
    table's lane."""
    removed = set(update.snapshot_ids)
    present = {snapshot.snapshot_id for snapshot in base.snapshots}
    for snapshot_id in update.snapshot_ids:
        if snapshot_id not in present:
            raise ValueError(f"Snapshot with snapshot id {snapshot_id} does not exist")
    snapshots = [
        snapshot.model_copy(update={"parent_snapshot_id": None})
        if snapshot.parent_snapshot_id in removed
        else snapshot
        for snapshot in base.snapshots
        if snapshot.snapshot_id not in removed
    ]
    snapshot_log = [entry for entry in base.snapshot_log if entry.snapshot_id not in removed]
    metadata = base
    for name, ref in base.refs.items():
        if ref.snapshot_id in removed:
            metadata = _apply_table_update(
                RemoveSnapshotRefUpdate(ref_name=name), metadata, context
            )
    for statistics in base.statistics:
        if statistics.snapshot_id in removed:
            metadata = _apply_table_update(
                RemoveStatisticsUpdate(snapshot_id=statistics.snapshot_id), metadata, context
            )
    context.add_update(update)
    return metadata.model_copy(update={"snapshots": snapshots, "snapshot_log": snapshot_log})
