"""Spool-wide pressure relief: commit early the tables that hold the room that ran out.

The spool is one directory on one volume shared by every table. When an append is
refused for lack of room (the volume's bytes or inodes: ENOSPC, EDQUOT; or
``spool.max_bytes``), the refused table may hold nothing itself: a table's first
segment needs an inode that other tables' open segments hold, and those tables
commit only at their own triggers (``batch_timeout`` may be an hour). So any such
refusal starts a relief round here: up to ``per_round`` tables, ranked by what ran
out, are flushed (commit reason ``pressure``); their commits delete their segments
and the refused appends succeed when the client retries.

Rounds are coalesced: while one runs, further refusals are only counted (1,000
refused appends start one round, not 1,000 flushes). The next refusal after a round
ends starts the next one, so relief goes on exactly as long as appends are refused,
``per_round`` commits at a time.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from icespool.config import human_bytes, human_seconds
from icespool.metrics import Metrics
from icespool.spool import Spool, SpoolError, SpoolFullError, SpoolIOError, TableUsage
from icespool.write.result import FlushResult
from icespool.write.writer import TableWriter

__all__ = ["PressureRelief"]

_log = logging.getLogger("icespool.pressure")
# Errors of a volume without room; any other disk error (EIO) is not freed by commits.
_NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT})
# statvfs of the spool's volume: a hung network mount must not hold a round forever.
_STATVFS_TIMEOUT = 5.0
# A round waits this long for its flushes, then ends (they go on in their lanes): a
# slow catalog must not stop the next round from picking other tables.
_ROUND_WAIT = 30.0
# "Nothing to flush" repeats while refusals go on: said at most this often.
_IDLE_LOG_EVERY = 60.0


class PressureRelief:
    """Flushes the tables holding the spool's room early when an append is refused.

    ``writers`` lists the daemon's current table writers; ``per_round`` bounds the
    tables one round flushes (the encode workers: the commits that can run at once).
    """

    def __init__(
        self,
        spool: Spool,
        writers: Callable[[], Iterable[TableWriter]],
        metrics: Metrics,
        *,
        per_round: int,
    ) -> None:
        if per_round < 1:
            raise ValueError("per_round must be at least 1")
        self._spool = spool
        self._writers = writers
        self._metrics = metrics
        self._per_round = per_round
        self._round: asyncio.Task[None] | None = None
        self._coalesced = 0  # refusals that came while the running round ran
        self._idle_logged = -_IDLE_LOG_EVERY
        self._stopped = False

    def refused(self, table: str, error: SpoolError) -> None:
        """An append of ``table`` was refused with ``error``: start a round unless one
        runs (then the refusal only counts). Never blocks; other errors are ignored."""
        reason = _reason(error)
        if reason is None or self._stopped:
            return
        if self._round is not None:
            self._coalesced += 1
            return
        self._coalesced = 0
        self._round = asyncio.create_task(
            self._relieve(reason, table, error), name="spool-pressure-relief"
        )
        self._round.add_done_callback(self._round_done)

    async def stop(self) -> None:
        """No more rounds; the running one stops waiting (its flushes go on)."""
        self._stopped = True
        if self._round is not None:
            self._round.cancel()
            await asyncio.gather(self._round, return_exceptions=True)

    def _round_done(self, task: asyncio.Task[None]) -> None:
        self._round = None
        if not task.cancelled() and task.exception() is not None:
            _log.error("spool pressure relief failed: %r", task.exception())

    async def _relieve(self, reason: str, table: str, error: SpoolError) -> None:
        if reason == "disk":
            reason = await _scarcer(self._spool.directory)
        usage = self._spool.stats().tables
        holding = [
            (writer, usage[writer.name])
            for writer in self._writers()
            if writer.name in usage and usage[writer.name].bytes > 0
        ]
        # A table already committing frees its room without being asked again, and a
        # degraded one cannot commit now: the round's slots go to the others.
        ready = [(w, u) for w, u in holding if w.degraded is None and not w.flush_busy]
        chosen = sorted(ready, key=_ranking(reason))[: self._per_round]
        if not chosen:
            if not any(w.flush_busy for w, _ in holding):  # else those commits free room
                self._log_idle(reason, table, error, len(holding))
            return
        self._metrics.pressure_flushes.labels(reason=reason).inc(len(chosen))
        _log.warning(
            "spool pressure (%s): %s was refused (%s); flushing %d of %d tables holding "
            "spooled data early: %s",
            reason,
            table,
            error,
            len(chosen),
            len(holding),
            ", ".join(_describe(w, u) for w, u in chosen),
            extra={"reason": reason, "table": table, "tables": [w.name for w, _ in chosen]},
        )
        started = time.monotonic()
        flushes = [asyncio.ensure_future(writer.flush("pressure")) for writer, _ in chosen]
        for flush in flushes:
            # A failure is the writer's to log and retry; the round only waits.
            flush.add_done_callback(_retrieve)
        done, _ = await asyncio.wait(flushes, timeout=_ROUND_WAIT)
        ok = [f.result() for f in done if not f.cancelled() and f.exception() is None]
        _log.info(
            "spool pressure (%s): %d of %d early flushes done in %.1fs (%d records "
            "committed); %d more refusals waited for this round",
            reason,
            len(ok),
            len(chosen),
            time.monotonic() - started,
            sum(r.records for r in ok),
            self._coalesced,
            extra={"reason": reason, "coalesced": self._coalesced},
        )

    def _log_idle(self, reason: str, table: str, error: SpoolError, holding: int) -> None:
        now = time.monotonic()
        if now - self._idle_logged < _IDLE_LOG_EVERY:
            return
        self._idle_logged = now
        if holding:
            why = f"the {holding} tables holding spooled data cannot commit now (degraded)"
        else:
            why = (
                "no table holds spooled data: the room is taken by quarantine/ "
                f"({human_bytes(self._spool.quarantine_bytes)}) or by other files"
            )
        _log.warning(
            "spool pressure (%s): %s was refused (%s); nothing to flush early: %s",
            reason,
            table,
            error,
            why,
            extra={"reason": reason, "table": table},
        )


def _reason(error: SpoolError) -> str | None:
    """``max_bytes``, ``disk`` (the volume; which resource is found later), or None
    for a refusal that commits cannot cure."""
    if isinstance(error, SpoolFullError):
        return "max_bytes"
    if isinstance(error, SpoolIOError) and error.errno in _NO_ROOM:
        return "disk"
    return None


async def _scarcer(directory: Path) -> str:
    """``disk_inodes`` when the spool's volume has a smaller share of its inodes left
    than of its blocks, else ``disk_bytes`` (also when statvfs cannot tell)."""
    try:
        async with asyncio.timeout(_STATVFS_TIMEOUT):
            st = await asyncio.to_thread(os.statvfs, directory)
    except (OSError, TimeoutError) as exc:
        _log.warning("statvfs of %s failed (%s); ranking tables by bytes", directory, exc)
        return "disk_bytes"
    inodes_left = st.f_favail / st.f_files if st.f_files else 1.0  # 0: no inode limit
    blocks_left = st.f_bavail / st.f_blocks if st.f_blocks else 1.0
    return "disk_inodes" if inodes_left < blocks_left else "disk_bytes"


def _ranking(reason: str) -> Callable[[tuple[TableWriter, TableUsage]], tuple[float, ...]]:
    """Sort key, best first: the most of what ran out (segment files when inodes
    did, bytes otherwise), then the oldest spooled data."""
    if reason == "disk_inodes":
        return lambda item: (-item[1].segments, -item[1].bytes, -item[0].oldest_pending_age())
    return lambda item: (-item[1].bytes, -item[0].oldest_pending_age())


def _describe(writer: TableWriter, usage: TableUsage) -> str:
    age = human_seconds(writer.oldest_pending_age())
    files = f"{usage.segments} segment{'' if usage.segments == 1 else 's'}"
    return f"{writer.name} ({files}, {human_bytes(usage.bytes)}, oldest {age})"


def _retrieve(future: asyncio.Future[FlushResult]) -> None:
    if not future.cancelled():
        future.exception()
