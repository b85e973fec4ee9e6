"""The append/queue half of a table's writer: acks via the spool, triggers flushes.

`TableQueue` conforms and spools each batch (the ack), counts what is pending, fires
the record, byte and age triggers, and queues ONE flush job at a time on the table's
lane (`icespool.write.writer.TableWriter` runs it). Schema and property changes also run on
that lane, so they never race the table's commits.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa
from pyiceberg.expressions import BooleanExpression
from pyiceberg.table import Table

from icespool.cdc import OP_COLUMN, change_schema, spoolable
from icespool.config import WriterSettings
from icespool.errors import BackpressureError, ShuttingDownError
from icespool.iceberg import commit_evolution, commit_properties, delete_rows, refresh_table
from icespool.metrics import Metrics
from icespool.runtime.lanes import Lane
from icespool.schema import EvolutionPlan, Policy, arrow_schema_for
from icespool.source_claims import NO_CLAIMS, ClaimsFactory
from icespool.spool import SegmentInfo, Spool, SpoolError, SpoolFullError, SpoolIOError
from icespool.write.cadence import Cadence

if TYPE_CHECKING:
    from icespool.write.writer import FlushResult

__all__ = ["TableQueue"]

# The writer's logger: the queue half logs as the table's writer.
_log = logging.getLogger("icespool.writer")


@dataclass(slots=True)
class _Pending:
    records: int = 0
    bytes: int = 0
    first_ack: dict[str, float] = field(default_factory=dict)  # segment id -> monotonic


class TableQueue:
    """The append/queue half of `icespool.write.writer.TableWriter` (its base)."""

    def __init__(
        self,
        name: str,
        table: Table,
        arrow_schema: pa.Schema,
        settings: WriterSettings,
        spool: Spool,
        lane: Lane,
        metrics: Metrics,
        evolve: Policy = "none",
        claims: ClaimsFactory = NO_CLAIMS,
        key: Sequence[str] = (),
        commit_refusal: Callable[[], str | None] = lambda: None,
        on_spool_refused: Callable[[str, SpoolError], None] | None = None,
    ) -> None:
        """``on_spool_refused(table, error)``: told of every append the spool refused
        (the daemon's `icespool.write.pressure.PressureRelief` frees room held by other tables)."""
        self.name = name
        # Why this process must not commit now (its spool claim: daemon/lifecycle/spool_claim.py).
        self._commit_refusal = commit_refusal
        self.arrow_schema = arrow_schema
        # An upsert table's key columns (empty: an append table). Its spooled batches
        # are plain rows (all upserts) or change batches (`icespool.cdc`); each commit
        # keeps the last change per key (`_encode_and_commit`).
        self.key: tuple[str, ...] = tuple(key)
        self.evolve_policy: Policy = evolve
        self._schema_id = table.metadata.current_schema_id
        self.settings = settings
        self._table = table
        self._spool = spool
        self._lane = lane
        self._metrics = metrics
        self._pending = _Pending()
        # Segments the running flush is committing (id -> rows, bytes): still pending
        # (the gauges, the queue bound), but no longer a reason for another flush.
        self._taken: dict[str, tuple[int, int]] = {}
        self.cadence = Cadence()
        self._reserved = 0
        self._queued_flush: asyncio.Future[FlushResult] | None = None
        self._queued_reason = ""
        self._flushing = False  # a flush job of this table is running
        self._on_spool_refused = on_spool_refused
        self._closing = False
        self._timer: asyncio.Task[None] | None = None
        self._acked = asyncio.Event()  # set when something becomes pending (wakes the timer)
        self._failures = 0
        self._retry_at = 0.0
        self._strikes: dict[str, int] = {}  # segment id -> flushes it failed by its own fault
        self._claims = claims
        self.degraded: str | None = None  # why the last flush failed; None once one succeeds
        self._background: set[asyncio.Future[FlushResult]] = set()
        self.last_commit: FlushResult | None = None
        # Records this process acked / committed for the table (what the
        # icespool_records_*_total series count), for totals read without the registry.
        self.acked_records = 0
        self.committed_records = 0
        # When the last commit happened (None before the first): monotonic for ages
        # (immune to wall-clock steps), wall clock for /v1/status's "at".
        self.last_commit_at: float | None = None
        self.last_commit_wall: float | None = None
        self._committed_files: OrderedDict[str, None] = OrderedDict()
        # Told of every segment that leaves the spool (committed or quarantined): how
        # start-up recovery and `icespool replay` count their progress.
        self.on_settled: Callable[[SegmentInfo], None] | None = None
        metrics.table(name)

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

    async def close(self, reason: str = "close") -> FlushResult:
        """Stop accepting, commit what is pending, stop the timer. Idempotent."""
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
            await asyncio.gather(self._timer, return_exceptions=True)
            self._timer = None
        return await self._schedule(reason)

    # ------------------------------------------------------------------ ingest

    async def append(
        self, data: pa.RecordBatch | pa.Table, meta: Mapping[str, object] | None = None
    ) -> int:
        """Spool a batch in the table's schema; returns the record count once acked.

        On an upsert table (``key``) the batch is rows (each an upsert) or a change
        batch in `change_schema` (`icespool.cdc.conform_changes`: a row without its key
        is a `BadInputError` naming the key column).

        The way in (`icespool.write.ingest`) decodes and evolves first; this only conforms
        (a cheap re-check: the schema may have changed since) and raises
        `SchemaError` naming the column when the data does not fit (nothing of it
        is spooled), `BackpressureError` when the table's queue or the spool is full.
        """
        if self._closing:
            raise ShuttingDownError(f"table {self.name} is closing; retry elsewhere or later")
        batch = await asyncio.to_thread(spoolable, data, self.arrow_schema, self.key)
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

    async def flush(self, reason: str = "manual") -> FlushResult:
        """Commit everything acked so far; returns the commit's result."""
        return await self._schedule(reason)

    def commit_soon(self, reason: str) -> None:
        """Start committing what is pending now, not waiting for it (a trigger from
        outside the table: its Kafka source drained a backlog); nothing pending: nothing."""
        if self._pending.records:
            self._background_flush(reason)

    @property
    def change_schema(self) -> pa.Schema:
        """An upsert table's change-batch schema (`icespool.cdc.change_schema`) for the
        table's current Arrow schema; ValueError on an append table."""
        if not self.key:
            raise ValueError(f"table {self.name} has no key: it takes appends, not changes")
        return change_schema(self.arrow_schema, self.key)

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

    # ------------------------------------------------------------------ triggers

    def check_capacity(self, incoming: int = 0) -> None:
        """Raise `BackpressureError` if ``incoming`` more bytes would pass max_queue_bytes."""
        limit = self.settings.max_queue_bytes
        queued = self._pending.bytes + self._reserved
        if queued and queued + incoming >= limit:
            self._metrics.backpressure.labels(table=self.name, reason="queue").inc()
            raise BackpressureError(
                f"table {self.name} has {queued} bytes waiting for commit "
                f"(max_queue_bytes {limit}); retry shortly",
                retry_after=1.0,
            )

    async def evolve(
        self, incoming: pa.Schema, *, only: Collection[str] | None = None, exact: bool = True
    ) -> EvolutionPlan:
        """Change the table's schema so data shaped like ``incoming`` fits (per policy).

        Runs on the table's lane (never during one of its commits); afterwards
        `arrow_schema` is the evolved one. A change past the table's ``max_columns``
        is refused (`SchemaChangeError`).
        """
        policy = self.evolve_policy
        max_columns = self.settings.max_columns  # a SIGHUP may change it
        # The op column of a change batch is never a table column, whatever the
        # input (an NDJSON field, a Kafka value): as a column it would shadow the ops.
        if OP_COLUMN in incoming.names:
            incoming = incoming.remove(incoming.get_field_index(OP_COLUMN))
        if only is not None:
            only = [column for column in only if column != OP_COLUMN]
        future: asyncio.Future[EvolutionPlan] = self._lane.submit(
            lambda: asyncio.to_thread(
                commit_evolution,
                self._table,
                incoming,
                policy,
                max_columns=max_columns,
                only=only,
                exact=exact,
            )
        )
        plan = await future
        self._sync_schema()
        return plan

    def _sync_schema(self) -> None:
        """Adopt the table's current schema (evolved here, or by Spark ALTER TABLE)."""
        schema_id = self._table.metadata.current_schema_id
        if schema_id == self._schema_id:
            return
        self._schema_id = schema_id
        self.arrow_schema = arrow_schema_for(self._table)
        _log.info(
            "%s: now writing with schema %d: %s",
            self.name,
            schema_id,
            ", ".join(self.arrow_schema.names),
            extra={"table": self.name, "schema_id": schema_id},
        )

    def has_capacity(self) -> bool:
        """Whether an append would pass the queue limit now (no metric, no exception)."""
        queued = self._pending.bytes + self._reserved
        return not queued or queued < self.settings.max_queue_bytes

    @property
    def table_properties(self) -> Mapping[str, str]:
        """The table's properties as of its last refresh or commit."""
        props: Mapping[str, str] = self._table.metadata.properties
        return props

    async def update_properties(
        self, updates: Callable[[Mapping[str, str]], Mapping[str, str]]
    ) -> bool:
        """Set the table properties ``updates(current)`` returns, without data (a
        source recording positions it consumed with nothing for this table).

        Runs on the table's lane, so it never races this table's own commits.
        Returns whether the table changed.
        """
        future: asyncio.Future[bool] = self._lane.submit(
            lambda: asyncio.to_thread(commit_properties, self._table, updates)
        )
        return await future

    async def refresh(self) -> None:
        """Re-read the table's metadata now, so a schema changed elsewhere (Spark,
        pyiceberg: the fix of a dead letter's cause) applies to the next decode
        instead of after the next commit. Runs on the table's lane."""
        future: asyncio.Future[Table] = self._lane.submit(
            lambda: asyncio.to_thread(refresh_table, self._table)
        )
        await future
        self._sync_schema()

    async def delete_rows(self, row_filter: BooleanExpression, summary: Mapping[str, str]) -> bool:
        """Remove the table's rows matching ``row_filter`` in one commit (dead letters
        that were replayed). Runs on the table's lane, so it never races this table's
        own commits. Returns whether anything was removed."""
        future: asyncio.Future[bool] = self._lane.submit(
            lambda: asyncio.to_thread(delete_rows, self._table, row_filter, summary=summary)
        )
        return await future

    def _take(self, segments: Iterable[SegmentInfo]) -> None:
        """The flush starting now commits ``segments``: triggers look past them."""
        self._taken = {info.id: (info.rows, info.bytes) for info in segments}

    def _size_trigger(self) -> None:
        taken_rows = sum(rows for rows, _ in self._taken.values())
        taken_bytes = sum(size for _, size in self._taken.values())
        if self._pending.records - taken_rows >= self.settings.max_batch_records:
            self._background_flush("records")
        elif self._pending.bytes - taken_bytes >= self.settings.max_batch_bytes:
            self._background_flush("bytes")

    def _trigger_age(self) -> float:
        """How long the oldest record no flush is committing yet has waited."""
        waiting = [t for sid, t in self._pending.first_ack.items() if sid not in self._taken]
        return time.monotonic() - min(waiting) if waiting else 0.0

    async def _age_trigger(self) -> None:
        tick = min(1.0, max(0.05, self.settings.batch_timeout / 4))
        while True:
            if not self._pending.first_ack:
                # Idle: no wake-ups until the next ack (10,000 idle tables each ticking
                # every second kept a core busy doing nothing). The gauges already say 0.
                self._acked.clear()
                await self._acked.wait()
            # Woken at the next tick, or when the oldest pending record reaches
            # batch_timeout if that is sooner: a flush at the timeout, not up to a tick
            # (a quarter of it) after, which a produce-to-visible p99 paid in full.
            # Once overdue (a flush queued behind another, a retry wait): every tick.
            timeout = self.cadence.timeout(self.settings.batch_timeout)
            due = timeout - self._trigger_age()
            await asyncio.sleep(due if self._pending.first_ack and 0 < due < tick else tick)
            self._gauge()
            if not self._pending.first_ack or time.monotonic() < self._retry_at:
                continue
            if self._trigger_age() >= self.cadence.timeout(self.settings.batch_timeout):
                self._background_flush("age")

    def _background_flush(self, reason: str) -> None:
        if self._queued_flush is not None or time.monotonic() < self._retry_at:
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
            self._queued_flush = self._lane.submit(self._flush_job)
        return self._queued_flush

    async def _flush_job(self) -> FlushResult:
        """Seal and commit what is spooled (`TableWriter._flush_job`)."""
        raise NotImplementedError

    def _settled(self, info: SegmentInfo) -> None:
        """The segment left the spool (committed or quarantined): stop counting it."""
        self._pending.records = max(0, self._pending.records - info.rows)
        self._pending.bytes = max(0, self._pending.bytes - info.bytes)
        self._pending.first_ack.pop(info.id, None)
        self._taken.pop(info.id, None)
        self._strikes.pop(info.id, None)
        self._gauge()
        if self.on_settled is not None:
            self.on_settled(info)

    def _gauge(self) -> None:
        m = self._metrics
        m.queue_records.labels(table=self.name).set(self._pending.records)
        m.queue_bytes.labels(table=self.name).set(self._pending.bytes)
        m.oldest_pending_age.labels(table=self.name).set(self.oldest_pending_age())
