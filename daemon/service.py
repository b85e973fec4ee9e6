"""The daemon's core, usable in-process: spool, catalog, tables, writers, encode pool.

``async with Icespool(config) as ice: await ice.writer("ns.t").append(batch)``

`start` opens (and recovers) the spool, loads the catalog, creates or checks the
configured tables, and commits every recovered segment before it reports ready,
so new traffic never overtakes records acked before a crash.

A table that cannot be loaded or cannot commit degrades alone: start-up goes on
with the other tables, `status` says which tables are degraded and why, loading
is retried in the background, and a failing writer retries its flushes itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from icespool.config import Config, KafkaConfig, TableConfig
from icespool.early_acks import EarlyAcks
from icespool.encode_pool import flush_executor
from icespool.errors import (
    BackpressureError,
    CommitError,
    ReplayInProgressError,
    ShuttingDownError,
    UnknownTableError,
)
from icespool.fanout import CATALOG_CONCURRENCY, Tally, fan_out
from icespool.iceberg import (
    CatalogHealth,
    create_inferred,
    create_with,
    existing_table,
    load_declared,
    short_error,
    split_identifier,
    table_names,
    unavailable,
)
from icespool.ingest import AUTO_CREATED, Ingest, TableInput
from icespool.kafka import (
    DeadLetterReplay,
    OffsetBook,
    ReplayFilter,
    ReplayResult,
    dead_letter_schema,
)
from icespool.lanes import LanePool
from icespool.maintenance import (
    DEFAULT_TASKS,
    FileOwner,
    MaintenanceScheduler,
    created_table_properties,
)
from icespool.metrics import Metrics
from icespool.pressure import PressureRelief
from icespool.progress import Progress
from icespool.retry import Backoff, retry_async
from icespool.schema import (
    Policy,
    arrow_schema_for,
)
from icespool.spool import FileSystem, QuarantinedSegment, SegmentInfo, Spool
from icespool.spool_claim import SpoolClaim, SpoolContestedError
from icespool.spool_watch import SpoolWatch
from icespool.startup import StartWait, load_catalog_waiting
from icespool.writer import SEGMENT_ATTEMPTS, FlushResult, TableWriter, UncommittableSegmentError

if TYPE_CHECKING:
    from icespool.kafka import KafkaSource

__all__ = ["Icespool", "Totals"]

_log = logging.getLogger("icespool.service")
# A final commit that meets an outage: retried within the shutdown grace.
_FINAL_COMMIT = Backoff(attempts=1, base=0.5, cap=5.0)
# How often tables that could not be loaded are tried again.
_RELOAD_INTERVAL = 10.0
# /v1/status lists at most this many quarantined segments (and counts all of them).
_STATUS_QUARANTINE_LIMIT = 100


@dataclass(frozen=True, slots=True)
class Totals:
    """Figures over every table, from one pass over the writers (no metric collection)."""

    tables: int
    acked: int  # records acknowledged by this process
    committed: int  # records committed by this process
    pending: int  # records acknowledged and not committed yet (recovered ones included)
    spool_bytes: int


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
        self._catalog: Catalog | None = None
        self.ingest = Ingest(self)
        self._writers: dict[str, TableWriter] = {}
        self._books: dict[str, OffsetBook] = {}
        self._sources: list[KafkaSource] = []
        self._awaiting_schema: dict[str, TableConfig] = {}
        self._creating: dict[str, asyncio.Lock] = {}
        # Tables that could not be loaded: (their config, why). Retried in the background.
        self._unloaded: dict[str, tuple[TableConfig | None, str]] = {}
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
            self._catalog = await load_catalog_waiting(
                self.config, retry=wait_for_catalog, waiting=self._waiting
            )
            acked_early = [] if self._early is None else await self._early.settled()
            self._starting = "starting (loading tables)"
            await self._pool.start()
            await self._load_tables()
            self._starting = (
                "starting (claiming the spool in the catalog: a claim of another process is "
                f"waited out for up to {self.config.spool.claim_ttl:.0f}s)"
            )
            await self._claim_spool()
            await self._recover(acked_early)
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
        self._health = CatalogHealth(
            self._catalog, self.config.catalog.name, timeouts.catalog_request
        )
        self._health.start()
        # Tables with maintenance off are still measured (read-only) for the gauges.
        await self.maintenance.start(
            self._catalog,
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
                book_for=self._book,
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

    def accepting_while_waiting(self, name: str) -> EarlyAcks | None:
        """What acks records for ``name`` while the start waits for the catalog, if
        its schema is known (`icespool.early_acks`); None otherwise."""
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
        try:
            return self._writers[name]
        except KeyError:
            if name in self._unloaded:
                raise BackpressureError(
                    f"table {name!r} is degraded: {self._unloaded[name][1]}; "
                    f"retrying every {_RELOAD_INTERVAL:.0f}s",
                    retry_after=_RELOAD_INTERVAL,
                ) from None
            if name in self._awaiting_schema:
                raise UnknownTableError(
                    f"table {name!r} is created from its first records (infer = true) "
                    "and has none yet"
                ) from None
            raise UnknownTableError(
                f"table {name!r} is not configured; add it to [[tables]]"
            ) from None

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

    async def _add_writer(
        self,
        name: str,
        table_config: TableConfig | None,
        *,
        create: bool = False,
        table: Any = None,
        evolve: Policy | None = None,
    ) -> TableWriter:
        if table is None:
            table = await self._open_table(name, table_config, create=create)
        return self._register(name, table_config, table, evolve=evolve)

    async def _open_table(
        self, name: str, table_config: TableConfig | None, *, create: bool = False
    ) -> Table:
        """Load ``name`` from the catalog (in a thread); ``create``: a dead-letter
        table, with our schema, created when missing."""
        catalog = self._require_catalog()
        defaults = created_table_properties(self.config, table_config)
        if create:
            return await asyncio.to_thread(
                create_with, catalog, name, dead_letter_schema(), defaults
            )
        return await asyncio.to_thread(load_declared, catalog, name, table_config, defaults)

    def _register(
        self,
        name: str,
        table_config: TableConfig | None,
        table: Table,
        *,
        evolve: Policy | None = None,
    ) -> TableWriter:
        """Start serving ``name`` with a loaded ``table`` (not started: see `TableWriter.start`)."""
        settings = self.config.table_settings(name) if table_config else self.config.defaults
        writer = TableWriter(
            name,
            table,
            arrow_schema_for(table),
            settings,
            self._spool,
            self._pool.lane(name),
            self.metrics,
            evolve=evolve or (table_config.evolve if table_config else "none"),
            claims=self._book(name).claims,
            key=table_config.key if table_config else (),
            commit_refusal=self._commit_refusal,
            on_spool_refused=self._pressure.refused,
        )
        self._writers[name] = writer
        self.maintenance.add(name)
        return writer

    async def _load_tables(self) -> None:
        """Load (or create) every declared table, then the Kafka sources' dead-letter
        tables and the tables their ``auto_create`` made in earlier runs.

        Loads run `CATALOG_CONCURRENCY` at a time (1,000 tables one after the other took
        15 s); writers are registered in config order. A table that cannot be loaded
        is marked degraded alone; the others serve.
        """
        declared = self.config.tables

        async def load(table_config: TableConfig) -> Table | None:
            if table_config.infer and table_config.columns is None:
                # None: created from the first batch it receives.
                return await asyncio.to_thread(
                    existing_table, self._require_catalog(), table_config.name
                )
            return await self._open_table(table_config.name, table_config)

        loaded = await fan_out("loading tables", declared, load, limit=CATALOG_CONCURRENCY)
        for table_config, outcome in zip(declared, loaded, strict=True):
            name = table_config.name
            if isinstance(outcome, Exception):  # this table only: the others serve
                self._mark_unloaded(name, table_config, outcome)
            elif outcome is None:
                self._awaiting_schema[name] = table_config
            else:
                self._register(name, table_config, outcome)
        for kafka in self.config.kafka:
            dead_letters = kafka.dead_letter_table
            if dead_letters is not None and dead_letters not in self._writers:
                try:
                    await self._add_writer(dead_letters, None, create=True)
                except Exception as exc:  # its source waits for it; the rest serve
                    self._mark_unloaded(dead_letters, None, exc)
            if kafka.auto_create:
                names = await asyncio.to_thread(self._auto_created, kafka)
                opened = await fan_out(
                    "loading auto-created tables",
                    names,
                    lambda name: self._open_table(name, None),
                    limit=CATALOG_CONCURRENCY,
                )
                for name, result in zip(names, opened, strict=True):
                    if isinstance(result, Exception):
                        # Like any route's table: its records stay spooled, retried.
                        self._mark_unloaded(name, None, result)
                    elif name not in self._writers:
                        self._register(name, None, result, evolve=AUTO_CREATED)

    # ------------------------------------------------------------------ tables from data

    def awaiting_schema(self, name: str) -> bool:
        """Whether ``name`` is an ``infer = true`` table not created yet."""
        return name in self._awaiting_schema and name not in self._writers

    async def create_from(
        self, name: str, incoming: pa.Schema, *, evolve: Policy | None = None
    ) -> TableWriter:
        """Create ``name`` with the schema inferred from ``incoming`` (its first batch)
        and start its writer; another replica's table of that name is used as it is.

        For ``infer = true`` tables and Kafka ``auto_create`` routes.
        """
        lock = self._creating.setdefault(name, asyncio.Lock())
        async with lock:
            if name in self._writers:
                return self._writers[name]
            table_config = self._awaiting_schema.get(name)
            settings = self.config.table_settings(name) if table_config else self.config.defaults
            table = await asyncio.to_thread(
                create_inferred,
                self._require_catalog(),
                name,
                incoming,
                table_config,
                created_table_properties(self.config, table_config),
                max_columns=settings.max_columns,
            )
            writer = await self._add_writer(name, table_config, table=table, evolve=evolve)
            writer.start()
            self._awaiting_schema.pop(name, None)
            _log.info(
                "%s: created from the first batch's schema: %s",
                name,
                ", ".join(f"{f.name} {f.field_type}" for f in table.schema().fields),
                extra={"table": name},
            )
            return writer

    def _auto_created(self, kafka: KafkaConfig) -> list[str]:
        """Tables a Kafka source created in an earlier run (they match its template)."""
        assert self._catalog is not None and kafka.table_template is not None
        namespace = kafka.table_template.split(".", 1)[0]
        listed = table_names(self._catalog, namespace)
        return [n for n in kafka.targets(listed) if n not in self._writers]

    def _require_catalog(self) -> Catalog:
        assert self._catalog is not None, "the catalog is loaded in start()"
        return self._catalog

    def _book(self, name: str) -> OffsetBook:
        """The Kafka offset bookkeeping of table ``name`` (its writer's claims)."""
        book = self._books.get(name)
        if book is None:
            book = self._books[name] = OffsetBook(name, self.metrics)
        return book

    def _load_properties(self, name: str) -> dict[str, str]:
        """A table's current properties, read with a Table of its own (blocking)."""
        assert self._catalog is not None
        return dict(self._catalog.load_table(name).metadata.properties)

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

    async def _recover(self, acked_early: list[SegmentInfo]) -> None:
        """Commit leftover segments, and those acked while the catalog was awaited
        (``acked_early``), before any new record is accepted.

        A table that cannot commit its leftovers is left degraded (its writer
        keeps retrying, its segments stay spooled); it never stops the others.
        """
        recovered = [*self._spool.recovered.segments, *acked_early]
        leftovers = {s.table for s in recovered}
        if not leftovers:
            return
        progress = self.recovery = Progress.of_segments(
            "recovery", recovered, line=self._progress_line
        )
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

        async def recover(name: str) -> None:
            if name not in self._writers:
                if name in self._unloaded:
                    return
                try:
                    await self._add_writer(name, None)
                except Exception as exc:
                    self._mark_unloaded(name, None, exc)
                    return
            writer = self._writers[name]
            writer.adopt(self._spool.segments(name))
            writer.on_settled = progress.segment_done
            try:
                await self._commit_leftovers(writer)
            finally:
                writer.on_settled = None

        # Tables recover side by side (their commits queue in their lanes), each
        # failure alone; `progress` counts segments across all of them.
        await fan_out("recovering tables", sorted(leftovers), recover, limit=self._fan_limit)
        # Short of 100% when a table is degraded: its segments stay for the next try.
        progress.finish()

    async def _commit_leftovers(self, writer: TableWriter) -> None:
        # Each flush that fails by a segment's fault is one of that segment's
        # bounded attempts; retry until the bad ones are quarantined.
        attempts = SEGMENT_ATTEMPTS * max(1, len(self._spool.segments(writer.name)))
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

    def _mark_unloaded(self, name: str, table_config: TableConfig | None, exc: Exception) -> None:
        reason = f"cannot load the table: {type(exc).__name__}: {exc}"
        before = self._unloaded.get(name)
        self._unloaded[name] = (table_config, reason)
        self.metrics.table_degraded.labels(table=name).set(1)
        if before is not None and before[1] == reason:
            return  # said already; the reload round sums up who still fails
        _log.error(
            "%s: %s; its records stay spooled, the other tables serve, retrying every %.0fs",
            name,
            reason,
            _RELOAD_INTERVAL,
            extra={"table": name, "error": reason},
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
        dead_letters = any(k.dead_letter_table == name for k in self.config.kafka)
        try:
            table = await self._open_table(name, table_config, create=dead_letters)
        except Exception as exc:
            self._mark_unloaded(name, table_config, exc)
            return
        evolve = None if table_config is not None or dead_letters else self._route_policy(name)
        writer = self._register(name, table_config, table, evolve=evolve)
        del self._unloaded[name]
        self.metrics.table_degraded.labels(table=name).set(0)
        _log.info("%s: loaded; committing its spooled records", name)
        writer.adopt(self._spool.segments(name))
        writer.start()
        await self._commit_leftovers(writer)

    def _route_policy(self, name: str) -> Policy | None:
        """The evolve policy of an undeclared table: a Kafka ``auto_create`` route's
        table adds columns as when it was created; any other keeps its schema."""
        for kafka in self.config.kafka:
            if kafka.auto_create and kafka.targets([name]):
                return AUTO_CREATED
        return None

    async def replay_quarantined(self, segment_id: str) -> FlushResult:
        """Restore one quarantined segment and commit it (exactly once).

        Raises `UnknownSegmentError` / `SegmentCorruptError` (spool) when it cannot
        be restored, `CommitError` naming the reason when it still cannot be
        committed (it is back in quarantine, or still spooled for the next start).
        """
        info = await self._spool.restore(segment_id)
        writer = self._writers.get(info.table)
        if writer is None:
            try:
                writer = await self._add_writer(info.table, None)
            except Exception:
                await self._spool.quarantine(info.id, "restored, but its table cannot be loaded")
                raise
        result = await writer.replay(info)
        if info.id in result.quarantined:
            reason = next((q.reason for q in self.quarantined() if q.id == info.id), "unknown")
            raise CommitError(f"segment {info.id} still cannot be committed: {reason}")
        return result

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
        assert self._catalog is not None
        return self._catalog.load_table(name)

    # ------------------------------------------------------------------ status

    def status(self) -> dict[str, Any]:
        # Re-counts files an operator removed by hand; never raises for the directory.
        quarantine = self._watch.quarantined()
        stats = self._spool.stats()
        lanes = self._pool.stats()
        tables: dict[str, Any] = {}
        now = time.monotonic()
        for name, writer in self._writers.items():
            last = writer.last_commit
            at, since = writer.last_commit_wall, writer.last_commit_at
            tables[name] = {
                "pending_records": writer.pending_records,
                "pending_bytes": writer.pending_bytes,
                "oldest_pending_age_seconds": round(writer.oldest_pending_age(), 3),
                "spool_segments": stats.tables[name].segments if name in stats.tables else 0,
                "encode_queue": lanes[name]["pending"] if name in lanes else 0,
                "last_commit": None
                if last is None
                else {
                    "snapshot_id": last.snapshot_id,
                    "reason": last.reason,
                    "records": last.records,
                    "files": last.files,
                    "duration_ms": last.duration_ms,
                    "at": None if at is None else round(at, 3),
                    "age_seconds": None if since is None else round(max(0.0, now - since), 1),
                },
                "maintenance": self.maintenance.status(name),
            }
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
            "quarantine": {
                "segments": len(quarantine),
                "bytes": sum(q.bytes for q in quarantine),
                "listed": [
                    {
                        "id": q.id,
                        "table": q.table,
                        "bytes": q.bytes,
                        "reason": q.reason,
                        "at": round(q.at, 3),
                    }
                    for q in quarantine[:_STATUS_QUARANTINE_LIMIT]
                ],
            },
            "uptime_seconds": round(time.time() - self.started_at, 1),
            "spool": {
                "dir": str(self.config.spool.dir),
                "bytes": stats.bytes,
                "max_bytes": self.config.spool.max_bytes,
                "segments": stats.segments,
                "durability": self.config.spool.durability,
                # Quarantined files count against max_bytes (docs/guarantees.md).
                "quarantine_bytes": stats.quarantine_bytes,
                "quarantined_segments": stats.quarantined,
                # Why the spool directory cannot be read (null: it can); the figures
                # above are then the last ones read.
                "problem": self._watch.problem,
            },
            "tables": tables,
            "kafka": self._kafka_status(),
            # The last start-up recovery (null: nothing was spooled at start).
            "recovery": None if self.recovery is None else self.recovery.snapshot(),
        }

    def quarantined(self) -> list[QuarantinedSegment]:
        """The spool's quarantined segments (blocking: lists a small directory)."""
        return self._spool.quarantined()

    def degraded(self) -> dict[str, str]:
        """Tables that cannot commit now, with the reason (empty when all are fine)."""
        found = {name: reason for name, (_, reason) in self._unloaded.items()}
        for name, writer in self._writers.items():
            if writer.degraded is not None:
                found[name] = writer.degraded
        return found

    def _kafka_status(self) -> dict[str, Any]:
        sources = [s.status() for s in self._sources]
        assignments = [a for s in sources for a in s["assignments"]]
        return {
            "sources": sources,
            "assignments": [
                {"topic": a["topic"], "partition": a["partition"]} for a in assignments
            ],
            "lag": {f"{a['topic']}[{a['partition']}]": a["lag"] for a in assignments},
        }

    def totals(self) -> Totals:
        """Acked, committed and pending records over every table, and the spool's
        bytes: one pass over the writers (the systemd STATUS line asks at every tick;
        reading each table's series back from the metric registry collected the whole
        registry once per table, O(tables^2))."""
        acked = committed = pending = 0
        for writer in self._writers.values():
            acked += writer.acked_records
            committed += writer.committed_records
            pending += writer.pending_records
        return Totals(len(self._writers), acked, committed, pending, self._spool.used_bytes)

    def refresh_gauges(self) -> None:
        """Bring the readiness, spool and last-commit-age gauges up to date (on every
        /metrics scrape)."""
        # As /readyz: a catalog outage or a Kafka source down makes it 0 too.
        self.metrics.ready.set(1 if self.not_ready_reason() is None else 0)
        self._watch.quarantined()  # re-counts files an operator removed by hand
        stats = self._spool.stats()
        self.metrics.spool_bytes.set(stats.bytes)
        self.metrics.spool_quarantine_bytes.set(stats.quarantine_bytes)
        self.metrics.spool_segments.set(stats.segments)
        now = time.monotonic()
        for name, writer in self._writers.items():  # O(tables), one label lookup each
            if writer.last_commit_at is not None:
                age = self.metrics.last_commit_age.labels(table=name)
                age.set(now - writer.last_commit_at)


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
