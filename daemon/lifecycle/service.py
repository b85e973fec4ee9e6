"""The daemon's core, usable in-process: spool, catalog, tables, writers, encode pool.

``async with Icespool(config) as ice: await ice.writer("ns.t").append(batch)``

`start` opens (and recovers) the spool, loads the catalog, creates or checks the
configured tables, and commits every recovered segment before it reports ready,
so new traffic never overtakes records acked before a crash.

A table that cannot be loaded or cannot commit degrades alone: start-up goes on
with the other tables, `status` says which tables are degraded and why, loading
is retried in the background, and a failing writer retries its flushes itself.

`Icespool` keeps the lifecycle (start, drain, the spool's claim, Kafka sources);
the tables and their writers are `icespool.lifecycle.registry`, what runs over the spool's
leftovers `icespool.lifecycle.leftovers`, and the status figures `icespool.lifecycle.status`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, TextIO

import pyarrow as pa
from pyiceberg.catalog import Catalog

from icespool.config import Config, TableConfig
from icespool.errors import (
    BackpressureError,
    ReplayInProgressError,
    ShuttingDownError,
    UnknownTableError,
)
from icespool.iceberg import CatalogHealth, short_error, split_identifier, unavailable
from icespool.kafka import DeadLetterReplay, ReplayFilter, ReplayResult
from icespool.lifecycle.leftovers import commit_reloaded, recover, replay_quarantined
from icespool.lifecycle.progress import Progress
from icespool.lifecycle.registry import RELOAD_INTERVAL, TableRegistry
from icespool.lifecycle.spool_claim import SpoolClaim, SpoolContestedError
from icespool.lifecycle.spool_watch import SpoolWatch
from icespool.lifecycle.startup import StartWait, load_catalog_waiting
from icespool.lifecycle.status import StatusReport, Totals, kafka_status
from icespool.maintenance import DEFAULT_TASKS, FileOwner, MaintenanceScheduler
from icespool.metrics import Metrics
from icespool.runtime.fanout import CATALOG_CONCURRENCY, Tally, fan_out
from icespool.runtime.lanes import LanePool
from icespool.runtime.retry import Backoff, retry_async
from icespool.schema import Policy
from icespool.spool import FileSystem, QuarantinedSegment, Spool
from icespool.write.early_acks import EarlyAcks
from icespool.write.encode_pool import flush_executor
from icespool.write.ingest import Ingest, TableInput
from icespool.write.pressure import PressureRelief
from icespool.write.result import FlushResult
from icespool.write.writer import TableWriter

if TYPE_CHECKING:
    from icespool.kafka import KafkaSource

__all__ = ["Icespool", "Totals"]

_log = logging.getLogger("icespool.service")
# A final commit that meets an outage: retried within the shutdown grace.
_FINAL_COMMIT = Backoff(attempts=1, base=0.5, cap=5.0)
# How often tables that could not be loaded are tried again.
_RELOAD_INTERVAL = RELOAD_INTERVAL


class Icespool:
    """Everything between a decoded batch and a committed Iceberg snapshot."""

    def __init__(
        self,
        config: Config,
        *,
        metrics: Metrics | None = None,
        fs: FileSystem | None = None,
        progress_line: TextIO | None = None,
    ) -> None:
        """``fs``: the spool's file-system seam; tests pass one that fails or crashes
        at chosen calls (the daemon never does). ``progress_line``: a terminal on which
        start-up recovery redraws one progress line (`icespool replay` on a TTY)."""
        self.config = config
        self.metrics = metrics or Metrics()
        self.ready = False
        self.draining = False
        self.started_at = time.time()
        self._spool = Spool(
            config.spool.dir,
            durability=config.spool.durability,
            max_bytes=config.spool.max_bytes,
            segment_max_bytes=config.spool.segment_max_bytes,
            fs=fs,
            # A flush's reads and deletes of segments run at its lower priority.
            commit_executor=flush_executor(),
        )
        self._pool = LanePool(config.encode.resolved_workers)
        # An append refused for lack of room flushes the tables holding it, as many at
        # a time as commits can run at once.
        self._pressure = PressureRelief(
            self._spool,
            self._writers_now,
            self.metrics,
            per_round=config.encode.resolved_workers,
        )
        self._watch = SpoolWatch(self._spool, self.metrics)
        # Maintains every table that has a writer; starts after recovery, stops first.
        self.maintenance = MaintenanceScheduler(
            config,
            pool=self._pool,
            metrics=self.metrics,
            tasks=DEFAULT_TASKS,
            is_spooled=self._is_spooled,
            was_committed=self._was_committed,
        )
        # Per-table work whose heavy part queues in the lanes (recovery commits): twice
        # the lane workers keeps every worker busy without queueing every table at once.
        self._fan_limit = max(CATALOG_CONCURRENCY, 2 * config.encode.resolved_workers)
        self.tables = TableRegistry(
            config,
            spool=self._spool,
            pool=self._pool,
            metrics=self.metrics,
            maintenance=self.maintenance,
            pressure=self._pressure,
            commit_refusal=self._commit_refusal,
        )
        # The registry's own dicts (never replaced): the writers by name, and the
        # tables that could not be loaded, (their config, why), retried in the background.
        self._writers = self.tables.writers
        self._unloaded = self.tables.unloaded
        self._report = StatusReport(
            config,
            metrics=self.metrics,
            spool=self._spool,
            watch=self._watch,
            pool=self._pool,
            maintenance=self.maintenance,
            writers=self._writers,
        )
        self.ingest = Ingest(self)
        self._sources: list[KafkaSource] = []
        self._reloader: asyncio.Task[None] | None = None
        self._waiting_sources: list[KafkaSource] = []
        self._replaying: set[str] = set()  # dead-letter tables with a replay running
        self._state = "new"
        self._claim: SpoolClaim | None = None
        # Why this process takes no more records: another process took its spool's
        # claim over (None: it holds it, or runs without one).
        self._claim_lost: str | None = None
        self._claim_lost_task: asyncio.Task[None] | None = None
        self._health: CatalogHealth | None = None
        self._starting = "starting (spool recovery)"
        # What the start waits for (the catalog, with its last error); None otherwise.
        self.start_wait: StartWait | None = None
        # Acks records of tables with a known schema while the start waits (the daemon).
        self._early: EarlyAcks | None = None
        self._progress_line = progress_line
        # Start-up recovery's progress (None: nothing was spooled); kept after it ends.
        self.recovery: Progress | None = None

    @property
    def _catalog(self) -> Catalog | None:
        return self.tables.catalog

    async def __aenter__(self) -> Icespool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ------------------------------------------------------------------ lifecycle

    async def start(self, *, wait_for_catalog: bool = False) -> None:
        """Open the spool, load catalog and tables, commit what the spool holds.

        ``wait_for_catalog``: retry an unreachable catalog with backoff (the daemon)
        instead of raising CatalogError (replay, in-process use).
        """
        if self._state != "new":
            raise RuntimeError("an Icespool service starts once")
        self._state = "starting"
        report = await self._spool.open()
        self.metrics.quarantined_segments.inc(len(report.quarantined))
        self.metrics.truncated_segments.inc(len(report.truncated))
        self.metrics.spool_max_bytes.set(self.config.spool.max_bytes)
        if wait_for_catalog:
            self._early = EarlyAcks(self.config, self._spool, self.metrics)
        try:
            self.tables.catalog = catalog = await load_catalog_waiting(
                self.config, retry=wait_for_catalog, waiting=self._waiting
            )
            acked_early = [] if self._early is None else await self._early.settled()
            self._starting = "starting (loading tables)"
            await self._pool.start()
            await self.tables.load_all()
            self._starting = (
                "starting (claiming the spool in the catalog: a claim of another process is "
                f"waited out for up to {self.config.spool.claim_ttl:.0f}s)"
            )
            await self._claim_spool()
            await recover(
                self.tables,
                self._spool,
                acked_early,
                line=self._progress_line,
                limit=self._fan_limit,
                started=self._recovering,
            )
        except BaseException:
            await self._abort()
            raise
        for writer in self._writers.values():
            writer.start()
        if self._unloaded:
            self._reloader = asyncio.create_task(self._reload_unloaded(), name="reload-tables")
        self._state = "running"
        self.ready = self._claim_lost is None
        self.metrics.ready.set(1 if self.ready else 0)
        timeouts = self.config.timeouts
        self._health = CatalogHealth(catalog, self.config.catalog.name, timeouts.catalog_request)
        self._health.start()
        # Tables with maintenance off are still measured (read-only) for the gauges.
        await self.maintenance.start(
            catalog,
            self._spool.id,
            FileOwner(
                self._spool.incarnation.tag,
                frozenset(
                    earlier.tag
                    for earlier in self._spool.earlier_incarnations
                    if earlier.gone(self._spool.incarnation)
                ),
            ),
        )
        # Sources start last: recovered segments are committed, so the offsets the
        # tables hold are final when the first partitions are assigned.
        for i, kafka in enumerate(self.config.kafka):
            # Imported here: the Kafka client (aiokafka, and the internals of it that
            # icespool.kafka._upstream reaches into) only where a source is configured.
            from icespool.kafka import KafkaSource

            source = KafkaSource(
                kafka,
                name=f"kafka[{i}]",
                ingest=self.ingest,
                writer_for=self._writers.__getitem__,  # also while draining
                book_for=self.tables.book,
                load_properties=self._load_properties,
                spool_has_room=self._spool_has_room,
                metrics=self.metrics,
                table_names=list(self._writers),
                max_nesting_depth=self.config.defaults.max_nesting_depth,
            )
            self._start_source(source)

    def _start_source(self, source: KafkaSource) -> None:
        waiting_for = [t for t in source.tables if t in self._unloaded]
        if waiting_for:
            # Its offsets live in tables it cannot read or write yet: it starts
            # once they load (no partition is consumed meanwhile).
            self._waiting_sources.append(source)
            _log.error(
                "%s waits for tables %s to load before consuming",
                source.name,
                ", ".join(waiting_for),
            )
            return
        self._sources.append(source)
        source.start()

    async def stop(self, grace: float = 30.0) -> int:
        """Drain: commit everything pending (reason ``shutdown``) within ``grace`` s.

        Whatever cannot be committed in time stays in the spool and is committed
        at the next start. Returns how many segments that is. Idempotent.
        """
        if self._state in ("stopped", "new"):
            self._state = "stopped"
            return 0
        self._state = "stopped"
        self.ready = False
        self.draining = True
        self.metrics.ready.set(0)
        await self._pressure.stop()  # the final commits flush every table anyway
        # First: no maintenance commit queues behind (or between) the final commits,
        # and this replica's leases are free for the others while it drains.
        await self.maintenance.stop(release_within=min(5.0, grace / 4))
        if self._reloader is not None:
            self._reloader.cancel()
            await asyncio.gather(self._reloader, return_exceptions=True)
        if self._health is not None:
            await self._health.stop()
        if self._claim_lost_task is not None:
            await asyncio.gather(self._claim_lost_task, return_exceptions=True)
        for source in self._sources:
            await source.stop_fetching()
        deadline = time.monotonic() + grace
        writers = list(self._writers.values())
        tally = Tally("shutdown commits", len(writers))
        tally.detail = lambda: f"{self.totals().pending} records pending"
        if writers:
            _log.info(
                "shutdown: committing %d tables (%d records pending) within %.0fs",
                len(writers),
                self.totals().pending,
                grace,
                extra={"tables": len(writers)},
            )
        # One task per table closes every writer at once (no more triggers), while the
        # lanes bound the work: at most `encode.workers` commits run at a time, the
        # rest wait in their lanes' FIFO. Each final commit logs its own failure, so
        # none of them cancels the others.
        async with tally.reporting(), asyncio.TaskGroup() as group:
            closing = [
                group.create_task(_final_commit(w, deadline), name=f"final-commit-{w.name}")
                for w in writers
            ]
            for task in closing:
                task.add_done_callback(lambda _: setattr(tally, "done", tally.done + 1))
            pending: set[asyncio.Task[None]] = set()
            if closing:
                _, pending = await asyncio.wait(closing, timeout=grace)
            if pending:
                _log.warning(
                    "shutdown grace of %.0fs passed with %d tables still committing; their "
                    "records stay in the spool for the next start",
                    grace,
                    len(pending),
                )
            for source in self._sources:
                await source.close()  # offsets to Kafka only after the final commits
            await self._pool.stop(drain=not pending)
            for task in pending:
                task.cancel()
        if self._claim is not None:
            await self._claim.release()
        await self._spool.close()
        return self._spool.stats().segments

    def _waiting(self, wait: StartWait | None) -> None:
        self.start_wait = wait
        if self._early is not None:
            self._early.waiting(wait)

    def _recovering(self, progress: Progress) -> None:
        # Set before the first commit: /readyz and the STATUS line show how far it is.
        self.recovery = progress

    def accepting_while_waiting(self, name: str) -> EarlyAcks | None:
        """What acks records for ``name`` while the start waits for the catalog, if
        its schema is known (`icespool.write.early_acks`); None otherwise."""
        early = self._early
        return early if early is not None and not self.draining and early.accepts(name) else None

    async def _abort(self) -> None:
        self._state = "stopped"
        if self._early is not None:
            await self._early.shut()
        await self._pressure.stop()
        await self._pool.stop(drain=False)
        await self._spool.close()

    # ------------------------------------------------------------------ tables

    def not_ready_reason(self) -> str | None:
        """Why /readyz says no (None when ready)."""
        if self.draining:
            return "shutting down"
        if self._claim_lost is not None:
            return self._claim_lost
        if not self.ready:
            if self.recovery is not None and not self.recovery.finished:
                return f"starting ({self.recovery.text()})"
            if self.start_wait is not None:
                early = "" if self._early is None else self._early.note()
                return self.start_wait.reason() + early
            return self._starting
        if self.catalog_problem is not None:
            return self.catalog_problem
        down = [s.name for s in self._sources if not s.connected]
        if down:
            return f"Kafka not connected ({', '.join(down)}); retrying with backoff"
        return None

    @property
    def catalog_problem(self) -> str | None:
        """Why the catalog counts as unreachable right now (None: it answers)."""
        return None if self._health is None else self._health.problem

    def writer(self, name: str) -> TableInput:
        """A configured table, for the in-process API (appends go through `ingest`)."""
        return TableInput(self.ingest, self.table_writer(name))

    def table_writer(self, name: str) -> TableWriter:
        """The writer of a configured table; raises why it cannot take records."""
        if self.draining:
            raise ShuttingDownError("the daemon is shutting down; retry against another replica")
        return self.tables.writer(name)

    def _writers_now(self) -> list[TableWriter]:
        return list(self._writers.values())

    @property
    def table_names(self) -> list[str]:
        return list(self._writers)

    def written_by_daemon(self, name: str) -> bool:
        """Whether only the daemon writes ``name``: a Kafka source's dead-letter table."""
        return any(k.dead_letter_table == name for k in self.config.kafka)

    async def flush(self, name: str) -> FlushResult:
        return await self.table_writer(name).flush("manual")

    # ------------------------------------------------------------------ tables from data

    def awaiting_schema(self, name: str) -> bool:
        """Whether ``name`` is an ``infer = true`` table not created yet."""
        return self.tables.awaiting_schema(name)

    async def create_from(
        self, name: str, incoming: pa.Schema, *, evolve: Policy | None = None
    ) -> TableWriter:
        """Create ``name`` with the schema inferred from ``incoming`` (its first batch)
        and start its writer; another replica's table of that name is used as it is.

        For ``infer = true`` tables and Kafka ``auto_create`` routes.
        """
        return await self.tables.create_from(name, incoming, evolve=evolve)

    def _load_properties(self, name: str) -> dict[str, str]:
        """A table's current properties, read with a Table of its own (blocking)."""
        return self.tables.load_properties(name)

    def _is_spooled(self, table: str, segment_id: str) -> bool:
        """Whether the spool still holds segment ``segment_id`` of ``table``."""
        return any(info.id == segment_id for info in self._spool.segments(table))

    def _was_committed(self, table: str, file_name: str) -> bool:
        writer = self._writers.get(table)
        return writer is not None and writer.committed_file(file_name)

    def _spool_has_room(self) -> bool:
        # Sources pause before the spool refuses appends, leaving room for HTTP. Asked
        # on every fetch: O(1), not a walk of every table's segments.
        used = self._spool.used_bytes + self._spool.quarantine_bytes
        return used < 0.9 * self.config.spool.max_bytes

    async def _claim_spool(self) -> None:
        """Claim the spool's identity in the catalog (``spool_claim.py``) before
        committing anything: a copy of a running daemon's directory stops here."""
        assert self._catalog is not None
        if not self.config.tables:
            _log.warning(
                "no [[tables]] entry: the spool's identity is not claimed in the catalog, "
                "so a copy of this data directory running elsewhere is not recognised"
            )
            return
        namespace = split_identifier(self.config.tables[0].name)[0]
        self._claim = SpoolClaim(
            self._catalog,
            namespace,
            self._spool.id,
            self._spool.incarnation,
            ttl=self.config.spool.claim_ttl,
            request_timeout=self.config.timeouts.catalog_request,
            on_lost=self._lost_claim,
        )
        try:
            await asyncio.to_thread(self._catalog.create_namespace_if_not_exists, namespace)
            await self._claim.acquire()
            if self._claim.adopted is not None:
                self.metrics.spool_claim_changes.labels(kind="adopted").inc()
        except SpoolContestedError:
            raise
        except Exception as exc:
            # A catalog that keeps no namespace properties (or refuses this daemon
            # them) still ingests: only the copy's recognition is lost, never data.
            _log.warning(
                "the spool's identity cannot be claimed in namespace %s (%s: %s): a copy of "
                "this data directory running elsewhere is not recognised",
                ".".join(namespace),
                type(exc).__name__,
                exc,
            )
            self._claim = None

    def _commit_refusal(self) -> str | None:
        return None if self._claim is None else self._claim.commit_refusal()

    def _lost_claim(self, reason: str) -> None:
        """Another process took the spool's claim over: this one commits nothing more
        (`SpoolClaim.commit_refusal`), so it must ack nothing more either. It leaves
        service (/readyz 503, appends 503 naming the reason) and its Kafka sources
        leave their groups, so the holder's side reads their partitions; what it
        acked before stays in its spool."""
        self._claim_lost = reason
        self.ready = False
        self.metrics.ready.set(0)
        self.metrics.spool_claim_changes.labels(kind="lost").inc()
        self._claim_lost_task = asyncio.create_task(
            self._leave_sources(), name="claim-lost-sources"
        )

    async def _leave_sources(self) -> None:
        for source in self._sources:
            try:
                await source.stop_fetching()
                await source.close()
            except Exception as exc:
                _log.warning(
                    "%s: leaving its group failed: %s: %s", source.name, type(exc).__name__, exc
                )

    async def _reload_unloaded(self) -> None:
        while self._unloaded:
            await asyncio.sleep(_RELOAD_INTERVAL)
            # Side by side, bounded: 1,000 tables of a catalog that times out must not
            # make one round last 1,000 timeouts.
            tried = len(self._unloaded)
            await fan_out(
                "reloading degraded tables",
                list(self._unloaded.items()),
                self._reload_one,
                limit=CATALOG_CONCURRENCY,
            )
            if self._unloaded:
                # One line per round, not one per table (each new reason was logged).
                name, (_, reason) = next(iter(self._unloaded.items()))
                _log.warning(
                    "%d of %d degraded tables still cannot be loaded, retrying every %.0fs "
                    "(e.g. %s: %s)",
                    len(self._unloaded),
                    tried,
                    _RELOAD_INTERVAL,
                    name,
                    reason,
                    extra={"tables": len(self._unloaded)},
                )
            waiting, self._waiting_sources = self._waiting_sources, []
            for source in waiting:
                self._start_source(source)

    async def _reload_one(self, entry: tuple[str, tuple[TableConfig | None, str]]) -> None:
        name, (table_config, _) = entry
        writer = await self.tables.reload(name, table_config)
        if writer is not None:
            await commit_reloaded(writer, self._spool)

    async def replay_quarantined(self, segment_id: str) -> FlushResult:
        """Restore one quarantined segment and commit it (exactly once).

        Raises `UnknownSegmentError` / `SegmentCorruptError` (spool) when it cannot
        be restored, `CommitError` naming the reason when it still cannot be
        committed (it is back in quarantine, or still spooled for the next start).
        """
        return await replay_quarantined(self.tables, self._spool, segment_id)

    # ------------------------------------------------------------------ dead letters

    async def replay_dead_letters(self, table: str, selection: ReplayFilter) -> ReplayResult:
        """Re-ingest the dead letters of ``table`` that ``selection`` picks into their
        targets, exactly once, and remove them from ``table`` (see
        `icespool.kafka.DeadLetterReplay`).

        Raises `UnknownTableError` (not a dead-letter table of this daemon),
        `ReplayInProgressError` (one runs already), `BackpressureError` (shutting
        down, or its source waits for a table to load). A failure midway is in the
        result's ``error``; what was done before it stays done.
        """
        if self.draining:
            raise ShuttingDownError("the daemon is shutting down; replay dead letters later")
        configured = [k.dead_letter_table for k in self.config.kafka if k.dead_letter_table]
        if table not in configured:
            raise UnknownTableError(
                f"table {table!r} is not a dead-letter table of this daemon; dead-letter "
                f"tables: {', '.join(sorted(set(configured))) or '(none)'}"
            )
        sources = [s for s in self._sources if s.dead_letter_table == table]
        if not sources:
            raise BackpressureError(
                f"the Kafka source of {table} waits for its tables to load; replay later",
                retry_after=_RELOAD_INTERVAL,
            )
        if table in self._replaying:
            raise ReplayInProgressError(
                f"a replay of {table} is already running; wait for its answer"
            )
        self._replaying.add(table)
        try:
            replay = DeadLetterReplay(
                table,
                sources=sources,
                dead_letters=self.table_writer(table),
                writer_for=self.table_writer,
                load_table=self._load_fresh,
                load_properties=self._load_properties,
                stopping=lambda: self.draining,
            )
            return await replay.run(selection)
        finally:
            self._replaying.discard(table)

    def _load_fresh(self, name: str) -> Any:
        """A Table object of its own for ``name`` (blocking)."""
        return self.tables.load_fresh(name)

    # ------------------------------------------------------------------ status

    def status(self) -> dict[str, Any]:
        parts = self._report.spool_parts()
        return {
            "ready": self.ready,
            # What /readyz says: "ready" above only means recovery is done (ingest acks).
            "not_ready": self.not_ready_reason(),
            # What the start waits for (the catalog and its last error), else null.
            "waiting_for": None if self.start_wait is None else self.start_wait.snapshot(),
            # Tables whose records are acked meanwhile (their schema is known).
            "accepting_while_waiting": [] if self._early is None else self._early.accepting(),
            "draining": self.draining,
            "degraded": self.degraded(),
            "quarantine": parts["quarantine"],
            "uptime_seconds": round(time.time() - self.started_at, 1),
            "spool": parts["spool"],
            "tables": parts["tables"],
            "kafka": kafka_status(self._sources),
            # The last start-up recovery (null: nothing was spooled at start).
            "recovery": None if self.recovery is None else self.recovery.snapshot(),
        }

    def quarantined(self) -> list[QuarantinedSegment]:
        """The spool's quarantined segments (blocking: lists a small directory)."""
        return self._spool.quarantined()

    def degraded(self) -> dict[str, str]:
        """Tables that cannot commit now, with the reason (empty when all are fine)."""
        return self.tables.degraded()

    def totals(self) -> Totals:
        """Acked, committed and pending records over every table, and the spool's
        bytes, from one pass over the writers (`StatusReport.totals`)."""
        return self._report.totals()

    def refresh_gauges(self) -> None:
        """Bring the readiness, spool and last-commit-age gauges up to date (on every
        /metrics scrape)."""
        # As /readyz: a catalog outage or a Kafka source down makes it 0 too.
        self._report.refresh_gauges(ready=self.not_ready_reason() is None)


async def _final_commit(writer: TableWriter, deadline: float) -> None:
    """The shutdown commit of one table, retried while its catalog or object store is
    unreachable and the grace lasts: a blip as the daemon stops (a catalog restart in
    the same rollout) must not leave the spool to a start that may never come."""

    def log(number: int, exc: BaseException, delay: float) -> None:
        _log.warning(
            "%s: shutdown commit failed (%s); retrying in %.1fs within the grace",
            writer.name,
            short_error(exc),
            delay,
            extra={"table": writer.name},
        )

    try:
        await retry_async(
            lambda: writer.close("shutdown"),
            attempts=None,
            retryable=lambda exc: isinstance(exc, Exception) and unavailable(exc) is not None,
            pause=_FINAL_COMMIT.pause,
            on_retry=log,
            deadline=deadline,
        )
    except Exception as exc:
        _log.error("final commit failed; the spool keeps the records: %s", exc)
