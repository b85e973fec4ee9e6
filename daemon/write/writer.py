"""One writer per Iceberg table: acks via the spool, commits one snapshot per flush.

Data path of a table::

    append -> conform to the table's Arrow schema -> spool append (= ack)
    trigger (docs/architecture/write-path.md lists every one)
      -> job on the table's encode-pool lane: seal, read segments back, encode
         Parquet, ONE append snapshot naming the segments, delete them.

The lane runs one job of this table at a time (FIFO), so commits of a table never
race each other, while other tables' jobs run on other workers. Schema and property
changes run on the same lane, so they never race the table's commits either.

`TableWriter` owns the table's queue (`icespool.write.queue`: acks, pending counts,
triggers) and its flush job (`icespool.write.flush`: seal, encode, commit,
quarantine), and what both read: the Iceberg table, its Arrow schema, the settings
and the cadence (how far past ``batch_timeout`` its commits' conflicts stretch the age
trigger).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

import pyarrow as pa
from pyiceberg.expressions import BooleanExpression
from pyiceberg.table import Table

from icespool.cdc import OP_COLUMN, change_schema, spoolable
from icespool.config import WriterSettings
from icespool.iceberg import commit_evolution, commit_properties, delete_rows, refresh_table
from icespool.metrics import Metrics
from icespool.runtime.lanes import Lane
from icespool.schema import EvolutionPlan, Policy, arrow_schema_for
from icespool.source_claims import NO_CLAIMS, ClaimsFactory
from icespool.spool import SegmentInfo, Spool, SpoolError, table_file_stem
from icespool.write.cadence import Cadence
from icespool.write.flush import FlushJob
from icespool.write.queue import TableQueue
from icespool.write.result import FlushResult
from icespool.write.rows import AppendRows, TableRows
from icespool.write.upserts import UpsertRows

__all__ = ["KEY_INDEX_DIR", "TableWriter"]

#: Where upsert tables' key indexes live, in the spool directory (a cache of the tables:
#: rebuilt when missing or damaged; the spool's own files are beside it).
KEY_INDEX_DIR = "key-index"

_log = logging.getLogger("icespool.writer")


class TableWriter:
    """Ingest for one Iceberg table. Create through the daemon's service."""

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
        on_equality_deletes: Callable[[], object] = lambda: None,
    ) -> None:
        """``commit_refusal()``: why this process must not commit now (its spool claim:
        daemon/lifecycle/spool_claim.py); ``on_spool_refused(table, error)``: told of
        every append the spool refused (the daemon's `icespool.write.pressure.PressureRelief`
        frees room held by other tables); ``on_equality_deletes()``: an upsert table's
        commit deleted by key (called from the flush's thread)."""
        self.name = name
        self.arrow_schema = arrow_schema
        # An upsert table's key columns (empty: an append table): see `append`.
        self.key: tuple[str, ...] = tuple(key)
        self.evolve_policy: Policy = evolve
        self._schema_id = table.metadata.current_schema_id
        self._settings = settings
        self._table = table
        self._lane = lane
        self._metrics = metrics
        self.cadence = Cadence()
        rows: TableRows = AppendRows(name)
        if self.key:
            rows = UpsertRows(
                name,
                self.key,
                index_path=spool.directory / KEY_INDEX_DIR / f"{table_file_stem(name)}.sqlite3",
                # Its own Table object: a Table must not be shared with a running commit.
                load_table=lambda: table.catalog.load_table(table.name()),
                metrics=metrics,
                on_equality_deletes=on_equality_deletes,
            )
        self._job = FlushJob(
            name,
            table,
            spool,
            metrics,
            rows=rows,
            settings=lambda: self._settings,
            sync_schema=self._sync_schema,
            on_commit=self._committed,
            claims=claims,
            commit_refusal=commit_refusal,
        )
        self._queue = TableQueue(
            name,
            spool,
            lane,
            metrics,
            self._job,
            settings=lambda: self._settings,
            age_limit=self._age_limit,
            on_spool_refused=on_spool_refused,
        )
        metrics.table(name)

    # ------------------------------------------------------------------ settings

    @property
    def settings(self) -> WriterSettings:
        return self._settings

    def apply_settings(self, settings: WriterSettings) -> None:
        """Run with ``settings`` from now on (a SIGHUP reload): every trigger check,
        flush and schema change reads them; the cadence's stretch stays (it is capped
        by the new ``batch_timeout``)."""
        self._settings = settings

    def _age_limit(self) -> float:
        return self.cadence.timeout(self._settings.batch_timeout)

    def _committed(self, result: FlushResult) -> None:
        """A snapshot of the table landed: its conflicts stretch or shrink the cadence."""
        self.cadence.committed(result.conflicts, self._settings.batch_timeout)
        self._metrics.batch_timeout_stretch.labels(table=self.name).set(self.cadence.stretch)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the age trigger (and an upsert table's key index)."""
        self._queue.start()
        self._job.start()

    @property
    def key_index(self) -> dict[str, object] | None:
        """An upsert table's key index: ``ready`` (commits delete by position) and the
        ``snapshot_id`` it is at; None for an append table."""
        return self._job.key_index

    def adopt(self, segments: Iterable[SegmentInfo]) -> None:
        """Count recovered segments as pending, so they are committed and gauged."""
        self._queue.adopt(segments)

    async def close(self, reason: str = "close") -> FlushResult:
        """Stop accepting, commit what is pending, stop the timer. Idempotent."""
        try:
            return await self._queue.close(reason)
        finally:
            await asyncio.to_thread(self._job.close)

    # ------------------------------------------------------------------ ingest

    async def append(
        self, data: pa.RecordBatch | pa.Table, meta: Mapping[str, object] | None = None
    ) -> int:
        """Spool a batch in the table's schema; returns the record count once acked.

        On an upsert table (``key``) the batch is rows (each an upsert) or a change
        batch in `change_schema` (`icespool.cdc.conform_changes`: a row without its key
        is a `BadInputError` naming the key column); each commit keeps the last change
        per key.

        The way in (`icespool.write.ingest`) decodes and evolves first; this only conforms
        (a cheap re-check: the schema may have changed since) and raises
        `SchemaError` naming the column when the data does not fit (nothing of it
        is spooled), `BackpressureError` when the table's queue or the spool is full.
        """
        self._queue.check_open()
        batch = await asyncio.to_thread(spoolable, data, self.arrow_schema, self.key)
        return await self._queue.append(batch, meta)

    async def flush(self, reason: str = "manual") -> FlushResult:
        """Commit everything acked so far; returns the commit's result."""
        return await self._queue.flush(reason)

    def commit_soon(self, reason: str) -> None:
        """Start committing what is pending now, not waiting for it (a trigger from
        outside the table: its Kafka source drained a backlog); nothing pending: nothing."""
        self._queue.commit_soon(reason)

    async def replay(self, info: SegmentInfo) -> FlushResult:
        """Commit a segment just restored from quarantine (with whatever else is pending).

        An operator asked for this one attempt: if the segment still cannot be
        committed, it goes straight back to quarantine with the new reason
        (``FlushResult.quarantined`` names it).
        """
        self._queue.adopt([info])
        self._job.last_chance(info.id)
        return await self._queue.flush("replay")

    def check_capacity(self, incoming: int = 0) -> None:
        """Raise `BackpressureError` if ``incoming`` more bytes would pass max_queue_bytes."""
        self._queue.check_capacity(incoming)

    def has_capacity(self) -> bool:
        """Whether an append would pass the queue limit now (no metric, no exception)."""
        return self._queue.has_capacity()

    # ------------------------------------------------------------------ what is pending

    @property
    def pending_records(self) -> int:
        return self._queue.pending_records

    @property
    def pending_bytes(self) -> int:
        return self._queue.pending_bytes

    def oldest_pending_age(self) -> float:
        return self._queue.oldest_pending_age()

    @property
    def flush_busy(self) -> bool:
        """Whether a flush of this table is queued or running (it will commit what is
        spooled now, or is doing so)."""
        return self._queue.flush_busy

    @property
    def acked_records(self) -> int:
        """Records this process acked for the table."""
        return self._queue.acked_records

    @property
    def on_settled(self) -> Callable[[SegmentInfo], None] | None:
        """Told of every segment that leaves the spool (committed or quarantined): how
        start-up recovery and `icespool replay` count their progress."""
        return self._queue.on_settled

    @on_settled.setter
    def on_settled(self, callback: Callable[[SegmentInfo], None] | None) -> None:
        self._queue.on_settled = callback

    # ------------------------------------------------------------------ what was committed

    @property
    def degraded(self) -> str | None:
        """Why the last flush failed; None once one succeeds."""
        return self._job.degraded

    @property
    def last_commit(self) -> FlushResult | None:
        return self._job.last_commit

    @property
    def last_commit_at(self) -> float | None:
        """``time.monotonic()`` of the last commit (None before the first)."""
        return self._job.last_commit_at

    @property
    def last_commit_wall(self) -> float | None:
        """``time.time()`` of the last commit (None before the first)."""
        return self._job.last_commit_wall

    @property
    def committed_records(self) -> int:
        """Records this process committed for the table."""
        return self._job.committed_records

    def committed_file(self, file_name: str) -> bool:
        """Whether this process committed the data file ``file_name`` (recently)."""
        return self._job.committed_file(file_name)

    # ------------------------------------------------------------------ the table

    @property
    def change_schema(self) -> pa.Schema:
        """An upsert table's change-batch schema (`icespool.cdc.change_schema`) for the
        table's current Arrow schema; ValueError on an append table."""
        if not self.key:
            raise ValueError(f"table {self.name} has no key: it takes appends, not changes")
        return change_schema(self.arrow_schema, self.key)

    @property
    def table_properties(self) -> Mapping[str, str]:
        """The table's properties as of its last refresh or commit."""
        props: Mapping[str, str] = self._table.metadata.properties
        return props

    async def evolve(
        self, incoming: pa.Schema, *, only: Collection[str] | None = None, exact: bool = True
    ) -> EvolutionPlan:
        """Change the table's schema so data shaped like ``incoming`` fits (per policy).

        Runs on the table's lane (never during one of its commits); afterwards
        `arrow_schema` is the evolved one. A change past the table's ``max_columns``
        is refused (`SchemaChangeError`).
        """
        policy = self.evolve_policy
        max_columns = self._settings.max_columns  # a SIGHUP may change it
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

    async def refresh(self) -> None:
        """Re-read the table's metadata now, so a schema changed elsewhere (Spark,
        pyiceberg: the fix of a dead letter's cause) applies to the next decode
        instead of after the next commit. Runs on the table's lane."""
        future: asyncio.Future[Table] = self._lane.submit(
            lambda: asyncio.to_thread(refresh_table, self._table)
        )
        await future
        self._sync_schema()

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

    async def delete_rows(self, row_filter: BooleanExpression, summary: Mapping[str, str]) -> bool:
        """Remove the table's rows matching ``row_filter`` in one commit (dead letters
        that were replayed). Runs on the table's lane, so it never races this table's
        own commits. Returns whether anything was removed."""
        future: asyncio.Future[bool] = self._lane.submit(
            lambda: asyncio.to_thread(delete_rows, self._table, row_filter, summary=summary)
        )
        return await future

    def _sync_schema(self) -> pa.Schema:
        """Adopt the table's current schema (evolved here, or by Spark ALTER TABLE);
        returns the Arrow schema the table is written with now."""
        schema_id = self._table.metadata.current_schema_id
        if schema_id == self._schema_id:
            return self.arrow_schema
        self._schema_id = schema_id
        self.arrow_schema = arrow_schema_for(self._table)
        _log.info(
            "%s: now writing with schema %d: %s",
            self.name,
            schema_id,
            ", ".join(self.arrow_schema.names),
            extra={"table": self.name, "schema_id": schema_id},
        )
        return self.arrow_schema
