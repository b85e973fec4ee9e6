"""What runs over the spool's leftovers: at start, once a degraded table loads, and
for a quarantined segment an operator restores.

Start-up recovery commits every segment left by an earlier process (and those acked
while the start waited for the catalog) before new traffic is accepted, so it never
overtakes records acked before a crash. A table that cannot commit its leftovers is
left degraded (its writer keeps retrying, its segments stay spooled); it never stops
the others.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TextIO

from icespool.errors import CommitError
from icespool.lifecycle.progress import Progress
from icespool.lifecycle.registry import TableRegistry
from icespool.runtime.fanout import fan_out
from icespool.spool import SegmentInfo, Spool
from icespool.write.flush import SEGMENT_ATTEMPTS, UncommittableSegmentError
from icespool.write.result import FlushResult
from icespool.write.writer import TableWriter

__all__ = ["commit_leftovers", "commit_reloaded", "recover", "replay_quarantined"]

_log = logging.getLogger("icespool.service")


async def recover(
    tables: TableRegistry,
    spool: Spool,
    acked_early: list[SegmentInfo],
    *,
    line: TextIO | None,
    limit: int,
    started: Callable[[Progress], None],
) -> None:
    """Commit leftover segments, and those acked while the catalog was awaited
    (``acked_early``), before any new record is accepted.

    ``started`` receives the recovery's progress before the first commit (nothing is
    reported when the spool held nothing); ``line``: a terminal on which it redraws
    one progress line; ``limit``: how many tables recover at once.
    """
    recovered = [*spool.recovered.segments, *acked_early]
    leftovers = {s.table for s in recovered}
    if not leftovers:
        return
    progress = Progress.of_segments("recovery", recovered, line=line)
    started(progress)
    _log.info(
        "replaying %d spooled segments of %d tables: %d records, %d bytes",
        progress.total_segments,
        len(leftovers),
        progress.total_records,
        progress.total_bytes,
        extra={
            "segments": progress.total_segments,
            "tables": len(leftovers),
            "records": progress.total_records,
            "bytes": progress.total_bytes,
        },
    )
    progress.draw()

    async def recover_one(name: str) -> None:
        if name not in tables.writers:
            if name in tables.unloaded:
                return
            try:
                await tables.add_writer(name, None)
            except Exception as exc:
                tables.mark_unloaded(name, None, exc)
                return
        writer = tables.writers[name]
        writer.adopt(spool.segments(name))
        writer.on_settled = progress.segment_done
        try:
            await commit_leftovers(writer, spool)
        finally:
            writer.on_settled = None

    # Tables recover side by side (their commits queue in their lanes), each
    # failure alone; `progress` counts segments across all of them.
    await fan_out("recovering tables", sorted(leftovers), recover_one, limit=limit)
    # Short of 100% when a table is degraded: its segments stay for the next try.
    progress.finish()


async def commit_reloaded(writer: TableWriter, spool: Spool) -> None:
    """Start a table that loaded after start-up, and commit what it had spooled."""
    writer.adopt(spool.segments(writer.name))
    writer.start()
    await commit_leftovers(writer, spool)


async def commit_leftovers(writer: TableWriter, spool: Spool) -> None:
    # Each flush that fails by a segment's fault is one of that segment's
    # bounded attempts; retry until the bad ones are quarantined.
    attempts = SEGMENT_ATTEMPTS * max(1, len(spool.segments(writer.name)))
    for _ in range(attempts):
        try:
            result = await writer.flush("recovery")
        except UncommittableSegmentError:
            continue
        except Exception as exc:
            _log.error(
                "%s: spooled segments cannot be committed now, the table is degraded "
                "and retries in the background (the other tables serve): %s",
                writer.name,
                exc,
                extra={"table": writer.name, "error": str(exc)},
            )
            return
        _log.info(
            "replayed %s: %d records committed",
            writer.name,
            result.records,
            extra={"table": writer.name, "records": result.records},
        )
        return


async def replay_quarantined(tables: TableRegistry, spool: Spool, segment_id: str) -> FlushResult:
    """Restore one quarantined segment and commit it (exactly once).

    Raises `UnknownSegmentError` / `SegmentCorruptError` (spool) when it cannot
    be restored, `CommitError` naming the reason when it still cannot be
    committed (it is back in quarantine, or still spooled for the next start).
    """
    info = await spool.restore(segment_id)
    writer = tables.writers.get(info.table)
    if writer is None:
        try:
            writer = await tables.add_writer(info.table, None)
        except Exception:
            await spool.quarantine(info.id, "restored, but its table cannot be loaded")
            raise
    result = await writer.replay(info)
    if info.id in result.quarantined:
        reason = next((q.reason for q in spool.quarantined() if q.id == info.id), "unknown")
        raise CommitError(f"segment {info.id} still cannot be committed: {reason}")
    return result
