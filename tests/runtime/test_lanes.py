"""Encode pool: fairness, FIFO per lane, no lost wake-ups, safe close, parallelism."""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Awaitable, Callable

import pytest
import uvloop

from icespool.runtime.lanes import Lane, LaneClosedError, LanePool

Record = tuple[str, int]


def _recorder(
    order: list[Record], running: dict[str, bool], violations: list[str], *, yields: int = 0
) -> Callable[[str, int], Callable[[], Awaitable[Record]]]:
    """Jobs that log their start and flag any overlap inside one lane."""

    def make(key: str, seq: int) -> Callable[[], Awaitable[Record]]:
        async def job() -> Record:
            if running.get(key):
                violations.append(f"{key}#{seq} started while the lane was running")
            running[key] = True
            order.append((key, seq))
            try:
                for _ in range(yields):
                    await asyncio.sleep(0)
            finally:
                running[key] = False
            return key, seq

        return job

    return make


def _round_robin(lanes: int, jobs: int) -> list[Record]:
    return [(f"t{t}", j) for j in range(jobs) for t in range(lanes)]


# -- fairness ----------------------------------------------------------------


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("yields", [0, 1, 3])
async def test_four_lanes_drain_round_robin_in_fifo_order(workers: int, yields: int) -> None:
    order: list[Record] = []
    running: dict[str, bool] = {}
    violations: list[str] = []
    make = _recorder(order, running, violations, yields=yields)
    async with LanePool(workers) as pool:
        # Lane by lane, so a FIFO over all submissions would give t0 x8 first.
        futures = [pool.lane(f"t{t}").submit(make(f"t{t}", j)) for t in range(4) for j in range(8)]
        results = await asyncio.gather(*futures)
    assert results == [(f"t{t}", j) for t in range(4) for j in range(8)]
    assert order == _round_robin(4, 8)
    assert violations == []


async def test_max_jobs_per_claim_batches_within_a_lane() -> None:
    order: list[Record] = []
    make = _recorder(order, {}, [])
    async with LanePool(1, max_jobs_per_claim=3) as pool:
        futures = [pool.lane(f"t{t}").submit(make(f"t{t}", j)) for t in range(2) for j in range(5)]
        await asyncio.gather(*futures)
    assert order == [
        ("t0", 0), ("t0", 1), ("t0", 2),
        ("t1", 0), ("t1", 1), ("t1", 2),
        ("t0", 3), ("t0", 4),
        ("t1", 3), ("t1", 4),
    ]  # fmt: skip


async def test_hot_lane_does_not_starve_a_late_lane() -> None:
    order: list[Record] = []
    make = _recorder(order, {}, [])
    async with LanePool(1) as pool:
        hot = pool.lane("hot")
        hot_futures = [hot.submit(make("hot", j)) for j in range(100)]
        await asyncio.sleep(0)  # the worker is now inside the hot lane's backlog
        await asyncio.sleep(0)
        started_before = len(order)
        late = await pool.lane("late").submit(make("late", 0))
        await asyncio.gather(*hot_futures)
    assert late == ("late", 0)
    assert 1 <= started_before < 100
    # The late lane is served right after the hot job in flight when it arrived.
    assert order.index(("late", 0)) == started_before


# -- stress: no lost wake-ups --------------------------------------------------


class _Boom(Exception):
    pass


class _Stress:
    """Checks for one stress round; jobs yield, sleep briefly or raise at random."""

    LANES = 8
    TOTAL = 1_600

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.keys = [f"ns.table{i}" for i in range(self.LANES)]
        self.submitted: dict[str, int] = dict.fromkeys(self.keys, 0)
        self.ran: dict[str, list[int]] = {k: [] for k in self.keys}
        self.running: dict[str, bool] = dict.fromkeys(self.keys, False)
        self.violations: list[str] = []
        self.raises: set[tuple[str, int]] = set()
        # Thread producers assign sequence numbers under this lock.
        self.lock = threading.Lock()

    def job(self, key: str, seq: int) -> Callable[[], Awaitable[int]]:
        roll = self.rng.random()
        action = "raise" if roll < 0.1 else "sleep" if roll < 0.13 else "yield"
        if action == "raise":
            self.raises.add((key, seq))

        async def run() -> int:
            if self.running[key]:
                self.violations.append(f"{key}#{seq}: lane already running")
            self.running[key] = True
            self.ran[key].append(seq)
            try:
                if action == "sleep":
                    await asyncio.sleep(0.0005)
                else:
                    await asyncio.sleep(0)
                if action == "raise":
                    raise _Boom(f"{key}#{seq}")
                return seq
            finally:
                self.running[key] = False

        return run

    def next_seq(self, key: str) -> int:
        seq = self.submitted[key]
        self.submitted[key] = seq + 1
        return seq

    def check(self, pool: LanePool, outcomes: list[tuple[str, int, object]]) -> None:
        assert len(outcomes) == self.TOTAL
        for key, seq, outcome in outcomes:
            if (key, seq) in self.raises:
                assert isinstance(outcome, _Boom)
                assert str(outcome) == f"{key}#{seq}"
            else:
                assert outcome == seq
        for key in self.keys:
            # FIFO per lane and every job exactly once.
            assert self.ran[key] == list(range(self.submitted[key]))
        assert sum(self.submitted.values()) == self.TOTAL
        assert self.violations == []
        assert pool.stats() == {
            key: {"pending": 0, "queued": 0, "busy": False} for key in self.keys
        }


async def _stress_tasks(workers: int, seed: int) -> None:
    state = _Stress(random.Random(seed))
    async with LanePool(workers, max_jobs_per_claim=1 + seed % 2) as pool:
        lanes = [pool.lane(key) for key in state.keys]
        submitted: list[tuple[str, int, asyncio.Future[int]]] = []

        async def producer(n: int, rng: random.Random) -> None:
            for _ in range(n):
                lane = rng.choice(lanes)
                seq = state.next_seq(lane.key)
                submitted.append((lane.key, seq, lane.submit(state.job(lane.key, seq))))
                if rng.random() < 0.3:
                    await asyncio.sleep(0)

        per_producer = state.TOTAL // 4
        async with asyncio.timeout(5):
            await asyncio.gather(
                *(producer(per_producer, random.Random(seed * 10 + p)) for p in range(4))
            )
            results = await asyncio.gather(*(f for _, _, f in submitted), return_exceptions=True)
            await asyncio.gather(*(lane.drained() for lane in lanes))
        assert all(lane.pending == 0 for lane in lanes)
        state.check(
            pool, [(key, seq, r) for (key, seq, _), r in zip(submitted, results, strict=True)]
        )


_WORKER_COUNTS = [1, 2, 3, 4, 8, 16]


async def test_stress_concurrent_producer_tasks_repeated() -> None:
    for i in range(50):
        await _stress_tasks(_WORKER_COUNTS[i % len(_WORKER_COUNTS)], seed=i)


def test_stress_on_uvloop() -> None:
    async def rounds() -> None:
        for i in range(6):
            await _stress_tasks(_WORKER_COUNTS[i % len(_WORKER_COUNTS)], seed=2000 + i)

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(rounds())


# -- close while in flight -------------------------------------------------------


def _gated(gate: asyncio.Event, log: list[str], name: str) -> Callable[[], Awaitable[str]]:
    async def job() -> str:
        log.append(name)
        await gate.wait()
        return name

    return job


def _quick(log: list[str], name: str) -> Callable[[], Awaitable[str]]:
    async def job() -> str:
        log.append(name)
        return name

    return job


async def test_close_cancelling_queued_lets_the_in_flight_job_finish() -> None:
    gate = asyncio.Event()
    log: list[str] = []
    async with LanePool(2) as pool:
        lane = pool.lane("t")
        first = lane.submit(_gated(gate, log, "a"))
        queued = [lane.submit(_quick(log, name)) for name in ("b", "c")]
        await asyncio.sleep(0.01)
        assert (lane.pending, lane.queued, lane.busy) == (3, 2, True)

        closing = asyncio.create_task(lane.close(cancel_queued=True))
        await asyncio.sleep(0)
        assert all(f.cancelled() for f in queued)
        assert (lane.pending, lane.queued) == (1, 0)
        assert not closing.done()
        with pytest.raises(LaneClosedError, match="'t' is closed"):
            lane.submit(_quick(log, "late"))
        with pytest.raises(LaneClosedError, match="closing"):
            pool.lane("t")

        gate.set()
        await closing
        assert await first == "a"
        assert log == ["a"]
        assert (lane.pending, lane.queued, lane.busy) == (0, 0, False)
        assert pool.stats() == {}
        # The key is free again once close() returned.
        again = pool.lane("t")
        assert again is not lane
        assert await again.submit(_quick(log, "d")) == "d"


async def test_close_without_cancelling_runs_queued_jobs_in_order() -> None:
    gate = asyncio.Event()
    log: list[str] = []
    async with LanePool(1) as pool:
        lane = pool.lane("t")
        futures = [lane.submit(_gated(gate, log, "a"))]
        futures += [lane.submit(_quick(log, name)) for name in ("b", "c")]
        await asyncio.sleep(0.01)
        closing = asyncio.create_task(lane.close())
        await asyncio.sleep(0)
        assert lane.pending == 3
        with pytest.raises(LaneClosedError):
            lane.submit(_quick(log, "late"))
        gate.set()
        await closing
        assert [f.result() for f in futures] == ["a", "b", "c"]
        assert log == ["a", "b", "c"]
        assert lane.pending == 0


async def test_close_while_the_in_flight_job_raises_keeps_pending_exact() -> None:
    gate = asyncio.Event()

    async def failing() -> None:
        await gate.wait()
        raise _Boom("encode failed")

    async with LanePool(1) as pool:
        lane = pool.lane("t")
        first = lane.submit(failing)
        queued = lane.submit(failing)
        await asyncio.sleep(0.01)
        closing = asyncio.create_task(lane.close(cancel_queued=True))
        await asyncio.sleep(0)
        assert queued.cancelled()
        assert lane.pending == 1
        gate.set()
        await closing
        with pytest.raises(_Boom, match="encode failed"):
            await first
        assert lane.pending == 0


async def test_close_is_idempotent_and_can_escalate_to_cancel() -> None:
    gate = asyncio.Event()
    log: list[str] = []
    async with LanePool(1) as pool:
        lane = pool.lane("t")
        first = lane.submit(_gated(gate, log, "a"))
        second = lane.submit(_quick(log, "b"))
        await asyncio.sleep(0.01)
        graceful = asyncio.create_task(lane.close())
        await asyncio.sleep(0)
        assert not second.done()
        forced = asyncio.create_task(lane.close(cancel_queued=True))
        await asyncio.sleep(0)
        assert second.cancelled()
        gate.set()
        await asyncio.gather(graceful, forced)
        await lane.close()
        assert await first == "a"
        assert log == ["a"]
        assert lane.pending == 0


async def test_cancelling_a_queued_future_drops_the_job() -> None:
    gate = asyncio.Event()
    log: list[str] = []
    async with LanePool(1) as pool:
        lane = pool.lane("t")
        first = lane.submit(_gated(gate, log, "a"))
        doomed = lane.submit(_quick(log, "b"))
        last = lane.submit(_quick(log, "c"))
        await asyncio.sleep(0.01)
        doomed.cancel()
        await asyncio.sleep(0)
        assert (lane.pending, lane.queued) == (2, 1)
        gate.set()
        assert await first == "a"
        assert await last == "c"
        await lane.drained()
        assert log == ["a", "c"]
        assert lane.pending == 0


async def test_stop_without_drain_cancels_in_flight_and_queued() -> None:
    gate = asyncio.Event()
    log: list[str] = []
    pool = LanePool(2)
    await pool.start()
    lanes = [pool.lane(f"t{i}") for i in range(3)]
    in_flight = [lane.submit(_gated(gate, log, f"{lane.key}-a")) for lane in lanes]
    queued = [lane.submit(_quick(log, f"{lane.key}-b")) for lane in lanes]
    await asyncio.sleep(0.01)
    assert [lane.busy for lane in lanes] == [True, True, False]
    await pool.stop(drain=False)
    assert all(f.cancelled() for f in in_flight + queued)
    assert [lane.pending for lane in lanes] == [0, 0, 0]
    assert sorted(log) == ["t0-a", "t1-a"]
    assert pool.stats() == {}
    await pool.stop()  # idempotent
    with pytest.raises(LaneClosedError):
        lanes[0].submit(_quick(log, "late"))
    with pytest.raises(LaneClosedError):
        pool.lane("t9")


async def test_stop_with_drain_runs_the_backlog_first() -> None:
    log: list[str] = []
    pool = LanePool(2)
    await pool.start()
    futures = [pool.lane(f"t{i % 3}").submit(_quick(log, str(i))) for i in range(30)]
    await asyncio.gather(pool.stop(), pool.stop())  # concurrent stops are safe
    assert [f.result() for f in futures] == [str(i) for i in range(30)]
    assert sorted(log, key=int) == [str(i) for i in range(30)]


async def test_jobs_submitted_before_start_run_after_start() -> None:
    log: list[str] = []
    pool = LanePool(1)
    future = pool.lane("t").submit(_quick(log, "a"))
    await asyncio.sleep(0.01)
    assert log == []
    async with pool:
        assert await future == "a"


async def test_stop_of_a_pool_never_started_cancels_its_queue() -> None:
    pool = LanePool(1)
    lane = pool.lane("t")
    future = lane.submit(_quick([], "a"))
    await pool.stop()
    assert future.cancelled()
    assert lane.pending == 0
    with pytest.raises(RuntimeError, match="stopped"):
        await pool.start()


async def test_a_raising_job_does_not_kill_its_worker() -> None:
    done: list[tuple[str, float, BaseException | None]] = []

    def hook(key: str, seconds: float, error: BaseException | None) -> None:
        done.append((key, seconds, error))

    async def boom() -> str:
        await asyncio.sleep(0)
        raise _Boom("bad batch")

    async def cancelled_inside() -> str:
        never: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        never.cancel()
        return await never

    async def ok() -> str:
        return "ok"

    async with LanePool(1, on_job_done=hook) as pool:
        lane = pool.lane("t")
        futures = [lane.submit(boom), lane.submit(cancelled_inside), lane.submit(ok)]
        other = pool.lane("u").submit(ok)
        results = await asyncio.gather(*futures, other, return_exceptions=True)
    assert isinstance(results[0], _Boom)
    assert isinstance(results[1], asyncio.CancelledError)
    assert futures[1].cancelled()
    assert results[2:] == ["ok", "ok"]
    assert [(key, type(error)) for key, _, error in done] == [
        ("t", _Boom),
        ("u", type(None)),
        ("t", asyncio.CancelledError),
        ("t", type(None)),
    ]
    assert all(seconds >= 0 for _, seconds, _ in done)


async def test_a_failing_metrics_hook_is_logged_not_fatal(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def hook(key: str, seconds: float, error: BaseException | None) -> None:
        raise RuntimeError("prometheus down")

    async def ok() -> int:
        return 1

    with caplog.at_level(logging.ERROR, logger="icespool.lanes"):
        async with LanePool(1, on_job_done=hook) as pool:
            lane = pool.lane("t")
            assert list(await asyncio.gather(lane.submit(ok), lane.submit(ok))) == [1, 1]
    assert [r.getMessage() for r in caplog.records] == [
        "on_job_done hook failed for encode lane 't'"
    ] * 2


@pytest.mark.parametrize("workers", [0, -1, True])
def test_worker_count_is_validated(workers: int) -> None:
    with pytest.raises(ValueError, match="workers >= 1"):
        LanePool(workers)


# -- parallelism -----------------------------------------------------------------


async def _timed_lanes(job: Callable[[], Awaitable[None]]) -> float:
    async with LanePool(4) as pool:
        lanes: list[Lane] = [pool.lane(f"t{i}") for i in range(4)]
        began = time.perf_counter()
        await asyncio.gather(*(lane.submit(job) for lane in lanes))
        return time.perf_counter() - began


async def test_lanes_run_in_parallel_across_workers() -> None:
    async def io_bound() -> None:
        await asyncio.sleep(0.2)

    elapsed = await _timed_lanes(io_bound)
    assert 0.2 <= elapsed < 0.6


async def test_thread_offloaded_jobs_run_in_parallel() -> None:
    async def in_thread() -> None:
        # Stands in for a Parquet encode that releases the GIL.
        await asyncio.to_thread(time.sleep, 0.2)

    elapsed = await _timed_lanes(in_thread)
    assert 0.2 <= elapsed < 0.6
