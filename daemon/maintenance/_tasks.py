"""The maintenance tasks a run does, in order, and the daemon's table defaults.

``DEFAULT_TASKS`` is the list the daemon runs. Each task is a `Task`: a name (the
``task`` label of the metrics) and an async ``run(ctx)`` that puts its commit steps
in the table's lane (``ctx.in_lane``, with ``ctx.requirements`` on every commit) and
its reading, writing and deleting in maintenance threads (``ctx.off_lane``).

``COMPACT`` and ``ORPHANS`` adapt ``_compact`` / ``_orphans`` to that shape.
"""

from __future__ import annotations

import asyncio
import functools
import sys
import threading
import time
from typing import Final

from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile
from pyiceberg.table.metadata import TableMetadata

from icespool.iceberg import (
    CommitOutcomeUnknownError,
    ReplaceConflictError,
    apply_defaults,
    commit_expiry,
)
from icespool.iceberg._parquet import _remove_quietly
from icespool.maintenance import _compact, _convert, _orphans
from icespool.maintenance._expire import (
    ExpiryConflictError,
    ExpiryDeadlineError,
    choose_expired,
    delete_files,
    find_garbage,
)
from icespool.maintenance._lineage import Rewritten
from icespool.maintenance._scheduler import _PENDING_MAX, RunContext, Task, TaskResult
from icespool.maintenance._settings import created_table_properties
from icespool.spool import new_uuid7

__all__ = ["COMPACT", "CONVERT", "DEFAULTS", "DEFAULT_TASKS", "EXPIRE", "ORPHANS"]

# Expired snapshots whose garbage one search looks for (it reads their manifest lists,
# and the retained ones until every candidate is decided).
_SWEEP_CHUNK: Final = 256


async def _expire(ctx: RunContext) -> TaskResult:
    """Expire snapshots by the table's retention, then delete the files only they
    reached (and the deletions an earlier run left to retry)."""
    settings = ctx.settings
    table = ctx.table

    def choose(metadata: TableMetadata) -> set[int]:
        return choose_expired(
            metadata,
            max_age_ms=int(settings.max_snapshot_age * 1000),
            min_snapshots=settings.min_snapshots,
            max_snapshots=settings.max_snapshots,
            now_ms=int(time.time() * 1000),
        )

    expired = await ctx.in_lane(lambda: commit_expiry(table, choose, requirements=ctx.requirements))
    state = ctx.state
    if expired is not None:
        state.unswept.extend(expired.snapshots)
        del state.unswept[:-_PENDING_MAX]
    detail = f"expired {len(expired.snapshots) if expired else 0} snapshots"
    lists = manifests = 0
    conflict = None
    # Oldest expired snapshots first, a chunk at a time: what a chunk finds is garbage
    # whatever the other expired snapshots hold (only retained ones matter), so a run
    # cut short by its deadline keeps its progress and the next run goes on.
    while state.unswept and ctx.clock() < ctx.deadline:
        chunk = state.unswept[:_SWEEP_CHUNK]
        try:
            # Against the metadata after the commit (the table was updated in place).
            garbage = await ctx.off_lane(
                find_garbage,
                table.io,
                chunk,
                table.metadata,
                deadline=ctx.deadline,
                clock=ctx.clock,
            )
        except ExpiryDeadlineError:
            break
        except ExpiryConflictError as exc:
            conflict = f"garbage search repeated next run: {exc}"
            break
        del state.unswept[: len(chunk)]
        state.pending_files.extend(garbage.files)
        lists += garbage.lists_read
        manifests += garbage.manifests_read
    del state.pending_files[:-_PENDING_MAX]
    detail += f", read {lists} manifest lists and {manifests} manifests"
    if conflict is not None:
        detail += f"; conflict: {conflict}"
    if not state.pending_files:
        return TaskResult(detail=detail, conflict=conflict is not None)
    outcome = await ctx.off_lane(
        delete_files,
        table.io,
        list(state.pending_files),
        limit=settings.max_deletes_per_run,
        deadline=ctx.deadline,
        clock=ctx.clock,
    )
    state.pending_files = [*((k, p) for k, p, _ in outcome.failed), *outcome.left]
    error = None
    if outcome.failed:
        kind, path, why = outcome.failed[0]
        error = (
            f"{len(outcome.failed)} files not deleted (retried next run), e.g. {kind} {path}: {why}"
        )
    return TaskResult(
        removed=outcome.removed,
        detail=detail,
        error=error,
        delete_errors=len(outcome.failed),
        conflict=conflict is not None,
    )


EXPIRE: Final = Task("expire", _expire)


# Share of a run's time left that its compaction may use (planning, rewrite, under the
# I/O budget), so the expiry and the orphan sweep after it always get their turn.
_TIME_SHARE: Final = 0.5


def _budgeted_bytes(ctx: RunContext, seconds: float) -> int:
    """Input bytes the I/O budget can read and write again (about twice the input) in
    ``seconds``, with this run's share of the budget: a plan bigger than this would
    hit the deadline every run and never commit anything."""
    rate = ctx.budget.bytes_per_second
    if rate is None:
        return sys.maxsize
    share = rate / ctx.config.maintenance.concurrency
    return int(share * seconds / 2)


class _Outputs:
    """A compaction's new files between its rewrite (a maintenance thread) and its
    commit (the table's lane): whichever way the run ends they are committed, deleted
    by the commit that failed, or deleted here, never left for the orphan sweep. The
    run can be cancelled or miss its deadline while the rewrite's thread goes on, or
    while the commit waits in the lane."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: list[DataFile] = []
        self._state = "writing"  # then "written", "committing" or "abandoned"

    def written(self, io: FileIO, files: Rewritten) -> Rewritten:
        """In the rewrite's thread, when it is done."""
        with self._lock:
            if self._state == "abandoned":
                _remove_quietly(io, [data_file.file_path for data_file in files])
                raise _compact.CompactionError("the run ended during the rewrite")
            self._files, self._state = list(files), "written"
        return files

    def committing(self) -> None:
        """In the lane, just before the commit: from now on the commit owns the files."""
        with self._lock:
            if self._state == "abandoned":
                raise _compact.CompactionError("the run ended before the commit")
            self._state = "committing"

    def abandon(self) -> list[str]:
        """The run ended: the paths to delete (none once the commit owns them)."""
        with self._lock:
            if self._state == "committing":
                return []
            self._state = "abandoned"
            return [data_file.file_path for data_file in self._files]


async def _compact_task(ctx: RunContext) -> TaskResult:
    """Bin-pack the daemon's small files and apply the delete files that apply to a
    table's files (dropping the ones nothing live needs then): plan and rewrite off the
    lane (under the shared I/O budget), commit the one ``replace`` snapshot in the lane."""
    settings, table, state = ctx.settings, ctx.table, ctx.state
    writer = ctx.config.table_settings(ctx.name)
    now = ctx.clock()
    left = ctx.deadline - now  # -inf once the scheduler stops
    if not left > 0:
        return TaskResult(detail="no time left in the run to compact")
    deadline = now + left * _TIME_SHARE
    max_bytes = min(settings.compaction_max_bytes_per_run, _budgeted_bytes(ctx, left * _TIME_SHARE))
    max_files = state.compact_max_files or _compact.DEFAULT_MAX_FILES
    plans = await ctx.off_lane(
        _compact.plan_compaction,
        table,
        target_file_size=settings.target_file_size,
        min_input_files=settings.compaction_min_files,
        max_bytes=max_bytes,
        max_files=max_files,
    )
    if not plans:
        return TaskResult(detail="nothing to compact")
    plan = plans[0]  # plan_compaction returns at most one (one snapshot per run)
    state.compacting = plan.file_ids
    outputs = _Outputs()

    def write() -> Rewritten:
        return outputs.written(
            table.io,
            _compact.rewrite(
                table,
                plan,
                budget=ctx.budget,
                row_group_records=writer.row_group_records,
                compression=writer.compression,
                deadline=deadline,
                incarnation=ctx.files.current,
            ),
        )

    def commit(new_files: Rewritten) -> _compact.CompactionResult:
        outputs.committing()
        return _compact.commit_rewrite(
            table, plan, new_files, requirements=ctx.requirements, compression=writer.compression
        )

    try:
        new_files = await ctx.off_lane(write)
        result = await ctx.in_lane(functools.partial(commit, new_files))
    except _compact.CompactionConflictError as exc:
        # Another writer rewrote or deleted inputs first: nothing committed, retried next run.
        return TaskResult(detail=f"conflict: {exc}", conflict=True)
    except BaseException as exc:
        # Cancelled (shutdown, the run's timeout) or past the deadline before the commit
        # started: nothing will ever reference what the rewrite wrote. (A commit that
        # started deletes the files itself if it fails; a rewrite still running in its
        # thread deletes them when it ends.) Not awaited: the run may be cancelled.
        if paths := outputs.abandon():
            asyncio.get_running_loop().run_in_executor(None, _remove_quietly, table.io, paths)
        if isinstance(exc, TimeoutError) or ctx.clock() > deadline:
            # Out of time (many small files slow to read take time, not budget): the
            # next run plans half as many files, or it would fail on the same ones.
            state.compact_max_files = max(2, len(plan.files) // 2)
        raise
    finally:
        state.compacting = frozenset()
    if state.compact_max_files is not None:  # it fit: let the next plan grow again
        doubled = 2 * state.compact_max_files
        state.compact_max_files = None if doubled >= _compact.DEFAULT_MAX_FILES else doubled
    if result.outcome == "conflict":
        return TaskResult(detail=f"conflict: {result.detail}", conflict=True)
    detail = (
        f"replaced {result.files_replaced} files ({result.bytes_replaced} B) by "
        f"{result.files_added} ({result.bytes_added} B), {result.records} rows"
    )
    if result.rows_removed or result.delete_files_removed:
        detail += (
            f"; deletes applied to {result.rows_removed} rows, "
            f"{result.delete_files_removed} delete files removed"
        )
    return TaskResult(detail=detail)


async def _convert_task(ctx: RunContext) -> TaskResult:
    """Turn the table's equality deletes into position deletes (no data rewritten):
    find the rows they delete off the lane (budgeted), commit in the lane."""
    table = ctx.table
    conversion = await ctx.off_lane(
        _convert.plan_conversion, table, budget=ctx.budget, deadline=ctx.deadline
    )
    if conversion is None:
        return TaskResult(detail="no equality deletes")
    writer = ctx.config.table_settings(ctx.name)
    prefix = f"{_orphans.COMPACTION_PREFIX}{new_uuid7()}-{ctx.files.current}-pos"
    files = await ctx.off_lane(
        _convert.write_conversion,
        table,
        conversion,
        file_prefix=prefix,
        compression=writer.compression,
    )
    try:
        await ctx.in_lane(
            lambda: _convert.commit_conversion(
                table, conversion, files, requirements=ctx.requirements
            )
        )
    except ReplaceConflictError as exc:
        await ctx.off_lane(_remove_quietly, table.io, [f.file_path for f in files])
        return TaskResult(detail=f"conflict: {exc}", conflict=True)
    except CommitOutcomeUnknownError:
        raise  # it may have landed: its files stay (the orphan sweep knows them)
    except BaseException:
        await asyncio.shield(ctx.off_lane(_remove_quietly, table.io, [f.file_path for f in files]))
        raise
    return TaskResult(
        detail=(
            f"{len(conversion.equality)} equality delete files turned into "
            f"{len(files)} position delete files ({conversion.located.rows} rows)"
        )
    )


async def _orphans_task(ctx: RunContext) -> TaskResult:
    """Remove this spool's never-committed data files; at most once per
    ``orphan_older_than`` (the sweep lists the whole data location)."""
    state = ctx.state
    now = ctx.clock()
    recent = ctx.settings.orphan_older_than
    if state.orphans_swept is not None and now - state.orphans_swept < recent:
        return TaskResult(detail="swept recently")
    result = await ctx.off_lane(
        _orphans.remove_orphans,
        ctx.table,
        owner=ctx.files,
        is_spooled=lambda file_id: file_id in state.compacting or ctx.is_spooled(file_id),
        was_committed=ctx.was_committed,
    )
    state.orphans_swept = now
    if result.skipped:
        return TaskResult(detail=f"not swept: {result.skipped}")
    detail = f"listed {result.listed}, removed {result.removed}"
    if result.kept:
        detail += f", kept {result.kept} this process committed (in no snapshot any more)"
    error = f"{result.failed} orphans not deleted (next sweep retries)" if result.failed else None
    return TaskResult(
        removed={"orphan_data_file": result.removed},
        detail=detail,
        error=error,
        delete_errors=result.failed,
        kept_files=result.kept,
    )


async def _defaults(ctx: RunContext) -> TaskResult:
    """``apply_to_existing``: the daemon's table defaults, once per table and process."""
    if ctx.state.defaults_applied:
        return TaskResult()
    defaults = created_table_properties(ctx.config, ctx.declared)
    table = ctx.table
    added = await ctx.in_lane(lambda: apply_defaults(table, defaults, ctx.requirements))
    ctx.state.defaults_applied = True
    return TaskResult(detail=f"set {sorted(added)}" if added else "defaults already set")


DEFAULTS: Final = Task("defaults", _defaults, wanted=lambda s: s.apply_to_existing)
CONVERT: Final = Task("convert", _convert_task)
COMPACT: Final = Task("compact", _compact_task, wanted=lambda s: s.compaction)
ORPHANS: Final = Task("orphans", _orphans_task)

#: What every run does, in order: compaction first, so the expiry of the same run can
#: already count the replaced files' snapshots; the orphan sweep last.
DEFAULT_TASKS: Final = (DEFAULTS, CONVERT, COMPACT, EXPIRE, ORPHANS)
