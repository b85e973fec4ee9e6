"""Work-stealing pool of async workers draining per-key FIFO lanes.

The daemon gives every Iceberg table one lane, so a table's batches are encoded
and written in the order they were flushed, while different tables proceed in
parallel. The pool knows nothing about Iceberg: a job is any zero-argument
callable returning an awaitable. CPU-heavy work inside a job (Parquet encoding)
belongs in ``asyncio.to_thread`` or an executor; while one worker awaits it,
the others keep serving lanes.

Why a wake-up cannot be lost
----------------------------
asyncio switches tasks only at ``await`` and jobs are submitted on the loop thread,
so every change to the pool's bookkeeping below happens in one uninterrupted step of
the loop thread.

* ``_claimable`` counts lanes whose queue is non-empty and that no worker
  holds; ``_ready`` holds exactly those lanes, in the order they became
  claimable. ``_refresh`` is the only code that changes either and runs after
  every change to a queue or a busy flag.
* ``_scanners`` counts workers that are certain to scan the lanes before they
  next park: parked workers already woken, plus a worker between releasing a
  lane and rescanning.
* Invariant, true whenever the loop is at an ``await``: if ``_claimable >
  _scanners`` then no worker is parked. A step that raises ``_claimable``
  calls ``_kick``, which wakes parked workers one by one, counting each as a
  scanner, until the inequality no longer holds. A worker stops counting as a
  scanner only in the step where it scans: it either claims a lane (lowering
  ``_claimable`` by the same one) or finds ``_claimable == 0`` and parks in
  that same step, so no submit can slip in between the scan and the park.

Hence claimable work always has a worker bound to reach it: a scanner, or a
worker running a job that will rescan when it releases its lane. This is the
"notify one, cascade on claim, re-check after release" discipline, made
exact by counting: unlike a single stored permit, one wake per claimable lane
cannot collapse. The cascade (``_kick`` after each claim) is kept as a second
line of defence.

Why a FIFO of claimable lanes
-----------------------------
A claim takes the lane at the head of ``_ready`` and a released lane with
more work joins its tail: round-robin over the lanes that have work, in O(1)
per claim whatever the number of lanes. (A scan over every registered lane
cost O(lanes) per claim: with thousands of idle tables and one busy one,
each of its jobs paid for all of them.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, TypedDict, TypeVar

from icespool.errors import IcespoolError

__all__ = ["Lane", "LaneClosedError", "LanePool"]

_T = TypeVar("_T")

JobDoneHook = Callable[[str, float, BaseException | None], None]
"""``on_job_done(lane_key, seconds, error)``; ``error`` is None on success."""

_log = logging.getLogger("icespool.lanes")


class LaneClosedError(IcespoolError):
    """Work was submitted to a lane that is closed or to a pool that is stopping."""


class LaneStats(TypedDict):
    """One lane's counters as returned by ``LanePool.stats()``."""

    pending: int
    queued: int
    busy: bool


class _Job:
    """A submitted job plus its pending guard.

    Every way a job can end (it ran, it raised, its future was cancelled while
    queued, close or stop dropped it) calls ``settle``; only the first call
    counts, so ``Lane.pending`` can neither leak nor be decremented twice.
    """

    __slots__ = ("_settled", "fn", "future", "lane", "started")

    def __init__(
        self, lane: Lane, fn: Callable[[], Awaitable[Any]], future: asyncio.Future[Any]
    ) -> None:
        self.lane = lane
        self.fn = fn
        self.future = future
        self.started = False
        self._settled = False

    def settle(self) -> None:
        if not self._settled:
            self._settled = True
            self.lane._job_settled()

    def on_future_done(self, future: asyncio.Future[Any]) -> None:
        # A caller that cancels a queued job is done with it: drop it now so
        # pending/queued stay exact and drained() does not wait for it.
        if future.cancelled() and not self.started:
            self.lane._drop(self)


class Lane:
    """A FIFO of jobs for one key; obtain it from ``LanePool.lane(key)``.

    Jobs run in submission order, one at a time. Not thread-safe: submit on the
    pool's event loop.
    """

    def __init__(self, pool: LanePool, key: str) -> None:
        self._pool = pool
        self._key = key
        self._queue: deque[_Job] = deque()
        self._pending = 0
        self._busy = False
        self._closed = False
        # Whether this lane is currently included in pool._claimable.
        self._counted = False
        self._quiet = asyncio.Event()
        self._quiet.set()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("busy" if self._busy else "idle")
        return f"<Lane {self._key!r} {state} pending={self._pending} queued={len(self._queue)}>"

    @property
    def key(self) -> str:
        return self._key

    @property
    def pending(self) -> int:
        """Jobs submitted and not yet finished (queued plus the one running)."""
        return self._pending

    @property
    def queued(self) -> int:
        """Jobs submitted and not yet started."""
        return len(self._queue)

    @property
    def busy(self) -> bool:
        """Whether a worker holds this lane right now."""
        return self._busy

    @property
    def closed(self) -> bool:
        return self._closed

    def submit(self, job: Callable[[], Awaitable[_T]]) -> asyncio.Future[_T]:
        """Queue ``job`` and return a future for its result.

        Call on the pool's event loop. Jobs submitted before ``start()`` run
        once the pool starts. Cancelling the future before the job starts
        removes it from the queue; once it has started the job runs to the end
        and its outcome is discarded (an encode in a thread cannot be stopped).
        Raises LaneClosedError after ``close()`` or ``LanePool.stop()``.
        """
        loop = self._pool._require_loop()
        if self._closed:
            raise LaneClosedError(
                f"encode lane {self._key!r} is closed; register the table again "
                "(LanePool.lane) once its close() has returned"
            )
        future: asyncio.Future[_T] = loop.create_future()
        item = _Job(self, job, future)
        self._queue.append(item)
        self._pending += 1
        self._quiet.clear()
        future.add_done_callback(item.on_future_done)
        self._pool._refresh(self)
        return future

    async def drained(self) -> None:
        """Return once ``pending`` is zero."""
        await self._quiet.wait()

    async def close(self, cancel_queued: bool = False) -> None:
        """Stop accepting jobs and wait until none is pending.

        The job in flight always finishes. Queued jobs run first, or with
        ``cancel_queued=True`` are dropped and their futures cancelled. Once
        this returns the key is free: ``LanePool.lane(key)`` makes a new lane.
        With queued jobs and ``cancel_queued=False`` this waits for the pool to
        run them, so the pool must be started.
        """
        self._closed = True
        if cancel_queued:
            self._cancel_queued()
        await self._quiet.wait()
        self._pool._unregister(self)

    def _cancel_queued(self) -> None:
        while self._queue:
            job = self._queue.popleft()
            job.future.cancel()
            job.settle()
        self._pool._refresh(self)

    def _drop(self, job: _Job) -> None:
        # ValueError: a worker popped it first, or close/stop already dropped it.
        with contextlib.suppress(ValueError):
            self._queue.remove(job)
        job.settle()
        self._pool._refresh(self)

    def _job_settled(self) -> None:
        self._pending -= 1
        if self._pending == 0:
            self._quiet.set()


def _log_worker_death(task: asyncio.Task[None]) -> None:
    # A dead worker silently shrinks the pool; say so when it happens, not at stop().
    if not task.cancelled() and (exc := task.exception()) is not None:
        _log.critical(
            "encode worker %s died; the pool has fewer workers", task.get_name(), exc_info=exc
        )


def _current_task_cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class LanePool:
    """Async worker tasks serving per-key FIFO lanes round-robin.

    ``workers`` is chosen by the caller; the daemon uses 2 x CPU cores (``[encode]
    workers = 0``) because a worker awaiting I/O or a thread leaves its core
    free for another worker's encode. A worker holds a lane for at most
    ``max_jobs_per_claim`` jobs, then releases it and moves on to the next lane
    with work, so one hot lane cannot starve the others. ``on_job_done`` is
    called after every job that ran, for metrics; its exceptions are logged.
    """

    def __init__(
        self,
        workers: int,
        *,
        max_jobs_per_claim: int = 1,
        on_job_done: JobDoneHook | None = None,
    ) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"encode pool needs workers >= 1, got {workers!r}")
        if (
            isinstance(max_jobs_per_claim, bool)
            or not isinstance(max_jobs_per_claim, int)
            or max_jobs_per_claim < 1
        ):
            raise ValueError(f"max_jobs_per_claim must be >= 1, got {max_jobs_per_claim!r}")
        self._size = workers
        self._max_per_claim = max_jobs_per_claim
        self._on_job_done = on_job_done
        self._loop: asyncio.AbstractEventLoop | None = None
        # Every registered lane by key, in registration order.
        self._by_key: dict[str, Lane] = {}
        # The claimable lanes in the order they became claimable (a dict as an
        # ordered set): shared by the workers, so claims go round-robin.
        self._ready: dict[Lane, None] = {}
        self._claimable = 0
        self._scanners = 0
        self._parked: deque[asyncio.Future[None]] = deque()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._stopped = False
        # Workers leave once nothing is claimable (graceful end of stop).
        self._closing = False
        # Workers leave now, even mid-lane (stop(drain=False)).
        self._aborted = False

    @property
    def workers(self) -> int:
        return self._size

    async def __aenter__(self) -> LanePool:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Leaving on an error (or a cancellation) must not wait for a backlog.
        await self.stop(drain=exc_type is None)

    async def start(self) -> None:
        """Start the workers; a second call does nothing."""
        loop = self._require_loop()
        if self._stopping:
            raise RuntimeError("this encode pool was stopped; create a new LanePool")
        if self._tasks:
            return
        self._tasks = [
            loop.create_task(self._work(), name=f"icespool-encode-{i}") for i in range(self._size)
        ]
        for task in self._tasks:
            task.add_done_callback(_log_worker_death)

    async def stop(self, drain: bool = True) -> None:
        """Close every lane and stop the workers; safe to call again or concurrently.

        ``drain=True`` runs every queued job first. ``drain=False`` cancels
        queued jobs and the workers, so jobs in flight see CancelledError; it
        may be called while a draining stop is waiting, to cut it short. A pool
        that was never started cannot drain, so its queued jobs are cancelled.
        Lanes close first, so jobs running during the drain cannot submit more.
        A worker that died of a bug re-raises its exception here.
        """
        if self._stopped:
            return
        self._stopping = True
        for lane in self._by_key.values():
            lane._closed = True
        if not drain or not self._tasks:
            self._abort()
        else:
            await asyncio.gather(*(lane.drained() for lane in list(self._by_key.values())))
        self._closing = True
        self._wake_all()
        if self._tasks:
            # wait(), not gather(): cancelling stop() must not cancel the workers.
            await asyncio.wait(self._tasks)
        self._stopped = True
        for lane in list(self._by_key.values()):
            self._unregister(lane)
        for task in self._tasks:
            if not task.cancelled() and (exc := task.exception()) is not None:
                raise exc

    def lane(self, key: str) -> Lane:
        """Return the open lane for ``key``, registering it on first use."""
        self._require_loop()
        if self._stopping:
            raise LaneClosedError(f"encode pool is stopping; cannot open lane {key!r}")
        lane = self._by_key.get(key)
        if lane is None:
            lane = Lane(self, key)
            self._by_key[key] = lane
        elif lane.closed:
            raise LaneClosedError(
                f"encode lane {key!r} is closing; await its close() before opening it again"
            )
        return lane

    def stats(self) -> dict[str, LaneStats]:
        """Per-lane counters, in registration order."""
        return {
            lane.key: LaneStats(pending=lane.pending, queued=lane.queued, busy=lane.busy)
            for lane in self._by_key.values()
        }

    # -- loop binding --------------------------------------------------------

    def _require_loop(self) -> asyncio.AbstractEventLoop:
        running = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = running
        elif self._loop is not running:
            raise RuntimeError(
                "LanePool is bound to another event loop; submit on the loop that runs it"
            )
        return running

    def _require_bound_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("LanePool has no event loop yet; register lanes on it first")
        return self._loop

    def _unregister(self, lane: Lane) -> None:
        if self._by_key.get(lane.key) is lane:
            del self._by_key[lane.key]

    # -- scheduling (see the module docstring for the wake-up argument) -------

    def _refresh(self, lane: Lane) -> None:
        claimable = bool(lane._queue) and not lane._busy
        if claimable == lane._counted:
            return
        lane._counted = claimable
        if claimable:
            self._claimable += 1
            self._ready[lane] = None
            self._kick()
        else:
            self._claimable -= 1
            del self._ready[lane]

    def _kick(self) -> None:
        while self._claimable > self._scanners and self._parked:
            waiter = self._parked.popleft()
            if not waiter.done():
                waiter.set_result(None)
                self._scanners += 1

    def _wake_all(self) -> None:
        while self._parked:
            waiter = self._parked.popleft()
            if not waiter.done():
                waiter.set_result(None)
                self._scanners += 1

    def _claim(self) -> Lane | None:
        if self._claimable == 0:
            return None
        lane = next(iter(self._ready), None)  # the head: the lane waiting longest
        if lane is not None:
            lane._busy = True
            self._refresh(lane)  # no longer claimable: it leaves _ready
            return lane
        raise RuntimeError(
            f"encode pool bookkeeping is out of sync: {self._claimable} claimable "
            "lanes counted, none found"
        )

    async def _park(self) -> None:
        waiter: asyncio.Future[None] = self._require_bound_loop().create_future()
        self._parked.append(waiter)
        try:
            await waiter
        finally:
            if waiter.done() and not waiter.cancelled():
                # _kick counted this worker as a scanner when it woke it.
                self._scanners -= 1
            else:
                # Cancelled while parked (stop): leave no dead waiter behind.
                with contextlib.suppress(ValueError):
                    self._parked.remove(waiter)

    async def _work(self) -> None:
        while not self._aborted:
            lane = self._claim()
            if lane is None:
                if self._closing:
                    return
                await self._park()
                continue
            self._kick()
            try:
                await self._serve(lane)
            except BaseException:
                self._release(lane)
                raise
            # Jobs that never suspend would otherwise let one worker run the
            # whole backlog without giving the loop back, hence the yield. The
            # lane stays held over it and is released in the same step as this
            # worker's next claim, so a lane that became claimable meanwhile is
            # ahead of it in _ready (round-robin). This worker rescans right
            # then, so it counts as a scanner: releasing a lane with more work
            # wakes a peer only if there is more than this worker can take.
            self._scanners += 1
            try:
                await asyncio.sleep(0)
            finally:
                self._release(lane)
                self._scanners -= 1

    def _release(self, lane: Lane) -> None:
        lane._busy = False
        self._refresh(lane)

    async def _serve(self, lane: Lane) -> None:
        ran = 0
        while lane._queue and ran < self._max_per_claim and not self._aborted:
            job = lane._queue.popleft()
            if job.future.done():
                # Cancelled by its caller; the done-callback has not run yet.
                job.settle()
                continue
            job.started = True
            ran += 1
            await self._run(lane, job)

    async def _run(self, lane: Lane, job: _Job) -> None:
        future = job.future
        error: BaseException | None = None
        began = time.perf_counter()
        try:
            result = await job.fn()
        except asyncio.CancelledError as exc:
            error = exc
            future.cancel()
            if self._aborted or _current_task_cancelling():
                raise
            # Otherwise the job itself ended in a cancellation (it awaited
            # something that was cancelled); that is its outcome, not ours.
        except Exception as exc:
            error = exc
            if not future.done():
                future.set_exception(exc)
        except BaseException as exc:
            # KeyboardInterrupt/SystemExit must propagate; do not strand the caller.
            error = exc
            future.cancel()
            raise
        else:
            if not future.done():
                future.set_result(result)
        finally:
            job.settle()
            self._report(lane.key, time.perf_counter() - began, error)

    def _report(self, key: str, seconds: float, error: BaseException | None) -> None:
        if self._on_job_done is None:
            return
        try:
            self._on_job_done(key, seconds, error)
        except Exception:
            _log.exception("on_job_done hook failed for encode lane %r", key)

    def _abort(self) -> None:
        self._aborted = True
        for lane in list(self._by_key.values()):
            lane._cancel_queued()
        for task in self._tasks:
            task.cancel()
