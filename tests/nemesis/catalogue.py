"""The kinds of fault the nemesis draws from, and how each is injected and healed.

Each fault runs as one task: inject, wait its duration, heal, record. A fault cancelled
(the run heals everything at its end) heals on the way out. Faults on the same part stack
(proxies, the clock, the disk: the latest applies until healed), and whatever replaces a
slot's process takes the slot's lock, so a kill and a copy never interleave.

- kill: kill -9 a replica, start it again after the fault's seconds
- pause: SIGSTOP a replica past its Kafka session, claim and lease, then SIGCONT
- catalog_refused / _blackholed / _slow: a replica's (or every replica's) catalog link
  refuses, accepts and never answers, or slows
- catalog_answer_lost: commits reach the catalog and their answers are lost
- broker_restart: the Kafka broker killed, started again on its data
- store_errors / store_slow: the object store answers 503 to a third of the requests,
  or slowly
- spool_full: the replica's spool volume (a tmpfs) filled to the last byte
- spool_read_only: the spool's file system refuses every change (EROFS; EIO one time
  in three)
- clock_step: the replica's wall clock stepped hours or minutes ahead or back
  (libfaketime)
- spool_copied: the replica's spool copied: started in its place after a kill, or
  beside it (refused)
- old_spool_restored: a snapshot of the spool taken now, restored after a kill seconds
  later (what the replica acked meanwhile and did not commit is lost with its disk)
- outside_expiry: pyiceberg expires every snapshot older than 2 s
- outside_compaction: pyiceberg rewrites a few files of an append table as one

The daemon's own maintenance runs every 4 s on every table (compaction, expiry with a
20 s retention, orphan files), so every fault meets it at some point of a run.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from support.daemon_harness import Daemon
from support.proxy import TcpProxy
from support.table_reader import append_ids, merged_rows

from nemesis import outside
from nemesis.actors import HEARTBEAT, Quiet
from nemesis.reader import read_table
from nemesis.recorder import FaultEvent, History
from nemesis.replicas import Slot
from nemesis.world import APPEND_TABLES, EVENTS, TABLES, USERS, Servers, Warehouse

if TYPE_CHECKING:
    from nemesis.schedule import Step

__all__ = ["KINDS", "Kind", "Stage", "run_fault"]

Target = Literal["slot", "slot_or_all", "one", "table", "append_table"]


@dataclass(frozen=True)
class Kind:
    name: str
    weight: float
    seconds: tuple[float, float]
    target: Target
    variants: tuple[str, ...] = ("sql", "rest")

    def targets(self, replicas: int) -> int:
        return {
            "slot": replicas,
            "slot_or_all": replicas + 1,
            "one": 1,
            "table": len(TABLES),
            "append_table": len(APPEND_TABLES),
        }[self.target]


KINDS = (
    Kind("kill", 3.0, (0.3, 5.0), "slot"),
    Kind("pause", 1.2, (7.0, 12.0), "slot"),
    Kind("catalog_refused", 1.0, (2.0, 10.0), "slot_or_all"),
    Kind("catalog_blackholed", 1.0, (2.0, 10.0), "slot_or_all"),
    Kind("catalog_slow", 0.8, (3.0, 10.0), "slot_or_all"),
    Kind("catalog_answer_lost", 1.5, (2.0, 8.0), "slot_or_all"),
    Kind("broker_restart", 0.6, (1.0, 6.0), "one"),
    Kind("store_errors", 1.0, (3.0, 10.0), "slot_or_all"),
    Kind("store_slow", 0.8, (3.0, 10.0), "slot_or_all"),
    Kind("spool_full", 1.0, (2.0, 10.0), "slot"),
    Kind("spool_read_only", 1.0, (2.0, 8.0), "slot"),
    Kind("clock_step", 1.0, (6.0, 25.0), "slot"),
    Kind("spool_copied", 0.6, (0.0, 0.0), "slot"),
    Kind("old_spool_restored", 0.6, (10.0, 30.0), "slot"),
    Kind("outside_expiry", 1.2, (0.0, 0.0), "table"),
    Kind("outside_compaction", 0.8, (0.0, 0.0), "append_table"),
)
_CLOCK_STEPS = ("+2h", "-40m", "+20m", "-3h", "+1d", "-5m")


@dataclass
class Stage:
    """Everything a fault can touch, and where it reports."""

    slots: list[Slot]
    servers: Servers
    warehouse: Warehouse
    history: History
    quiet: Quiet
    root: Path
    violations: list[str] = field(default_factory=list)
    broker_down: int = 0
    broker_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def targets(self, step: Step) -> list[Slot]:
        """The slot a step names, or every slot for the "all" target."""
        if step.target >= len(self.slots):
            return list(self.slots)
        return [self.slots[step.target]]


async def run_fault(stage: Stage, step: Step) -> None:
    """Inject ``step``'s fault, wait, heal it, record it."""
    started = stage.history.now()
    detail: list[str] = []
    print(f"nemesis fault: {step.text()}", flush=True)
    try:
        await _FAULTS[step.kind](stage, step, detail)
    finally:
        target = "all" if step.target >= len(stage.slots) else str(step.target)
        event = FaultEvent(step.kind, target, started, stage.history.now(), " ".join(detail))
        stage.history.faults.append(event)


async def _hold(seconds: float) -> None:
    await asyncio.sleep(seconds)


# ------------------------------------------------------------------ processes


async def _kill(stage: Stage, step: Step, detail: list[str]) -> None:
    slot = stage.slots[step.target]
    async with slot.lock:
        slot.held_down += 1
        slot.kill()
    try:
        await _hold(step.seconds)
    finally:
        async with slot.lock:
            slot.held_down -= 1
            if not slot.running:
                slot.start()


async def _pause(stage: Stage, step: Step, detail: list[str]) -> None:
    slot = stage.slots[step.target]
    async with slot.lock:
        pid = slot.pause()
    try:
        await _hold(step.seconds)
    finally:
        slot.resume(pid)


# ------------------------------------------------------------------ links


def _link_fault(which: str, fault: str) -> Callable[[Stage, Step, list[str]], Awaitable[None]]:
    async def inject(stage: Stage, step: Step, detail: list[str]) -> None:
        rng = random.Random(step.choice)
        links = [getattr(slot, which) for slot in stage.targets(step)]
        tokens = [link.push(fault, chooser=rng.random) for link in links]  # type: ignore[arg-type]
        try:
            await _hold(step.seconds)
        finally:
            for link, token in zip(links, tokens, strict=True):
                link.pop(token)
            lost = sum(getattr(link.proxy, "lost_answers", 0) for link in links)
            if fault == "lose" and lost:
                detail.append(f"{lost} answers lost so far")

    return inject


async def _broker(stage: Stage, step: Step, detail: list[str]) -> None:
    broker = stage.servers.broker
    async with stage.broker_lock:
        stage.broker_down += 1
        if stage.broker_down == 1:
            await asyncio.to_thread(broker.kill)
    try:
        await _hold(step.seconds)
    finally:
        async with stage.broker_lock:
            stage.broker_down -= 1
            if stage.broker_down == 0:
                await asyncio.to_thread(broker.restart)


# ------------------------------------------------------------------ disks and clocks


async def _spool_full(stage: Stage, step: Step, detail: list[str]) -> None:
    slot = stage.slots[step.target]
    filler = await asyncio.to_thread(slot.fill_disk)
    try:
        await _hold(step.seconds)
    finally:
        with contextlib.suppress(FileNotFoundError):
            filler.unlink()


async def _spool_read_only(stage: Stage, step: Step, detail: list[str]) -> None:
    slot = stage.slots[step.target]
    fault = "eio" if step.choice % 3 == 0 else "erofs"
    detail.append(fault)
    token = slot.disk.push(fault)
    try:
        await _hold(step.seconds)
    finally:
        slot.disk.pop(token)


async def _clock_step(stage: Stage, step: Step, detail: list[str]) -> None:
    slot = stage.slots[step.target]
    offset = _CLOCK_STEPS[step.choice % len(_CLOCK_STEPS)]
    detail.append(offset)
    token = slot.clock.push(offset)
    try:
        await _hold(step.seconds)
    finally:
        slot.clock.pop(token)


# ------------------------------------------------------------------ copies and restores


async def _spool_copied(stage: Stage, step: Step, detail: list[str]) -> None:
    slot = stage.slots[step.target]
    async with slot.lock:
        # Beside it only once it holds the spool's claim: two copies starting together
        # race for the claim, and either may win (the other exits, rightly).
        if step.choice % 2 == 0 or not slot.holds_claim():
            detail.append("in its place")
            slot.held_down += 1
            try:
                slot.kill()
                await asyncio.to_thread(slot.copy_spool_to_new_home)
            finally:
                slot.held_down -= 1
                slot.start()
            return
        detail.append("beside it")
        await _copy_beside(stage, slot)


async def _copy_beside(stage: Stage, slot: Slot) -> None:
    """A copy of a running replica's spool started beside it must refuse to start."""
    copy = Daemon(await asyncio.to_thread(slot.copy_spool_aside))
    copy.start()
    try:
        status = await copy.wait_exit(30)
        if status == 0 or "is held by incarnation" not in copy.log():
            stage.violations.append(
                f"a copy of {slot.name}'s spool started beside it: {copy.tail()}"
            )
    except AssertionError:
        stage.violations.append(f"a copy of {slot.name}'s spool ran beside it: {copy.tail()}")
    finally:
        copy.cleanup()


async def _old_spool_restored(stage: Stage, step: Step, detail: list[str]) -> None:
    slot = stage.slots[step.target]
    snapshot = stage.root / f"snapshot-{slot.name}-{step.at:.0f}"
    async with slot.lock, stage.quiet.slot(slot.index):
        since = stage.history.now()
        await asyncio.to_thread(slot.snapshot_spool, snapshot)
    try:
        await _hold(step.seconds)
    finally:
        async with slot.lock:
            slot.held_down += 1
            try:
                slot.kill()
                lost = await _lost_with_the_disk(stage, slot, since)
                detail.append(lost)
                await asyncio.to_thread(slot.restore_to_new_home, snapshot)
            finally:
                slot.held_down -= 1
                slot.start()


async def _lost_with_the_disk(stage: Stage, slot: Slot, since: float) -> str:
    """What ``slot`` acked after ``since`` and the table does not hold now: lost with a
    disk replaced by a snapshot taken at ``since``."""
    if isinstance(slot.catalog.proxy, TcpProxy):
        slot.catalog.proxy.mode = "reset"  # what the dead process sent goes nowhere now
        slot.catalog._apply()
    await asyncio.sleep(3.0)  # a delayed REST request of the dead process lands, or not
    history = stage.history
    catalog = await asyncio.to_thread(stage.warehouse.catalog)
    held = await read_table(append_ids, catalog, EVENTS)
    acked = history.acked.get(EVENTS, {})
    lost = [i for i, (at, who) in acked.items() if who == slot.name and at > since and not held[i]]
    history.lost.setdefault(EVENTS, set()).update(lost)
    merged = await read_table(merged_rows, catalog, USERS)
    heartbeat = merged.rows.get(HEARTBEAT + slot.index)
    committed = int(heartbeat["seq"]) if heartbeat else 0
    mine = [b for b in history.batches if b.slot == slot.index and b.acked_at is not None]
    before = max(
        (b.number for b in mine if b.acked_at is not None and b.acked_at <= since), default=0
    )
    gone = [b for b in mine if b.number > max(committed, before)]
    for batch in gone:
        batch.lost = True
    return f"{len(lost)} {EVENTS} records and {len(gone)} {USERS} requests lost"


# ------------------------------------------------------------------ the outside writer


async def _outside_expiry(stage: Stage, step: Step, detail: list[str]) -> None:
    catalog = await asyncio.to_thread(stage.warehouse.catalog)
    table = TABLES[step.target]
    detail.append(f"{table}: {await asyncio.to_thread(outside.expire, catalog, table)}")


async def _outside_compaction(stage: Stage, step: Step, detail: list[str]) -> None:
    catalog = await asyncio.to_thread(stage.warehouse.catalog)
    table = APPEND_TABLES[step.target]
    rng = random.Random(step.choice)
    detail.append(f"{table}: {await asyncio.to_thread(outside.compact, catalog, table, rng)}")


_FAULTS: dict[str, Callable[[Stage, Step, list[str]], Awaitable[None]]] = {
    "kill": _kill,
    "pause": _pause,
    "catalog_refused": _link_fault("catalog", "refuse"),
    "catalog_blackholed": _link_fault("catalog", "blackhole"),
    "catalog_slow": _link_fault("catalog", "slow"),
    "catalog_answer_lost": _link_fault("catalog", "lose"),
    "broker_restart": _broker,
    "store_errors": _link_fault("store", "errors"),
    "store_slow": _link_fault("store", "slow"),
    "spool_full": _spool_full,
    "spool_read_only": _spool_read_only,
    "clock_step": _clock_step,
    "spool_copied": _spool_copied,
    "old_spool_restored": _old_spool_restored,
    "outside_expiry": _outside_expiry,
    "outside_compaction": _outside_compaction,
}
assert set(_FAULTS) == {k.name for k in KINDS}
