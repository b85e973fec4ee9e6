"""Model test: random spool histories on a disk that fails at random (issue 11).

Hypothesis draws a sequence of appends, seals, consumes (read + delete, what a
commit does), crashes (kill -9; in fsync mode also a power loss that keeps only
synced bytes) and clean reopens, while the file system injects ENOSPC, EIO,
short and torn writes into every write, fsync, fdatasync, ftruncate, rename,
open and unlink, recovery included. The model records which appends were
ACKED. At the end the disk is repaired, the spool reopened and drained, and:

- every acked batch was read exactly once from a verified segment;
- nothing was read that was never appended, and no batch twice;
- nothing was quarantined (impossible for acked data under these faults);
- opening (recovery) never raised, and no call raised anything but the
  spool's retriable errors.

Examples: ICESPOOL_FAULT_EXAMPLES (default 200, about 15 s on a loaded 2-core
box); raise it for a longer hunt, e.g. ICESPOOL_FAULT_EXAMPLES=2000.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.faulty_fs import FAULTS, Fault, FaultyFileSystem, crash
from support.spool_helpers import batch

from icespool.spool import AppendAck, Durability, Spool, SpoolIOError

TABLES = ("ns.a", "ns.b")
EXAMPLES = int(os.environ.get("ICESPOOL_FAULT_EXAMPLES", "200"))

_op = st.one_of(
    st.tuples(st.just("append"), st.sampled_from(TABLES), st.integers(1, 4)),
    st.tuples(st.just("seal"), st.sampled_from(TABLES), st.just(0)),
    st.tuples(st.just("consume"), st.sampled_from(TABLES), st.just(0)),
    st.tuples(st.just("crash"), st.just(""), st.just(0)),
    st.tuples(st.just("close"), st.just(""), st.just(0)),
)


@dataclass
class _Model:
    attempted: set[int] = field(default_factory=set)
    acked: set[int] = field(default_factory=set)
    read: Counter[int] = field(default_factory=Counter)
    consumed: set[str] = field(default_factory=set)  # segment ids committed
    next_id: int = 0


async def _append(spool: Spool, model: _Model, table: str, count: int) -> None:
    ids = list(range(model.next_id, model.next_id + count))
    model.next_id += count
    model.attempted.update(ids)
    tasks = []
    for n in ids:
        tasks.append(asyncio.ensure_future(spool.append(table, batch(n, rows=2), {"n": n})))
        if n % 2:
            await asyncio.sleep(0)  # let a write start: the next append is its own group
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    for n, outcome in zip(ids, outcomes, strict=True):
        if isinstance(outcome, AppendAck):
            model.acked.add(n)
        elif not isinstance(outcome, SpoolIOError):
            raise outcome  # only the retriable disk error may refuse an append


async def _consume(spool: Spool, model: _Model, table: str) -> None:
    """Read and delete every sealed segment once, as a commit does (idempotently)."""
    for info in spool.segments(table):
        if info.id not in model.consumed:
            data = await spool.read(info.id)  # SegmentCorruptError fails the test
            model.read.update(int(m["n"]) for m in data.metas)  # type: ignore[call-overload,index]
            model.consumed.add(info.id)
        # On failure it stays: the next consume (or start) finds it already committed.
        with contextlib.suppress(SpoolIOError):
            await spool.delete(info.id)


async def _history(
    directory: Path, durability: Durability, ops: list[tuple[str, str, int]], seed: int, rate: float
) -> None:
    fs = FaultyFileSystem()
    rng = random.Random(seed)

    def chooser(op: str) -> Fault | None:
        return rng.choice(FAULTS) if rng.random() < rate else None

    model = _Model()

    async def opened() -> Spool:
        spool = Spool(directory, durability=durability, fs=fs, io_threads=1)
        await spool.open()  # recovery under faults: must never raise
        assert spool.recovered.quarantined == [], spool.recovered.quarantined
        return spool

    spool = await opened()  # the first start writes the spool id on a sound disk
    fs.chooser = chooser
    for op, table, count in ops:
        if op == "append":
            await _append(spool, model, table, count)
        elif op == "seal":
            with contextlib.suppress(SpoolIOError):
                await spool.seal(table)
        elif op == "consume":
            await _consume(spool, model, table)
        elif op == "crash":
            await crash(spool)
            if durability == "fsync":
                fs.power_loss(directory)  # fsync mode promises survival of this too
            spool = await opened()
        else:
            await spool.close()
            spool = await opened()
    fs.quiet()  # the disk is repaired
    await crash(spool)
    if durability == "fsync":
        fs.power_loss(directory)
    spool = await opened()
    for table in TABLES:
        await _consume(spool, model, table)
    assert spool.quarantined() == []
    await spool.close()

    twice = sorted(n for n, times in model.read.items() if times > 1)
    assert not twice, f"read more than once: {twice}"
    lost = sorted(model.acked - set(model.read))
    assert not lost, f"acked but never read: {lost} (injected: {fs.injected})"
    invented = sorted(set(model.read) - model.attempted)
    assert not invented, f"read but never appended: {invented}"


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    durability=st.sampled_from(["page-cache", "fsync"]),
    ops=st.lists(_op, min_size=1, max_size=24),
    seed=st.integers(0, 2**32 - 1),
    rate=st.sampled_from([0.0, 0.05, 0.2, 0.5]),
)
def test_acked_batches_survive_any_disk_fault_exactly_once(
    tmp_path_factory: pytest.TempPathFactory,
    durability: Durability,
    ops: list[tuple[str, str, int]],
    seed: int,
    rate: float,
) -> None:
    directory = tmp_path_factory.mktemp("spool")
    asyncio.run(_history(directory, durability, ops, seed, rate))
