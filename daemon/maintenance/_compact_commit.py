"""Compaction's commit: the rewritten files in place of the plan's inputs, as one
``replace`` snapshot validated against the refreshed table (see ``_compact``)."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

import numpy as np
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.table.update import ValidatableTableRequirement

from icespool.cdc import (
    LiveData,
    LiveDelete,
    Located,
    applies,
    droppable,
    live_files,
    read_positions,
)
from icespool.errors import CommitError
from icespool.iceberg import (
    POSITION_DELETE_MARK,
    CommitOutcomeUnknownError,
    ReplaceConflictError,
    ReplaceExtra,
    commit_replace,
    encode_position_deletes,
)
from icespool.iceberg._parquet import _remove_quietly
from icespool.maintenance._compact_plan import CompactionError, CompactionPlan
from icespool.maintenance._lineage import Lineage, Rewritten
from icespool.runtime.retry import CONFLICTS, Backoff

__all__ = ["COMPACTION_SUMMARY_KEY", "CompactionResult", "commit_rewrite"]

_log = logging.getLogger("icespool.maintenance.compact")
_NONE: Final = np.zeros(0, dtype=np.int64)

#: Snapshot summary key of a compaction's replace snapshot: the plan's id.
COMPACTION_SUMMARY_KEY: Final = "icespool.compaction"


@dataclass(frozen=True)
class CompactionResult:
    """``committed``: ONE replace snapshot swapped ``files_replaced`` files for
    ``files_added``. ``conflict``: another writer changed the inputs; nothing was
    committed and the new files were deleted (``detail`` says what happened)."""

    outcome: Literal["committed", "conflict"]
    snapshot_id: int | None
    files_replaced: int
    files_added: int
    bytes_replaced: int
    bytes_added: int
    records: int
    attempts: int = 1
    detail: str = ""
    delete_files_removed: int = 0  # delete files nothing live needed any more
    rows_removed: int = 0  # rows the applied deletes removed


def _validator(
    plan: CompactionPlan, new_files: Sequence[DataFile], compression: str
) -> Callable[[Table], ReplaceExtra]:
    """The commit-time check of a plan against the refreshed table; returns the delete
    files the replace removes too (those nothing live needs once the inputs are gone),
    and the position deletes it carries to the new files (module doc of ``_lineage``)."""
    known = plan.known_deletes
    positions = {
        d.path: d.paths for b in plan.bins for d in (*b.deletes, *plan.drops) if not d.is_equality
    }
    inputs = {data_file.file_path for data_file in plan.files}
    lineage = new_files.lineage if isinstance(new_files, Rewritten) else None
    attempts = itertools.count()

    def check(table: Table) -> ReplaceExtra:
        name = ".".join(table.name())
        metadata = table.metadata
        if metadata.default_spec_id != plan.spec_id:
            raise ReplaceConflictError(f"table {name}: the partition spec changed since planning")
        snapshot = metadata.snapshot_by_name(MAIN_BRANCH)
        if snapshot is None:
            raise ReplaceConflictError(f"table {name}: main has no snapshot any more")
        live = live_files(table.io, metadata, snapshot, known_paths=positions)
        missing = sorted(inputs.difference(live.data))
        if missing:
            shown = ", ".join(missing[:3]) + (" ..." if len(missing) > 3 else "")
            raise ReplaceConflictError(
                f"table {name}: {len(missing)} file(s) to replace are no longer live in main "
                f"(removed by another writer's rewrite or delete): {shown}"
            )
        carried: list[LiveDelete] = []
        for delete in live.deletes:
            if delete.path in known:
                continue  # applied by the rewrite, or applying to nothing
            if delete.is_equality and delete.sequence_number > plan.sequence_number:
                continue  # applies to the new files (older data sequence number) as well
            if delete.is_equality:
                hit = any(
                    applies(delete, data.file, data.sequence_number, data.spec_id)
                    for data in (live.data[path] for path in inputs)
                )
            elif delete.paths.isdisjoint(inputs):
                continue
            elif lineage is not None and delete.paths <= inputs:
                carried.append(delete)  # naming only inputs: moved to the new files
                continue
            else:
                hit = True
            if hit:
                raise ReplaceConflictError(
                    f"table {name}: delete file {delete.path} (sequence number "
                    f"{delete.sequence_number}) was added since planning and applies to "
                    "files being replaced"
                )
        drops = {
            d.path: d.file
            for d in droppable(live, inputs)
            if d.sequence_number <= plan.sequence_number
        }
        drops.update((d.path, d.file) for d in carried)
        added = _carry(table, lineage, carried, new_files, plan, compression, next(attempts))
        return ReplaceExtra(list(drops.values()), added)

    return check


def _carry(
    table: Table,
    lineage: Lineage | None,
    carried: Sequence[LiveDelete],
    new_files: Sequence[DataFile],
    plan: CompactionPlan,
    compression: str,
    attempt: int,
) -> list[DataFile]:
    """Position deletes for the new files naming the rows ``carried`` deletes in the
    inputs (one file per new file, ``{output prefix}-pos{attempt}-...``)."""
    if lineage is None or not carried or not new_files:
        return []
    dead: dict[str, np.ndarray] = {}
    for delete in carried:
        for path, named in read_positions(table.io, delete.file, delete.paths).items():
            dead[path] = np.union1d(dead.get(path, _NONE), named)
    moved = lineage.remap(dead)
    if not moved:
        return []
    outputs = {f.file_path: LiveData(f, plan.sequence_number, plan.spec_id) for f in new_files}
    # The new files' names without their numbers: the orphan sweep knows the deletes too.
    prefix = new_files[0].file_path.rsplit("/", 1)[-1].rsplit("-", 2)[0]
    written = encode_position_deletes(
        table,
        Located(moved, {path: outputs[path] for path in moved}),
        file_prefix=f"{prefix}{POSITION_DELETE_MARK}{attempt}",
        compression=compression,
    )
    return list(written.values())


def commit_rewrite(
    table: Table,
    plan: CompactionPlan,
    new_files: Sequence[DataFile],
    *,
    retry: Backoff = CONFLICTS,
    requirements: Sequence[ValidatableTableRequirement] = (),
    compression: str = "zstd",
) -> CompactionResult:
    """Commit ``new_files`` in place of the plan's inputs as one ``replace`` snapshot.

    Run it in the table's lane, with the maintenance lease in ``requirements`` (a
    replica that lost the lease commits nothing: ``CommitError``, new files
    deleted). Every attempt refreshes the table and validates it (every input still
    live in main, no delete file applying to them, the same partition spec); a
    concurrent append is retried through, a rewrite or delete of the inputs by
    another writer gives up: ``conflict``, new files deleted. Other failures raise
    after deleting the new files, except an unknown outcome
    (``CommitOutcomeUnknownError``): the snapshot may reference them, so they stay
    for the orphan sweep, which removes them only if nothing references them.
    """
    name = ".".join(table.name())
    paths = [data_file.file_path for data_file in new_files]
    records = sum(data_file.record_count for data_file in new_files)
    # Deletes applied: fewer rows (the rewrite checked each bin's count against its
    # deletes); none applied: exactly the inputs' rows.
    if records > plan.records or (records != plan.records and not plan.applies_deletes):
        _remove_quietly(table.io, paths)
        raise CompactionError(
            f"table {name}: the new files hold {records} rows, the plan's inputs "
            f"{plan.records}; nothing committed"
        )
    try:
        result = commit_replace(
            table,
            deleted=plan.files,
            added=new_files,
            summary={COMPACTION_SUMMARY_KEY: plan.plan_id},
            retry=retry,
            requirements=requirements,
            data_sequence_number=plan.sequence_number,
            check=_validator(plan, new_files, compression),
        )
    except ReplaceConflictError as exc:
        _remove_quietly(table.io, paths)
        _log.info("table %s: compaction %s given up: %s", name, plan.plan_id, exc)
        return CompactionResult(
            outcome="conflict",
            snapshot_id=None,
            files_replaced=0,
            files_added=0,
            bytes_replaced=0,
            bytes_added=0,
            records=0,
            detail=str(exc),
        )
    except CommitOutcomeUnknownError:
        raise
    except CommitError:
        _remove_quietly(table.io, paths)
        raise
    added = sum(data_file.file_size_in_bytes for data_file in new_files)
    snapshot = table.metadata.snapshot_by_id(result.snapshot_id)
    summary = snapshot.summary if snapshot is not None else None
    dropped = int((summary.get("removed-delete-files") if summary is not None else None) or 0)
    _log.info(
        "table %s: compacted %d files (%d bytes) into %d (%d bytes) in %d partition(s), "
        "%d rows deleted, %d delete files removed, snapshot %d",
        name,
        len(plan.files),
        plan.bytes,
        len(new_files),
        added,
        plan.partitions,
        plan.records - records,
        dropped,
        result.snapshot_id,
    )
    return CompactionResult(
        outcome="committed",
        snapshot_id=result.snapshot_id,
        files_replaced=len(plan.files),
        files_added=len(new_files),
        bytes_replaced=plan.bytes,
        bytes_added=added,
        records=records,
        attempts=result.attempts,
        delete_files_removed=dropped,
        rows_removed=plan.records - records,
    )
