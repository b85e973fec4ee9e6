"""One background task that maintains every table the daemon writes.

Tables wait in a heap by next due time (O(log n) per table and run; nothing scans
all tables per tick). At most ``[maintenance] concurrency`` runs go at once. A run:

1. loads the table (a Table of its own; the writer's stays the writer's),
2. resolves its settings (`resolve`), takes or renews its lease (`_lease`) - another
   replica's lease means "skipped" until the next interval,
3. runs the tasks (`Task`: expiry, and compaction / orphan removal once wired) in
   order: their commit steps in the table's lane (`RunContext.in_lane`), so they are
   serialised with the daemon's own commits of the table and never conflict with
   them; their reading, writing and deleting in this scheduler's threads
   (`RunContext.off_lane`), so ingest's threads and lanes are not held,
4. records the table's shape (snapshots, manifests, data files, metadata bytes) in
   the per-table gauges, and its outcome for /v1/status (O(1) per table to read).

Every run has a deadline (``run_timeout``, and its lease's end): blocking steps check
it between files, and the run is abandoned a little after it. A failure or timeout is
logged, counted (``icespool_maintenance_runs_total{outcome}``) and backed off per
table (`retry.Backoff`); it never reaches ingest, which goes on acking and committing.

On shutdown the scheduler stops first: runs are cut short (their threads stop at the
next check) and the leases this replica holds are released within a bounded time
(a lease not released lapses after its TTL).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import heapq
import itertools
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.table.update import ValidatableTableRequirement

from icespool.config import Config, TableConfig
from icespool.iceberg import short_error, validates_locally
from icespool.maintenance._budget import IoBudget
from icespool.maintenance._lease import Lease, LeaseHeld, acquire, release, unrenewed_for
from icespool.maintenance._orphans import FileOwner
from icespool.maintenance._settings import MaintenanceSettings, effective, resolve
from icespool.metrics import Metrics
from icespool.runtime.lanes import LanePool
from icespool.runtime.retry import Backoff

__all__ = [
    "MaintenanceScheduler",
    "RunContext",
    "RunDeadlineError",
    "TableState",
    "Task",
    "TaskResult",
    "table_shape",
]

_log = logging.getLogger("icespool.maintenance")
_T = TypeVar("_T")

# A run is abandoned this long after its deadline (at most; run_timeout when shorter):
# its blocking steps check the deadline between files, so only one stuck call (bounded
# by [timeouts]) is left.
_ABANDON_AFTER: Final = 30.0
# Failed runs of a table are retried after ~interval, then up to 8 x interval apart.
_BACKOFF_FACTOR: Final = 8
# Files and expired snapshots a table keeps for a later run at most; beyond, the
# oldest are forgotten (left in storage, unreachable; logged).
_PENDING_MAX: Final = 100_000
# Leases are released at shutdown within this (the rest lapse after their TTL).
_RELEASE_TIMEOUT: Final = 5.0
# A run asked for out of turn starts this soon (requests meanwhile ride on it).
_SOON: Final = 1.0


class RunDeadlineError(TimeoutError):
    """A run's deadline (its timeout, or its lease's end) passed before a step."""


@dataclass
class TaskResult:
    """What one task of a run did. ``error``: it did part of its work and failed the
    rest (deletions that failed and are retried next run): the run counts as failed.
    ``conflict``: another writer (Spark's rewrite or expiry, another replica) changed
    what the task planned on first; it committed nothing and is retried next run, like
    any run, without backoff (the other writer's work is done, not a fault)."""

    removed: dict[str, int] = field(default_factory=dict)
    detail: str = ""
    error: str | None = None
    delete_errors: int = 0
    conflict: bool = False
    # Files a sweep keeps because the table lost the commits that held them (None: not
    # a sweep); see `_orphans`.
    kept_files: int | None = None


def _always(settings: MaintenanceSettings) -> bool:
    return True


@dataclass(frozen=True)
class Task:
    """A maintenance task: ``run(ctx)`` unless ``wanted(settings)`` says no."""

    name: str
    run: Callable[[RunContext], Awaitable[TaskResult]]
    wanted: Callable[[MaintenanceSettings], bool] = _always


@dataclass
class TableState:
    """The scheduler's memory of one table (what /v1/status shows of it)."""

    name: str
    due: float  # monotonic
    interval: float
    failures: int = 0
    running: bool = False
    last: dict[str, Any] | None = None
    lease: Lease | None = None
    holder: tuple[str, int] | None = None  # another replica's lease: (owner, expires_ms)
    # Another replica's lease value as first seen unchanged (value, monotonic time).
    seen_lease: tuple[str, float] | None = None
    disabled: str | None = None
    defaults_applied: bool = False
    # Wall-clock span of the last run's work under its lease (from taking it to the
    # end of the last task): what "one maintainer at a time" is about.
    held: tuple[float, float] | None = None
    # What each task of the last run said it did ("expired 3 snapshots, ...").
    details: dict[str, str] = field(default_factory=dict)
    # Deletions to retry, and expired snapshots whose garbage is still to be found.
    pending_files: list[tuple[str, str]] = field(default_factory=list)
    unswept: list[Snapshot] = field(default_factory=list)
    # The running compaction's file ids (its outputs are not committed yet), and when
    # the orphan sweep last ran (monotonic).
    compacting: frozenset[str] = frozenset()
    orphans_swept: float | None = None
    # Input files a compaction plans at most, after a run ran out of time (None: the
    # default); halved on each such run, doubled back on each that fits.
    compact_max_files: int | None = None
    # The tasks of a run asked for out of turn (`MaintenanceScheduler.soon`), set from
    # the request until that run ends; a run of either kind that came due while one
    # ran waits for it to end (``waiting``).
    urgent: frozenset[str] | None = None
    waiting: set[bool] = field(default_factory=set)  # True: an urgent run, False: regular


class RunContext:
    """What a task gets: the table, its settings, the lease's requirements for its
    commits, the run's deadline, and the two ways to run blocking code."""

    def __init__(
        self,
        scheduler: MaintenanceScheduler,
        state: TableState,
        table: Table,
        settings: MaintenanceSettings,
        lease: Lease | None,
        deadline: float,
    ) -> None:
        self._scheduler = scheduler
        self.state = state
        self.name = state.name
        self.table = table
        self.settings = settings
        self.lease = lease
        self.deadline = deadline

    @property
    def requirements(self) -> tuple[ValidatableTableRequirement, ...]:
        """Add these to every commit: it lands only while this replica holds the lease."""
        return () if self.lease is None else (self.lease.requirement(),)

    def clock(self) -> float:
        """Monotonic time, or infinity once the scheduler stops (blocking steps that
        compare it with ``deadline`` stop at their next check)."""
        return math.inf if self._scheduler.stopping else time.monotonic()

    @property
    def config(self) -> Config:
        return self._scheduler.config

    @property
    def budget(self) -> IoBudget:
        """The I/O budget heavy tasks share (compaction)."""
        return self._scheduler.budget

    @property
    def declared(self) -> TableConfig | None:
        """The table's ``[[tables]]`` entry (None: a dead-letter or auto-created table)."""
        return self._scheduler.declared(self.name)

    def is_spooled(self, segment_id: str) -> bool:
        """Whether this replica's spool still holds ``segment_id`` of this table."""
        return self._scheduler.is_spooled(self.name, segment_id)

    def was_committed(self, file_name: str) -> bool:
        """Whether this process committed the data file ``file_name`` to this table."""
        return self._scheduler.was_committed(self.name, file_name)

    @property
    def files(self) -> FileOwner:
        """Whose data files are this replica's (what its writes are named by)."""
        return self._scheduler.files

    async def in_lane(self, fn: Callable[[], _T]) -> _T:
        """Run blocking ``fn`` (a commit step) in the table's lane: after the table's
        queued flushes, before later ones, never during one. Not started once the
        run's deadline passed (waiting in the lane included): RunDeadlineError."""

        def guarded() -> _T:
            if self.clock() > self.deadline:
                raise RunDeadlineError(f"{self.name}: the run's deadline passed before a commit")
            return fn()

        return await self._scheduler.in_lane(self.name, guarded)

    async def off_lane(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """Run blocking ``fn`` in a maintenance thread (reading, writing, deleting)."""
        return await self._scheduler.off_lane(fn, *args, **kwargs)


class MaintenanceScheduler:
    """Maintains the tables `add`ed to it, from `start` to `stop`."""

    def __init__(
        self,
        config: Config,
        *,
        pool: LanePool,
        metrics: Metrics,
        tasks: Sequence[Task],
        is_spooled: Callable[[str, str], bool] = lambda table, segment: False,
        was_committed: Callable[[str, str], bool] = lambda table, name: False,
    ) -> None:
        self.config = config
        self.tasks = tuple(tasks)
        # One I/O budget for every heavy step of every table (compaction's reads and
        # writes), so maintenance leaves ingest its disk and network bandwidth.
        self.budget = IoBudget(config.maintenance.io_bytes_per_second)
        self.stopping = False
        self._pool = pool
        self._metrics = metrics
        self._is_spooled = is_spooled
        self._was_committed = was_committed
        self._states: dict[str, TableState] = {}
        # [[tables]] entries by name: settings are resolved per run without a scan.
        self._declared = {t.name: t for t in config.tables}
        # (due, order, table, urgent): a regular run, or one of only the urgent tasks.
        self._heap: list[tuple[float, int, str, bool]] = []
        self._order = itertools.count()
        self._wake = asyncio.Event()
        self._runs: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self._catalog: Catalog | None = None
        self._owner = ""
        self.files = FileOwner("")
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._slots = asyncio.Semaphore(config.maintenance.concurrency)

    def declared(self, name: str) -> TableConfig | None:
        return self._declared.get(name)

    def soon(self, name: str, tasks: frozenset[str] = frozenset({"convert"})) -> None:
        """Run ``tasks`` of ``name`` within seconds, out of its turn (an upsert table
        committed equality deletes: maintenance turns them into position deletes).
        Requests before that run starts ride on it; its regular runs stay as they are."""
        state = self._states.get(name)
        if state is None or state.urgent is not None:
            return
        state.urgent = tasks
        self._push(name, time.monotonic() + _SOON, urgent=True)

    # ------------------------------------------------------------------ lifecycle

    def add(self, name: str) -> None:
        """Maintain ``name`` from now on; its first run comes after half to one interval
        (so tables loaded together spread out, and a short-lived process never runs)."""
        if name in self._states:
            return
        interval = effective(self.config, self._declared.get(name)).interval
        due = time.monotonic() + interval * random.uniform(0.5, 1.0)
        self._states[name] = TableState(name, due=due, interval=interval)
        self._push(name, due)

    async def start(self, catalog: Catalog, owner: str, files: FileOwner) -> None:
        """Begin maintaining; ``owner``: this replica's lease owner id (its spool id);
        ``files``: the incarnations whose data files are this replica's own."""
        if self._loop_task is not None:
            return
        self._catalog = catalog
        self._owner = owner
        self.files = files
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.config.maintenance.concurrency, thread_name_prefix="maintenance"
        )
        if self.config.maintenance.lease == "catalog" and not validates_locally(catalog):
            # A capability off by configuration, not a fault: a warning, and /v1/status
            # says why per table.
            _log.warning(
                "maintenance is off: a %s catalog cannot hold the maintenance lease "
                "(the daemon cannot commit to it with a compare-and-swap check of the "
                "lease); set [maintenance] lease = "
                '"none" on exactly ONE replica to maintain from it',
                self.config.catalog.type,
            )
        self._loop_task = asyncio.create_task(self._loop(), name="maintenance")

    async def stop(self, release_within: float = _RELEASE_TIMEOUT) -> None:
        """Stop scheduling, cut running runs short, release this replica's leases
        within ``release_within`` s. Idempotent."""
        if self.stopping:
            return
        self.stopping = True
        self.budget.close()  # wakes a rewrite waiting for budget
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        for run in list(self._runs):
            run.cancel()
        if self._runs:
            await asyncio.gather(*self._runs, return_exceptions=True)
        held = [s for s in self._states.values() if s.lease is not None]
        if held and self._catalog is not None:
            releases = [asyncio.ensure_future(self._release(s)) for s in held]
            _, late = await asyncio.wait(releases, timeout=release_within)
            for task in late:
                task.cancel()
            if late:
                _log.warning(
                    "%d maintenance leases not released within %.0fs; they lapse after their TTL",
                    len(late),
                    release_within,
                )
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    async def _release(self, state: TableState) -> None:
        # Even a lapsed lease: the release is a compare-and-swap on its value, so it
        # frees the table only if no one took the lease over meanwhile.
        lease, state.lease = state.lease, None
        if lease is None or self._catalog is None:
            return
        catalog = self._catalog
        try:
            await self.in_lane(state.name, lambda: release(catalog.load_table(state.name), lease))
        except Exception as exc:
            _log.warning("%s: maintenance lease not released: %s", state.name, short_error(exc))

    # ------------------------------------------------------------------ status

    def status(self, name: str) -> dict[str, Any] | None:
        """The table's maintenance state for /v1/status (O(1))."""
        state = self._states.get(name)
        if state is None:
            return None
        lease: dict[str, Any] | None = None
        if state.lease is not None:
            lease = {"holder": "this replica", "expires_at": state.lease.expires_ms / 1000}
        elif state.holder is not None:
            lease = {"holder": state.holder[0], "expires_at": state.holder[1] / 1000}
        return {
            "disabled": state.disabled,
            "running": state.running,
            "last_run": state.last,
            "next_due_in_seconds": round(max(0.0, state.due - time.monotonic()), 1),
            "consecutive_failures": state.failures,
            "lease": lease,
            "pending_deletes": len(state.pending_files),
        }

    # ------------------------------------------------------------------ running blocking code

    async def in_lane(self, name: str, fn: Callable[[], _T]) -> _T:
        # The default executor, like the writer's own commits: a maintenance thread
        # stuck in a long read must never hold a lane (and the table's ingest).
        future: asyncio.Future[_T] = self._pool.lane(name).submit(lambda: asyncio.to_thread(fn))
        return await future

    async def off_lane(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        assert self._executor is not None, "started"
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))

    def is_spooled(self, table: str, segment_id: str) -> bool:
        return self._is_spooled(table, segment_id)

    def was_committed(self, table: str, file_name: str) -> bool:
        return self._was_committed(table, file_name)

    # ------------------------------------------------------------------ the loop

    def _push(self, name: str, due: float, *, urgent: bool = False) -> None:
        heapq.heappush(self._heap, (due, next(self._order), name, urgent))
        self._wake.set()

    async def _next_due(self) -> tuple[str, bool]:
        while True:
            if self._heap:
                due, _, name, urgent = self._heap[0]
                delay = due - time.monotonic()
                if delay <= 0:
                    heapq.heappop(self._heap)
                    return name, urgent
            else:
                delay = math.inf
            self._wake.clear()
            try:
                async with asyncio.timeout(None if math.isinf(delay) else delay):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def _loop(self) -> None:
        while True:
            await self._slots.acquire()
            try:
                name, urgent = await self._next_due()
            except BaseException:
                self._slots.release()
                raise
            state = self._states[name]
            if state.running:  # one run of a table at a time: this one waits for it
                state.waiting.add(urgent)
                self._slots.release()
                continue
            run = asyncio.create_task(self._run(state, urgent), name=f"maintain-{name}")
            self._runs.add(run)
            run.add_done_callback(self._runs.discard)

    async def _run(self, state: TableState, urgent: bool = False) -> None:
        started, wall = time.monotonic(), time.time()
        state.running = True
        state.held = None
        state.details = {}
        outcome, error = "ok", None
        tasks: dict[str, str] = {}
        removed: dict[str, int] = {}
        run_timeout = effective(self.config, self._declared.get(state.name)).run_timeout
        try:
            async with asyncio.timeout(run_timeout + min(_ABANDON_AFTER, run_timeout)):
                only = state.urgent if urgent else None
                outcome, error = await self._maintain(state, started, tasks, removed, only)
        except TimeoutError:
            outcome, error = "timeout", f"abandoned after {run_timeout:g}s"
        except asyncio.CancelledError:
            outcome, error = "cancelled", "the daemon is stopping"
            raise
        except Exception as exc:
            outcome, error = "failed", short_error(exc)
        finally:
            state.running = False
            self._slots.release()
            ended = time.time()
            if urgent:
                state.urgent = None
                self._log_run(state, outcome, error, removed, wall, ended, started)
            else:
                self._finish(state, outcome, error, tasks, removed, wall, ended, started)
            for kind in sorted(state.waiting):
                self._push(state.name, time.monotonic(), urgent=kind)
            state.waiting.clear()

    def _finish(
        self,
        state: TableState,
        outcome: str,
        error: str | None,
        tasks: Mapping[str, str],
        removed: Mapping[str, int],
        wall: float,
        ended: float,
        started: float,
    ) -> None:
        now = time.monotonic()
        if outcome in ("failed", "timeout"):
            state.failures += 1
            backoff = Backoff(attempts=1, base=state.interval, cap=state.interval * _BACKOFF_FACTOR)
            delay = backoff.delay(state.failures)
            log = _log.warning
        else:
            state.failures = 0
            delay = state.interval * random.uniform(0.9, 1.1)  # keeps tables spread out
            log = _log.info if outcome == "ok" else _log.debug
        state.due = now + delay
        state.last = {
            "at": round(wall, 3),
            "outcome": outcome,
            "duration_ms": round((now - started) * 1000, 1),
            "tasks": dict(tasks),
            "details": dict(state.details),
            "removed": dict(removed),
            "error": error,
        }
        if outcome != "cancelled":
            self._push(state.name, state.due)
        if outcome == "skipped":
            self._metrics.maintenance_runs.labels(
                table=state.name, task="lease", outcome="skipped"
            ).inc()
        self._log_run(state, outcome, error, removed, wall, ended, started, log)

    def _log_run(
        self,
        state: TableState,
        outcome: str,
        error: str | None,
        removed: Mapping[str, int],
        wall: float,
        ended: float,
        started: float,
        log: Callable[..., None] | None = None,
    ) -> None:
        now = time.monotonic()
        if log is None:
            log = _log.warning if outcome in ("failed", "timeout") else _log.info
        log(
            "maintenance of %s by %s: %s in %.0f ms (started_at=%.3f ended_at=%.3f%s)%s%s%s",
            state.name,
            self._owner,
            outcome,
            (now - started) * 1000,
            wall,
            ended,
            "" if state.held is None else f" held={state.held[0]:.3f}..{state.held[1]:.3f}",
            "".join(f" {k}={v}" for k, v in removed.items() if v),
            "".join(f"; {k}: {v}" for k, v in state.details.items()),
            f": {error}" if error else "",
            extra={
                "table": state.name,
                "owner": self._owner,
                "outcome": outcome,
                "started_at": wall,
                "ended_at": ended,
                "error": error,
            },
        )

    async def _maintain(
        self,
        state: TableState,
        started: float,
        tasks: dict[str, str],
        removed: dict[str, int],
        only: frozenset[str] | None = None,
    ) -> tuple[str, str | None]:
        """One run (of the tasks named ``only``, when given); returns (outcome, error)."""
        assert self._catalog is not None
        catalog, name = self._catalog, state.name
        table = await self.off_lane(catalog.load_table, name)
        settings = resolve(
            self.config, self._declared.get(name), table.metadata.properties, name=name
        )
        state.interval = settings.interval
        lease: Lease | None = None
        outcome = "ok"
        if not settings.enabled:
            state.disabled, outcome = "maintenance = { enabled = false }", "disabled"
        elif self.config.maintenance.lease == "catalog" and not validates_locally(catalog):
            state.disabled = (
                f"a {self.config.catalog.type} catalog cannot hold the maintenance lease; "
                'set [maintenance] lease = "none" on one replica'
            )
            outcome = "disabled"
        else:
            state.disabled = None
        if outcome == "ok" and self.config.maintenance.lease == "catalog":
            got = await self._acquire(state, table, settings.lease_ttl)
            if isinstance(got, LeaseHeld):
                outcome = "skipped"
            else:
                lease = got
        errors: list[str] = []
        if outcome == "ok":
            ctx = RunContext(self, state, table, settings, lease, started + settings.run_timeout)
            held_from = time.time()
            try:
                await self._run_tasks(ctx, tasks, removed, errors, only)
            finally:
                # Nothing is committed or deleted past the deadline (each step checks
                # it just before), so that is where acting under the lease ended.
                late = max(0.0, time.monotonic() - ctx.deadline)
                state.held = (held_from, time.time() - late)
        await self._observe(name, table)
        if errors:
            return "failed", "; ".join(errors)
        return outcome, None

    async def _run_tasks(
        self,
        ctx: RunContext,
        tasks: dict[str, str],
        removed: dict[str, int],
        errors: list[str],
        only: frozenset[str] | None = None,
    ) -> None:
        run_deadline = ctx.deadline
        for task in self.tasks:
            if not task.wanted(ctx.settings) or (only is not None and task.name not in only):
                continue
            if self.stopping:
                break
            if ctx.lease is not None:
                ctx.lease = await self._renewed(ctx)
                if ctx.lease is None:
                    errors.append("lease lost to another replica")
                    break
                ctx.deadline = min(run_deadline, time.monotonic() + ctx.lease.remaining())
            began = time.monotonic()
            try:
                result = await task.run(ctx)
            except Exception as exc:
                result = TaskResult(error=short_error(exc))
                _log.debug("%s: maintenance task %s failed", ctx.name, task.name, exc_info=True)
            outcome = "failed" if result.error else "conflict" if result.conflict else "ok"
            tasks[task.name] = outcome
            if result.detail:
                ctx.state.details[task.name] = result.detail
            self._metrics.maintenance_runs.labels(
                table=ctx.name, task=task.name, outcome=outcome
            ).inc()
            self._metrics.maintenance_duration.labels(task=task.name).observe(
                time.monotonic() - began
            )
            for kind, count in result.removed.items():
                if count:
                    removed[kind] = removed.get(kind, 0) + count
                    self._metrics.maintenance_files_removed.labels(table=ctx.name, kind=kind).inc(
                        count
                    )
            if result.kept_files is not None:
                self._metrics.maintenance_files_kept.labels(table=ctx.name).set(result.kept_files)
            if result.delete_errors:
                self._metrics.maintenance_delete_errors.labels(table=ctx.name).inc(
                    result.delete_errors
                )
            if result.error:
                errors.append(f"{task.name}: {result.error}")

    async def _renewed(self, ctx: RunContext) -> Lease | None:
        """The run's lease, renewed when less than half of its TTL is left; None when
        another replica holds it now."""
        lease = ctx.lease
        assert lease is not None
        if lease.remaining() > ctx.settings.lease_ttl / 2:
            return lease
        got = await self._acquire(ctx.state, ctx.table, ctx.settings.lease_ttl)
        return None if isinstance(got, LeaseHeld) else got

    async def _acquire(self, state: TableState, table: Table, ttl: float) -> Lease | LeaseHeld:
        """Take or renew the table's lease (in its lane); remember another replica's
        lease value, so one left unrenewed for `unrenewed_for` ends (`acquire`)."""
        seen = state.seen_lease
        overdue: list[str] = []

        def lapsed(value: str) -> bool:
            if seen is None or seen[0] != value:
                return False
            if time.monotonic() - seen[1] <= unrenewed_for(ttl):
                return False
            overdue.append(value)
            return True

        got = await self.in_lane(
            state.name, lambda: acquire(table, self._owner, ttl, lapsed=lapsed)
        )
        if isinstance(got, LeaseHeld):
            state.lease, state.holder = None, (got.holder, got.expires_ms)
            if seen is None or seen[0] != got.value:
                state.seen_lease = (got.value, time.monotonic())
            return got
        if seen is not None and overdue:
            _log.warning(
                "%s: took over the maintenance lease %r, unrenewed for %.0fs although its "
                "expiry had not come (its holder's clock ran ahead, then it stopped)",
                state.name,
                seen[0],
                time.monotonic() - seen[1],
            )
        state.lease, state.holder, state.seen_lease = got, None, None
        return got

    async def _observe(self, name: str, table: Table) -> None:
        """Set the table's shape gauges (a manifest list read and a metadata stat)."""
        try:
            shape = await self.off_lane(table_shape, table)
        except Exception as exc:
            _log.debug("%s: table shape not read: %s", name, short_error(exc))
            return
        self._metrics.set_table_shape(name, **shape)


def table_shape(table: Table) -> dict[str, int]:
    """Snapshots, live manifests, data files and metadata.json bytes of ``table`` as
    loaded (blocking: reads the current manifest list, stats the metadata file)."""
    metadata = table.metadata
    snapshot = metadata.current_snapshot()
    summary = snapshot.summary if snapshot is not None else None
    data_files = summary.get("total-data-files") if summary is not None else None
    return {
        "snapshots": len(metadata.snapshots),
        "manifests": len(snapshot.manifests(table.io)) if snapshot is not None else 0,
        "data_files": int(data_files) if data_files else 0,
        "metadata_bytes": len(table.io.new_input(table.metadata_location)),
    }
