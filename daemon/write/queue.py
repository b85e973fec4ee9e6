"""A table's queue: acks via the spool, counts what is pending, triggers flushes.

`TableQueue` spools each conformed batch (the ack), counts what is pending, fires the
record, byte and age triggers, and queues ONE flush job at a time on the table's lane.
It knows nothing of commits: the job is its `Flusher`'s (`icespool.write.flush`), which
tells the queue which segments it takes and which leave the spool.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import pyarrow as pa

from icespool.config import WriterSettings
from icespool.errors import BackpressureError, ShuttingDownError
from icespool.metrics import Metrics
from icespool.runtime.lanes import Lane
from icespool.spool import SegmentInfo, Spool, SpoolError, SpoolFullError, SpoolIOError
from icespool.write.result import FlushResult

__all__ = ["Flusher", "TableQueue"]


class Flusher(Protocol):
    """What runs the flush jobs a `TableQueue` asks for."""

    @property
    def retry_at(self) -> float:
        """``time.monotonic()`` before which triggers wait (a failed flush's backoff)."""
        ...

    async def run(self, reason: str, ledger: TableQueue) -> FlushResult:
        """Seal and commit what the queue's table has spooled, telling ``ledger`` (the
        queue) which segments the job takes (`TableQueue.take`) and which left the
        spool (`TableQueue.settled`)."""
        ...


@dataclass(slots=True)
class _Pending:
    records: int = 0
    bytes: int = 0
    first_ack: dict[str, float] = field(default_factory=dict)  # segment id -> monotonic


class TableQueue:
    """One table's acks, pending counts and flush triggers."""

    def __init__(
        self,
        name: str,
        spool: Spool,
        lane: Lane,
        metrics: Metrics,
        flusher: Flusher,
        *,
        settings: Callable[[], WriterSettings],
        age_limit: Callable[[], float],
        on_spool_refused: Callable[[str, SpoolError], None] | None = None,
    ) -> None:
        """``settings()``: the table's current settings; ``age_limit()``: how old the
        oldest waiting record gets before the age trigger fires; ``on_spool_refused``:
        see `icespool.write.writer.TableWriter`."""
        self.name = name
        self._spool = spool
        self._lane = lane
        self._metrics = metrics
        self._flusher = flusher
        self._settings = settings
        self._age_limit = age_limit
        self._on_spool_refused = on_spool_refused
        self._pending = _Pending()
        # Segments the running flush is committing (id -> rows, bytes): still pending
        # (the gauges, the queue bound), but no longer a reason for another flush.
        self._taken: dict[str, tuple[int, int]] = {}
        self._reserved = 0
        self._queued_flush: asyncio.Future[FlushResult] | None = None
        self._queued_reason = ""
        self._flushing = False  # a flush job of this table is running
        self._closing = False
        self._timer: asyncio.Task[None] | None = None
        self._acked = asyncio.Event()  # set when something becomes pending (wakes the timer)
        self._background: set[asyncio.Future[FlushResult]] = set()
        # Records this process acked for the table (what icespool_records_acked_total
        # counts), for totals read without the registry.
        self.acked_records = 0
        # Told of every segment that leaves the spool (`settled`).
        self.on_settled: Callable[[SegmentInfo], None] | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if self._timer is None:
            self._timer = asyncio.create_task(self._age_trigger(), name=f"age-{self.name}")

    def adopt(self, segments: Iterable[SegmentInfo]) -> None:
        """Count recovered segments as pending, so they are committed and gauged."""
        now = time.monotonic()
        for info in segments:
            self._pending.records += info.rows
            self._pending.bytes += info.bytes
            self._pending.first_ack.setdefault(info.id, now)
            self._acked.set()
        self._gauge()

    async def close(self, reason: str) -> FlushResult:
        """Stop accepting, commit what is pending, stop the timer. Idempotent."""
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
            await asyncio.gather(self._timer, return_exceptions=True)
            self._timer = None
        return await self._schedule(reason)

    # ------------------------------------------------------------------ acks

    def check_open(self) -> None:
        """Raise `ShuttingDownError` once the table is closing."""
        if self._closing:
            raise ShuttingDownError(f"table {self.name} is closing; retry elsewhere or later")

    async def append(self, batch: pa.RecordBatch, meta: Mapping[str, object] | None) -> int:
        """Spool a conformed batch; returns its record count once acked.

        Raises `BackpressureError` when the table's queue or the spool is full.
        """
        rows: int = batch.num_rows
        if rows == 0:
            return 0
        incoming = batch.nbytes
        self.check_capacity(incoming)
        # Reserved until the spool answers, so concurrent appends cannot all pass
        # the check before any of them is counted.
        self._reserved += incoming
        try:
            ack = await self._spool.append(self.name, batch, meta)
        except (SpoolFullError, SpoolIOError) as exc:
            # A full or failing disk is a resource condition: retriable, never a 500.
            self._metrics.backpressure.labels(table=self.name, reason="spool").inc()
            # Committing what this table spooled frees room; without this, a spool that
            # fills before any size trigger refuses every append until batch_timeout.
            if self._pending.first_ack:
                self._background_flush("bytes")
            # The room may be held by other tables (their bytes, their segments'
            # inodes) that would commit only at their own triggers.
            if self._on_spool_refused is not None:
                self._on_spool_refused(self.name, exc)
            raise BackpressureError(str(exc), retry_after=2.0) from exc
        finally:
            self._reserved -= incoming
        self._pending.records += rows
        self._pending.bytes += ack.bytes
        self._pending.first_ack.setdefault(ack.segment_id, time.monotonic())
        self._acked.set()
        self._metrics.records_acked.labels(table=self.name).inc(rows)
        self.acked_records += rows
        self._gauge()
        self._size_trigger()
        return rows

    async def flush(self, reason: str) -> FlushResult:
        """Commit everything acked so far; returns the commit's result."""
        return await self._schedule(reason)

    def commit_soon(self, reason: str) -> None:
        """Start committing what is pending now, not waiting for it; nothing pending:
        nothing."""
        if self._pending.records:
            self._background_flush(reason)

    @property
    def pending_records(self) -> int:
        return self._pending.records

    @property
    def pending_bytes(self) -> int:
        return self._pending.bytes

    @property
    def flush_busy(self) -> bool:
        """Whether a flush of this table is queued or running (it will commit what is
        spooled now, or is doing so)."""
        queued = self._queued_flush is not None and not self._queued_flush.done()
        return queued or self._flushing

    def oldest_pending_age(self) -> float:
        if not self._pending.first_ack:
            return 0.0
        return time.monotonic() - min(self._pending.first_ack.values())

    def check_capacity(self, incoming: int = 0) -> None:
        """Raise `BackpressureError` if ``incoming`` more bytes would pass max_queue_bytes."""
        limit = self._settings().max_queue_bytes
        queued = self._pending.bytes + self._reserved
        if queued and queued + incoming >= limit:
            self._metrics.backpressure.labels(table=self.name, reason="queue").inc()
            raise BackpressureError(
                f"table {self.name} has {queued} bytes waiting for commit "
                f"(max_queue_bytes {limit}); retry shortly",
                retry_after=1.0,
            )

    def has_capacity(self) -> bool:
        """Whether an append would pass the queue limit now (no metric, no exception)."""
        queued = self._pending.bytes + self._reserved
        return not queued or queued < self._settings().max_queue_bytes

    # ------------------------------------------------------------------ the flush job's ledger

    def take(self, segments: Iterable[SegmentInfo]) -> None:
        """The flush starting now commits ``segments``: triggers look past them."""
        self._taken = {info.id: (info.rows, info.bytes) for info in segments}

    def settled(self, info: SegmentInfo) -> None:
        """The segment left the spool (committed or quarantined): stop counting it."""
        self._pending.records = max(0, self._pending.records - info.rows)
        self._pending.bytes = max(0, self._pending.bytes - info.bytes)
        self._pending.first_ack.pop(info.id, None)
        self._taken.pop(info.id, None)
        self._gauge()
        if self.on_settled is not None:
            self.on_settled(info)

    # ------------------------------------------------------------------ triggers

    def _size_trigger(self) -> None:
        settings = self._settings()
        taken_rows = sum(rows for rows, _ in self._taken.values())
        taken_bytes = sum(size for _, size in self._taken.values())
        if self._pending.records - taken_rows >= settings.max_batch_records:
            self._background_flush("records")
        elif self._pending.bytes - taken_bytes >= settings.max_batch_bytes:
            self._background_flush("bytes")

    def _trigger_age(self) -> float:
        """How long the oldest record no flush is committing yet has waited."""
        waiting = [t for sid, t in self._pending.first_ack.items() if sid not in self._taken]
        return time.monotonic() - min(waiting) if waiting else 0.0

    async def _age_trigger(self) -> None:
        tick = min(1.0, max(0.05, self._settings().batch_timeout / 4))
        while True:
            if not self._pending.first_ack:
                # Idle: no wake-ups until the next ack (10,000 idle tables each ticking
                # every second kept a core busy doing nothing). The gauges already say 0.
                self._acked.clear()
                await self._acked.wait()
            # Woken at the next tick, or when the oldest pending record reaches
            # the age limit if that is sooner: a flush at the timeout, not up to a tick
            # (a quarter of it) after, which a produce-to-visible p99 paid in full.
            # Once overdue (a flush queued behind another, a retry wait): every tick.
            due = self._age_limit() - self._trigger_age()
            await asyncio.sleep(due if self._pending.first_ack and 0 < due < tick else tick)
            self._gauge()
            if not self._pending.first_ack or time.monotonic() < self._flusher.retry_at:
                continue
            if self._trigger_age() >= self._age_limit():
                self._background_flush("age")

    def _background_flush(self, reason: str) -> None:
        if self._queued_flush is not None or time.monotonic() < self._flusher.retry_at:
            return
        future = self._schedule_nowait(reason)
        # Failures are logged and counted by the job; the timer retries.
        self._background.add(future)
        future.add_done_callback(self._background_done)

    def _background_done(self, future: asyncio.Future[FlushResult]) -> None:
        self._background.discard(future)
        if not future.cancelled():
            future.exception()

    async def _schedule(self, reason: str) -> FlushResult:
        return await asyncio.shield(self._schedule_nowait(reason))

    def _schedule_nowait(self, reason: str) -> asyncio.Future[FlushResult]:
        # Triggers that fire while a flush is still queued ride on it: it will
        # seal and commit everything acked up to the moment it starts.
        if self._queued_flush is not None and self._queued_flush.done():
            self._queued_flush = None  # cancelled before it started (pool stopped)
        if self._queued_flush is None:
            self._queued_reason = reason
            self._queued_flush = self._lane.submit(self._run_queued)
        return self._queued_flush

    async def _run_queued(self) -> FlushResult:
        reason = self._queued_reason
        self._queued_flush = None  # from here on, new triggers queue a new job
        self._flushing = True
        try:
            return await self._flusher.run(reason, self)
        finally:
            self._flushing = False
            self._taken.clear()  # what did not commit triggers again (after retry_at)

    def _gauge(self) -> None:
        m = self._metrics
        m.queue_records.labels(table=self.name).set(self._pending.records)
        m.queue_bytes.labels(table=self.name).set(self._pending.bytes)
        m.oldest_pending_age.labels(table=self.name).set(self.oldest_pending_age())
