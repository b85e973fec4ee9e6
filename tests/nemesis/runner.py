"""One nemesis run: start the replicas, write while the schedule's faults come and go, heal
everything, drain, check.

1. The replicas start on an empty catalog; the writers start.
2. For the run's seconds, each step of the schedule starts its fault at its time; a
   supervisor restarts a replica that ended by itself (and records it: a crash).
3. At the end every fault still active is healed; the writers go on until every table
   committed again (the time to resume after the last heal) or the bound passed.
4. The writers stop; every replica flushes every table until the spools are empty and the
   Kafka tables hold their topics' logs whole ("nothing acked left only in a spool").
5. A calm round: records written and committed with no fault, the replicas' metrics read
   before and after (acked = committed = what the table gained).
6. The tables are read without the daemon's code and checked (`checker`); the replicas
   stop with SIGTERM and must exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from support.kafka_harness import create_topic, unique_name
from support.table_reader import append_ids, merged_rows

from nemesis.actors import CommitWatcher, HttpAppends, HttpChanges, KafkaWrites, Quiet
from nemesis.catalogue import Stage, run_fault
from nemesis.checker import (
    Verdict,
    changes_by_key,
    check_appends,
    check_upserts,
    keyed_model,
    resume_times,
    users_model,
)
from nemesis.reader import read_table, topic_log
from nemesis.recorder import Exit, History
from nemesis.replicas import Slot, SlotSettings, readyz
from nemesis.schedule import describe, draw_rounds
from nemesis.world import (
    EVENTS,
    KAFKA_PARTITIONS,
    KEYED,
    STREAM,
    TABLES,
    USERS,
    Servers,
    Variant,
    Warehouse,
    group_of,
    table_config,
)

__all__ = ["Report", "RunConfig", "run"]

_READY_WITHIN = 120.0
# A drain fails once nothing left the spools for _DRAIN_STALL seconds (a loaded machine
# commits slowly, which is no loss), or after _DRAIN_WITHIN in all.
_DRAIN_STALL = 120.0
_DRAIN_WITHIN = 600.0


@dataclass(frozen=True)
class RunConfig:
    # One seed's schedule after the other's, each ``seconds`` long.
    seeds: tuple[int, ...]
    seconds: float
    variant: Variant = "sql"
    replicas: int = 3
    # Seconds within which every table must commit again once every fault is healed.
    resume_bound: float = 90.0


@dataclass
class Report:
    config: RunConfig
    schedule: str
    verdict: Verdict
    faults: Counter[str] = field(default_factory=Counter)
    wall_seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return not self.verdict.failures

    def text(self) -> str:
        config = self.config
        seeds = ",".join(map(str, config.seeds))
        lines = [
            f"nemesis seeds={seeds} variant={config.variant} replicas={config.replicas} "
            f"seconds={config.seconds:g} each: {'PASSED' if self.passed else 'FAILED'} "
            f"({self.wall_seconds:.0f} s of wall time)",
            "faults injected: "
            + ", ".join(f"{kind} {n}" for kind, n in sorted(self.faults.items())),
            *self.verdict.lines,
            f"replay: make nemesis SEED={seeds} SECONDS={config.seconds:g} "
            f"VARIANT={config.variant}",
        ]
        if not self.passed:
            lines += ["schedule:", self.schedule]
        return "\n".join(lines)


def _say(began: float, text: str) -> None:
    print(f"nemesis {time.monotonic() - began:7.1f}s: {text}", flush=True)


async def run(config: RunConfig, servers: Servers, root: Path) -> Report:
    began = time.monotonic()
    steps = draw_rounds(config.seeds, config.seconds, config.replicas, config.variant)
    report = Report(config, describe(steps), Verdict())
    history = History()
    warehouse = await asyncio.to_thread(Warehouse.create, servers, config.variant)
    bootstrap = servers.broker.bootstrap
    stream, keyed = unique_name("nem-stream"), unique_name("nem-keyed")
    for topic in (stream, keyed):
        await create_topic(bootstrap, topic, KAFKA_PARTITIONS)
    first, extra = table_config(stream, keyed, bootstrap)
    lease = "catalog" if config.variant == "sql" else "none"
    settings = SlotSettings(first, extra, lease)
    slots = [Slot(i, root / f"r{i}", warehouse, settings) for i in range(config.replicas)]
    stage = Stage(slots, servers, warehouse, history, Quiet(), root)
    rng = random.Random(config.seeds[0])
    try:
        for slot in slots:
            slot.new_home()
            slot.start()
        await asyncio.gather(*(slot.wait_ready(_READY_WITHIN) for slot in slots))
        _say(began, f"{len(slots)} replicas ready; {len(steps)} faults to come")
        writers_stop, watch_stop = asyncio.Event(), asyncio.Event()
        appends = HttpAppends(slots, history, stage.quiet, random.Random(rng.random()))
        changes = HttpChanges(slots, history, stage.quiet, random.Random(rng.random()))
        kafka = KafkaWrites(bootstrap, stream, keyed, history, random.Random(rng.random()))
        writers = [
            asyncio.create_task(appends.run(writers_stop)),
            asyncio.create_task(changes.run(writers_stop)),
            asyncio.create_task(kafka.run(writers_stop)),
        ]
        watchers = [
            asyncio.create_task(CommitWatcher(warehouse, history).run(watch_stop)),
            asyncio.create_task(_supervise(slots, history, watch_stop)),
        ]
        faults = await _play(stage, steps, config.seconds * len(config.seeds))
        report.faults = history.fault_counts()
        _say(began, "every fault healed")
        await _ready(slots)
        _say(began, "every replica ready")
        await _await_resume(history, config.resume_bound)
        writers_stop.set()
        await asyncio.wait_for(asyncio.gather(*writers), 120)
        _say(began, "writers stopped; draining")
        await _drain(slots, warehouse, stream, keyed, report.verdict)
        _say(began, "drained; a calm round")
        await _calm_round(slots, warehouse, appends, report.verdict)
        watch_stop.set()
        await asyncio.gather(*watchers)
        _say(began, "checking")
        await _check(stage, stream, keyed, report.verdict, config)
        for slot in slots:
            status = await slot.stop()
            if status not in (0, None):
                report.verdict.fail(
                    f"{slot.name} exited {status} on SIGTERM: {slot.daemon and slot.daemon.tail()}"
                )
        for slot in slots:
            if left := slot.spool_files():
                report.verdict.fail(f"{slot.name}'s spool still holds {[p.name for p in left]}")
        assert not faults or all(task.done() for task in faults)
    finally:
        for slot in slots:
            slot.close()
        await asyncio.to_thread(warehouse.drop)
    report.wall_seconds = time.monotonic() - began
    return report


async def _play(stage: Stage, steps: list[Any], seconds: float) -> list[asyncio.Task[None]]:
    """Start each step's fault at its time; at the end cancel what is still active (each
    heals on its way out) and wait for it."""
    started = time.monotonic()
    tasks: list[asyncio.Task[None]] = []
    for step in steps:
        await asyncio.sleep(max(0.0, started + step.at - time.monotonic()))
        tasks.append(asyncio.create_task(run_fault(stage, step)))
    await asyncio.sleep(max(0.0, started + seconds - time.monotonic()))
    for task in tasks:
        task.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for step, result in zip(steps, results, strict=True):
        if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
            stage.violations.append(f"fault {step.text()} failed: {result!r}")
    return tasks


async def _supervise(slots: list[Slot], history: History, stop: asyncio.Event) -> None:
    """Restart a replica that ended by itself (as systemd's Restart=always would)."""
    while not stop.is_set():
        for slot in slots:
            daemon = slot.daemon
            if slot.held_down or slot.lock.locked() or daemon is None or slot.running:
                continue
            async with slot.lock:
                if slot.held_down or slot.running or daemon.proc is None:
                    continue
                history.exits.append(
                    Exit(slot.name, history.now(), daemon.proc.returncode, daemon.tail(60))
                )
                await asyncio.sleep(1.0)
                slot.start()
        await asyncio.sleep(0.5)


async def _ready(slots: list[Slot]) -> None:
    """Every slot's process running and ready (the supervisor restarts crashed ones)."""
    deadline = time.monotonic() + _READY_WITHIN
    async with aiohttp.ClientSession() as session:
        for slot in slots:
            while not (slot.url and await readyz(session, slot.url)):
                if time.monotonic() > deadline:
                    tail = slot.daemon.tail() if slot.daemon else "never started"
                    raise AssertionError(f"{slot.name} is not ready after the heal:\n{tail}")
                await asyncio.sleep(0.5)


async def _await_resume(history: History, bound: float) -> None:
    """Until every table committed after the last heal, or ``bound`` seconds."""
    healed = max((f.healed or f.started for f in history.faults), default=history.now())
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if all(any(t >= healed for t in history.commits.get(tb, [])) for tb in TABLES):
            return
        await asyncio.sleep(0.5)


async def _each_flush(slots: list[Slot], session: aiohttp.ClientSession) -> None:
    """Flush every table on every running replica, all at once (a flush waits for its
    commit; one after the other they took most of a drain)."""

    async def flush(url: str, table: str) -> None:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with session.post(
                f"{url}/v1/tables/{table}/flush", timeout=aiohttp.ClientTimeout(total=60)
            ) as answer:
                await answer.read()

    urls = [slot.url for slot in slots if slot.url]
    await asyncio.gather(*(flush(url, table) for url in urls for table in TABLES))


async def _drain(
    slots: list[Slot], warehouse: Warehouse, stream: str, keyed: str, verdict: Verdict
) -> None:
    """Flush every table on every replica until the spools are empty and the Kafka tables
    hold their topics' logs whole."""
    began = time.monotonic()
    catalog = await asyncio.to_thread(warehouse.catalog)
    bootstrap = warehouse.servers.broker.bootstrap
    seen: tuple[list[str], list[str]] = ([], [])
    moved = began
    async with aiohttp.ClientSession() as session:
        while True:
            await _each_flush(slots, session)
            left = [f"{s.name}:{p.name}" for s in slots for p in s.spool_files()]
            behind = [
                f"{table} {topic}[{p}]"
                for table, topic in ((STREAM, stream), (KEYED, keyed))
                for p in await _behind(catalog, table, topic, bootstrap)
            ]
            if not left and not behind:
                return
            now = time.monotonic()
            if (left, behind) != seen:
                seen, moved = (left, behind), now
            if now - moved > _DRAIN_STALL or now - began > _DRAIN_WITHIN:
                verdict.fail(
                    f"not drained after {now - began:.0f} s ({now - moved:.0f} s without "
                    f"progress): spools hold {left[:5]}, Kafka tables behind on {behind}"
                )
                return
            await asyncio.sleep(2.0)


async def _behind(catalog: Any, table: str, topic: str, bootstrap: str) -> list[int]:
    """Partitions of ``topic`` whose records ``table`` does not all hold."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in range(KAFKA_PARTITIONS)]
        ends = await consumer.end_offsets(partitions)
    finally:
        await consumer.stop()
    properties = (await asyncio.to_thread(catalog.load_table, table)).properties
    group = group_of(topic)
    return [
        tp.partition
        for tp, end in ends.items()
        if end
        and properties.get(f"icespool.kafka.{group}/{topic}/{tp.partition}") != f"0-{end - 1}"
    ]


async def _metrics(slots: list[Slot], session: aiohttp.ClientSession) -> Counter[tuple[str, str]]:
    """(metric, table) -> the sum over the running replicas."""
    total: Counter[tuple[str, str]] = Counter()
    for slot in slots:
        assert slot.url is not None, slot.name
        async with session.get(f"{slot.url}/metrics") as answer:
            text = await answer.text()
        for family in text_string_to_metric_families(text):
            if family.name in ("icespool_records_acked", "icespool_records_committed"):
                for sample in family.samples:
                    if sample.name.endswith("_total"):
                        total[(family.name, sample.labels["table"])] += int(sample.value)
    return total


async def _calm_round(
    slots: list[Slot], warehouse: Warehouse, appends: HttpAppends, verdict: Verdict
) -> None:
    """Records written and committed with no fault: what each table gained, what the
    replicas' metrics say they acked and committed, and what was acked agree."""
    catalog = await asyncio.to_thread(warehouse.catalog)
    async with aiohttp.ClientSession() as session:
        before = await _metrics(slots, session)
        rows_before = sum((await read_table(append_ids, catalog, EVENTS)).values())
        sent = 0
        for n in range(12):
            slot = slots[n % len(slots)]
            ids = range(appends.next_id, appends.next_id + 50)
            appends.next_id += 50
            async with session.post(
                f"{slot.url}/v1/tables/{EVENTS}/records",
                data="".join(f'{{"id": {i}, "v": "calm"}}\n' for i in ids).encode(),
                headers={"Content-Type": "application/x-ndjson"},
            ) as answer:
                if answer.status != 200:
                    verdict.fail(f"calm round: {slot.name} answered {answer.status}")
                    return
            appends.history.ack(EVENTS, ids, slot.name)
            sent += len(ids)
        # Until the replicas committed what they acked (a flush answers within a bound;
        # a loaded machine commits later).
        deadline = time.monotonic() + _DRAIN_STALL
        while True:
            await _each_flush(slots, session)
            after = await _metrics(slots, session)
            key = ("icespool_records_committed", EVENTS)
            if after[key] - before[key] >= sent or time.monotonic() > deadline:
                break
            await asyncio.sleep(1.0)
    rows_after = sum((await read_table(append_ids, catalog, EVENTS)).values())
    acked = after[("icespool_records_acked", EVENTS)] - before[("icespool_records_acked", EVENTS)]
    committed = (
        after[("icespool_records_committed", EVENTS)]
        - before[("icespool_records_committed", EVENTS)]
    )
    gained = rows_after - rows_before
    verdict.say(
        f"calm round on {EVENTS}: {sent} records acked by HTTP, metrics acked {acked} and "
        f"committed {committed}, the table gained {gained}"
    )
    if not sent == acked == committed == gained:
        verdict.fail(
            f"metrics disagree with the table: sent {sent}, acked {acked}, "
            f"committed {committed}, gained {gained}"
        )


async def _check(
    stage: Stage, stream: str, keyed: str, verdict: Verdict, config: RunConfig
) -> None:
    history = stage.history
    catalog = await asyncio.to_thread(stage.warehouse.catalog)
    bootstrap = stage.servers.broker.bootstrap
    events = await read_table(append_ids, catalog, EVENTS)
    check_appends(
        verdict,
        EVENTS,
        events,
        history.acked.get(EVENTS, {}),
        history.maybe.get(EVENTS, set()),
        history.lost.get(EVENTS, set()),
    )
    stream_log = await topic_log(bootstrap, stream, KAFKA_PARTITIONS)
    import json

    logged = Counter(int(json.loads(r.value)["id"]) for r in stream_log if r.value is not None)
    acked_stream = history.acked.get(STREAM, {})
    if missing := sorted(set(acked_stream) - set(logged)):
        verdict.fail(f"the broker lost acked records (not the daemon): the first {missing[0]}")
    found = await read_table(append_ids, catalog, STREAM)
    check_appends(verdict, STREAM, found, logged, ())
    model, problems = users_model(history.batches)
    for problem in problems:
        verdict.fail(f"{USERS}: the model cannot be known: {problem}")
    users = await read_table(merged_rows, catalog, USERS)
    check_upserts(verdict, USERS, users.rows, users.doubled, model, changes_by_key(history))
    keyed_log = await topic_log(bootstrap, keyed, KAFKA_PARTITIONS)
    merged = await read_table(merged_rows, catalog, KEYED)
    check_upserts(verdict, KEYED, merged.rows, merged.doubled, keyed_model(keyed_log))
    _check_resume(history, verdict, config.resume_bound)
    for exit in history.exits:
        verdict.fail(
            f"{exit.slot} ended by itself at {exit.at:.1f}s with {exit.status}:\n{exit.tail}"
        )
    for violation in stage.violations:
        verdict.fail(violation)


def _check_resume(history: History, verdict: Verdict, bound: float) -> None:
    measured = [
        r for r in resume_times(history.faults, history.commits, TABLES) if r[2] is not None
    ]
    if not measured:
        verdict.say("resume after a heal: nothing measured")
        return
    healed, table, worst = max(measured, key=lambda r: r[2] or 0.0)
    verdict.say(
        f"resume after a heal: {len(measured)} measured, the worst {worst:.1f} s "
        f"({table}, healed at {healed:.1f} s)"
    )
    if worst is not None and worst > bound:
        verdict.fail(f"commits of {table} resumed {worst:.1f} s after the heal at {healed:.1f} s")


Runner = Callable[[RunConfig, Servers, Path], Awaitable[Report]]
