"""One ``[[kafka]]`` source: a consumer-group member feeding table writers exactly once.

Exactly-once rests on the offset ranges each table keeps in its own properties
(`icespool.kafka._offsets`), written in the same commit as the rows:

- on assignment the tables' ranges are read and the consumer seeks to the lowest
  position any of the source's tables needs (`icespool.kafka._partitions`);
- every record is dropped before the spool when its table already covers its
  offset, or when this assignment already handed it to the table (a re-read after
  backpressure);
- each spooled batch carries its rows' offsets and the range it covers; the commit
  drops rows another replica committed meanwhile and refuses to commit if the
  table changed under it (`OffsetClaims`, given to the writers as their claims);
- consumer-group offsets are committed to Kafka only from the tables' ranges, so
  they never run ahead of Iceberg (`icespool.kafka._group_offsets`).

This module is the source's life: connect (with backoff), the fetch loop, the
rebalance callbacks, reading past records the client cannot parse; the walk of one
fetch (route, create, decode and evolve through `icespool.write.ingest`, dead letters,
hand each table its rows) is `icespool.kafka._handover`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import (
    CorruptRecordException,
    KafkaError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
)

from icespool.config import KafkaConfig
from icespool.decode import Decoded
from icespool.kafka._catch_up import CatchUp
from icespool.kafka._client import (
    PROBE_TIMEOUT,
    client_options,
    group_positions,
    new_consumer,
    new_producer,
    stop_quietly,
)
from icespool.kafka._diagnose import connect_problem
from icespool.kafka._fetch import Fetch
from icespool.kafka._group_offsets import OffsetCommitter
from icespool.kafka._handover import Dead, Handover
from icespool.kafka._offsets import (
    OffsetBook,
    Ranges,
    RecordMark,
    mark_key,
    offsets_key,
    ranges_from_properties,
    resume_position,
)
from icespool.kafka._partitions import Assignment, Partition, PartitionState
from icespool.kafka._routing import Router, router_for
from icespool.kafka._topic_life import PartitionChange, Resuming, find_changes, out_of_range
from icespool.kafka._upstream._batches import getmany
from icespool.kafka._upstream._bootstrap_log import quiet_bootstrap_log
from icespool.kafka._upstream._raw_fetch import fetch_raw
from icespool.kafka._upstream._topic_ids import topic_ids
from icespool.metrics import Metrics
from icespool.runtime.fanout import CATALOG_CONCURRENCY, fan_out
from icespool.runtime.retry import Backoff
from icespool.write.ingest import Ingest
from icespool.write.writer import TableWriter

__all__ = ["KafkaSource"]

_log = logging.getLogger("icespool.kafka")
_POLL_MS = 200
#: Reconnecting to brokers that are gone: from half a second up to 30 s.
_RECONNECT = Backoff(attempts=1, base=0.5, cap=30.0)
_INIT_RETRY = 2.0
# What aiokafka raises for a record it cannot parse: CorruptRecordException from
# its Python reader or a bad CRC, UnicodeDecodeError (a ValueError) from its C reader.
_UNPARSEABLE = (CorruptRecordException, ValueError, IndexError)
_RAW_FETCH_BYTES = 4 << 20

#: One poll's records per partition, and each partition's (state, epoch) before it.
_Polled = tuple[dict[TopicPartition, list[Any]], dict[TopicPartition, tuple[Partition, int]]]
#: Reads the current properties of a table straight from the catalog (blocking).
LoadProperties = Callable[[str], Mapping[str, str]]


class KafkaSource:
    """Consume ``config``'s topics into the writers ``writer_for`` returns."""

    def __init__(
        self,
        config: KafkaConfig,
        *,
        name: str,
        ingest: Ingest,
        writer_for: Callable[[str], TableWriter],
        book_for: Callable[[str], OffsetBook],
        load_properties: LoadProperties,
        spool_has_room: Callable[[], bool],
        metrics: Metrics,
        table_names: Sequence[str],
        max_nesting_depth: int,
    ) -> None:
        self.config = config
        self.name = name
        self._ingest = ingest
        self._writer_for = writer_for
        self._load_properties = load_properties
        self._spool_has_room = spool_has_room
        self._metrics = metrics
        # [defaults]: for routes without a table yet (routing, auto_create inference).
        self._max_depth = max_nesting_depth
        self._router: Router = router_for(config, table_names, max_nesting_depth)
        self.dead_letter_table = config.dead_letter_table
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._parts = Assignment(name, metrics)
        self._handover = Handover(
            config,
            source=name,
            router=self._router,
            ingest=ingest,
            writer_for=writer_for,
            producer=lambda: self._producer,
            spool_has_room=spool_has_room,
            metrics=metrics,
            max_nesting_depth=max_nesting_depth,
        )
        self._handover.on_new_table = self._new_table
        self._book_for = book_for
        self._offsets = OffsetCommitter(
            source=name,
            group_id=config.group_id,
            tables=lambda: self.tables,
            writer_for=writer_for,
            book_for=book_for,
            metrics=metrics,
            # A round of idle-table commits holds the source's lock: at most about
            # one offset tick, however busy the encode lanes are.
            round_seconds=max(1.0, config.offset_commit_interval),
        )
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self.connected = False
        # Its series exists from the start at 0: a source that never connects is seen.
        self._metrics.kafka_connected.labels(source=name).set(0)
        self._last_tick = time.monotonic()
        self._ids_checked = time.monotonic()
        self._catch_up = CatchUp(tables=lambda: self.tables, writer_for=writer_for)
        self._init_retry_at = 0.0
        self._last_error = ""

    @property
    def tables(self) -> list[str]:
        """Every table this source writes, its dead-letter table included."""
        dead = [self.dead_letter_table] if self.dead_letter_table else []
        return [*self._router.targets, *dead]

    def consumes(self, topic: str) -> bool:
        """Whether ``topic`` is one this source reads (its list or its pattern)."""
        if topic in self.config.topics:
            return True
        pattern = self.config.topic_pattern
        # As aiokafka's pattern subscription matches: from the start of the name.
        return pattern is not None and re.match(pattern, topic) is not None

    async def redecode(self, fetch: Fetch) -> tuple[dict[str, Decoded], Dead]:
        """Route and decode ``fetch`` as if it were consumed now (dead-letter replay):
        the same walk as a live fetch, through the way in, with this source's
        format and settings. Holds the source's lock, so it never interleaves with a
        live fetch's decode (both may evolve or create tables)."""
        async with self._lock:
            return await self._handover.route_and_decode(fetch)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        quiet_bootstrap_log()
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"kafka-{self.name}")

    async def stop_fetching(self, grace: float = 10.0) -> None:
        """Stop consuming (the current fetch finishes being spooled)."""
        self._stop.set()
        if self._task is None:
            return
        try:
            async with asyncio.timeout(grace):
                await asyncio.shield(self._task)
        except TimeoutError:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def close(self) -> None:
        """After the writers' final commits: record offsets, commit them to Kafka, leave."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            if self.connected:
                try:
                    async with self._lock:
                        parts = self._parts.ready()
                        await self._offsets.advance_idle(parts)
                        await self._offsets.commit_group(consumer, parts)
                except Exception as exc:
                    _log.warning("%s: final offset commit failed: %s", self.name, exc)
            await stop_quietly(consumer)
        if self._producer is not None:
            await stop_quietly(self._producer)
            self._producer = None
        self._set_connected(False)

    # ------------------------------------------------------------------ status

    def status(self) -> dict[str, Any]:
        parts = sorted(self._parts, key=lambda p: (p.tp.topic, p.tp.partition))
        return {
            "name": self.name,
            "group_id": self.config.group_id,
            "connected": self.connected,
            "last_error": self._last_error or None,
            "assignments": [
                {
                    "topic": p.tp.topic,
                    "partition": p.tp.partition,
                    "position": p.position,
                    "committed": p.kafka_committed,
                    "lag": p.lag,
                    "paused": p.state.value == "paused",
                    "state": p.state.value,
                }
                for p in parts
            ],
        }

    # ------------------------------------------------------------------ the loop

    async def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                await self._connect()
                failures = 0
                await self._consume()
            except (KafkaError, OSError) as exc:
                problem = await connect_problem(exc, client_options(self.config))
                await self._disconnected(exc, problem)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # aiokafka raises KeyError for a refused SCRAM login: a connect problem.
                problem = await connect_problem(exc, client_options(self.config))
                if problem is None:
                    # A bug must not stop ingestion silently: log it, start over.
                    _log.exception("%s: consumer loop failed; restarting it", self.name)
                await self._disconnected(exc if problem else None, problem)
            else:
                continue
            failures += 1
            await self._sleep(_RECONNECT.delay(failures))

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stop.wait()

    async def _disconnected(self, exc: BaseException | None, problem: str | None = None) -> None:
        if exc is not None:
            self._last_error = problem or f"{type(exc).__name__}: {exc}"
            _log.warning("%s: Kafka unavailable, retrying: %s", self.name, self._last_error)
        self._set_connected(False)
        consumer, self._consumer = self._consumer, None
        self._parts.clear()
        if consumer is not None:
            await stop_quietly(consumer)

    def _set_connected(self, connected: bool) -> None:
        self.connected = connected
        self._metrics.kafka_connected.labels(source=self.name).set(1 if connected else 0)

    async def _connect(self) -> None:
        c = self.config
        self._consumer = await new_consumer(c, _Listener(self))
        if c.dead_letter != "table" and self._producer is None:
            self._producer = await new_producer(c)
        self._last_error = ""
        self._set_connected(True)
        _log.info(
            "%s: connected to %s as group %s",
            self.name,
            ",".join(c.bootstrap_servers),
            c.group_id,
            extra={"source": self.name},
        )

    async def _consume(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        # getmany() blocks while no partitions are assigned (a rejoin that cannot
        # finish without brokers), so reachability is watched by a task of its own.
        async with asyncio.TaskGroup() as group:
            watch = group.create_task(self._watch(consumer), name=f"kafka-watch-{self.name}")
            try:
                await self._fetch_loop(consumer)
            finally:
                watch.cancel()

    async def _watch(self, consumer: AIOKafkaConsumer) -> None:
        while not self._stop.is_set():
            await self._sleep(self.config.offset_commit_interval)
            await self._probe(consumer)
            if self.connected:
                await self._check_topic_ids(consumer)

    async def _fetch_loop(self, consumer: AIOKafkaConsumer) -> None:
        """Poll, then decode and spool what the poll got, partition by partition.

        The next poll reads ahead: it starts when a poll's records start being
        processed, so draining aiokafka's prefetched records (event loop) overlaps
        decoding and spooling the previous ones (worker threads). Records it drained
        before a seek of their partition (a pause, a start, a raw read) are stale:
        `_poll` notes each partition's epoch, `_current` drops them and puts the
        consumer back where the source's position says."""
        ahead: asyncio.Task[_Polled] | None = None
        try:
            while not self._stop.is_set():
                self._resume_ready(consumer)
                poll = ahead or asyncio.ensure_future(self._poll(consumer))
                ahead = None
                try:
                    fetched, seen = await poll
                except _UNPARSEABLE as exc:
                    async with self._lock:
                        await self._read_past_unparseable(consumer, exc)
                    continue
                except OffsetOutOfRangeError as exc:
                    async with self._lock:
                        handled = await self._out_of_range(consumer, exc.args[0])
                    if not handled:
                        await self._sleep(_INIT_RETRY)
                    continue
                except NoOffsetForPartitionError:
                    # A partition still waiting for the tables: the consumer asks for
                    # the group's offset of every assigned partition, paused or not.
                    # It is sought before it is fetched (`_init_partitions`).
                    async with self._lock:
                        await self._init_partitions(consumer)
                    await self._sleep(_POLL_MS / 1000)
                    continue
                if fetched and self._ids_overdue():
                    # The watch missed its ticks (this process was stopped, or starved):
                    # a topic re-created meanwhile would be fetched without an error, so
                    # its id is asked before anything fetched since is handed over.
                    await self._check_topic_ids(consumer)
                async with self._lock:
                    await self._init_partitions(consumer)
                    if fetched and not self._stop.is_set():
                        ahead = asyncio.ensure_future(self._poll(consumer))
                    for tp, records in fetched.items():
                        if records and self._current(consumer, tp, records, seen):
                            await self._process(consumer, tp, records)
                    count = sum(len(records) for records in fetched.values())
                    self._catch_up.check(consumer, self._parts, count)
                    if time.monotonic() - self._last_tick >= self.config.offset_commit_interval:
                        await self._tick(consumer)
        finally:
            if ahead is not None:
                # Drained but never processed: nothing of it was handed, and offsets
                # are only ever committed from what the tables hold.
                ahead.cancel()
                await asyncio.gather(ahead, return_exceptions=True)

    async def _poll(self, consumer: AIOKafkaConsumer) -> _Polled:
        """aiokafka's getmany, draining its prefetched records a record batch at a
        time (no Python frame per record; see icespool.kafka._upstream._batches), with
        each partition's epoch as it was before the drain."""
        seen = {part.tp: (part, part.epoch) for part in self._parts}
        return await getmany(consumer, _POLL_MS), seen

    def _current(
        self,
        consumer: AIOKafkaConsumer,
        tp: TopicPartition,
        records: Sequence[Any],
        seen: Mapping[TopicPartition, tuple[Partition, int]],
    ) -> bool:
        """Whether ``records`` of ``tp`` were drained after the partition's last seek.
        Stale ones of a fetching partition are dropped and the consumer sought back to
        the next offset to process (drained records moved its position past them)."""
        part = self._parts.get(tp)
        if part is None or part.state is not PartitionState.FETCHING:
            return False  # revoked or paused: it was sought (or is no longer ours)
        before = seen.get(tp)
        if before is not None and before[0] is part and before[1] == part.epoch:
            return True
        consumer.seek(tp, part.position if part.position is not None else records[0].offset)
        part.epoch += 1
        return False

    async def _probe(self, consumer: AIOKafkaConsumer) -> None:
        """Ask the brokers for metadata: getmany() only returns nothing when they are
        gone (aiokafka reconnects by itself), so this is how /readyz learns of it."""
        try:
            async with asyncio.timeout(PROBE_TIMEOUT):
                await consumer.topics()
        except (KafkaError, OSError, TimeoutError) as exc:
            if self.connected:
                self._last_error = (
                    f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                )
                _log.warning("%s: Kafka unreachable: %s", self.name, self._last_error)
            self._set_connected(False)
            return
        if not self.connected:
            _log.info("%s: Kafka reachable again", self.name)
        self._last_error = ""
        self._set_connected(True)

    # ------------------------------------------------------------------ assignment

    async def assigned(self, partitions: Sequence[TopicPartition]) -> None:
        consumer = self._consumer
        if consumer is None or not partitions:
            return
        async with self._lock:
            # Nothing is fetched until the tables say where to resume.
            self._parts.assign(consumer, partitions)
            await self._init_partitions(consumer)

    async def _init_partitions(self, consumer: AIOKafkaConsumer) -> None:
        """Read the tables' offsets for waiting partitions, seek, and start fetching.

        A catalog that cannot be read leaves them waiting; the fetch loop retries.
        """
        waiting = self._parts.waiting()
        if not waiting or time.monotonic() < self._init_retry_at:
            return
        tables = self.tables
        try:
            # One catalog read per table, side by side (bounded): thousands of routed
            # tables one after the other kept the partitions paused for minutes.
            loaded = await fan_out(
                "reading the tables' offsets",
                tables,
                lambda table: asyncio.to_thread(self._load_properties, table),
                limit=CATALOG_CONCURRENCY,
            )
            for outcome in loaded:
                if isinstance(outcome, Exception):
                    raise outcome
            props = {
                table: outcome
                for table, outcome in zip(tables, loaded, strict=True)
                if not isinstance(outcome, Exception)
            }
        except Exception as exc:  # catalog down or slow: retry, never guess
            self._init_retry_at = time.monotonic() + _INIT_RETRY
            _log.warning(
                "%s: cannot read committed offsets from the tables (%s: %s); partitions "
                "stay paused until the catalog answers",
                self.name,
                type(exc).__name__,
                exc,
            )
            return
        group = self.config.group_id
        committed: dict[TopicPartition, dict[str, Ranges]] = {}
        resuming: list[Resuming] = []
        for part in waiting:
            tp = part.tp
            committed[tp] = {
                t: ranges_from_properties(props[t], group, tp.topic, tp.partition) for t in tables
            }
            position = resume_position(committed[tp].values())
            marks = [
                found
                for t in tables
                if (found := RecordMark.parse(props[t].get(mark_key(group, *tp)))) is not None
            ]
            if position is not None:
                mark = max(marks, key=lambda m: m.offset) if marks else None
                resuming.append(Resuming(tp, position, mark))
        unknown = [p.tp for p in waiting if p.tp not in {r.tp for r in resuming}]
        try:
            async with asyncio.timeout(PROBE_TIMEOUT * 2):
                # Before the check: a topic re-created after it shows as a changed id.
                ids = await topic_ids(
                    consumer, sorted({p.tp.topic for p in waiting}), PROBE_TIMEOUT
                )
                changes = await find_changes(consumer, resuming, PROBE_TIMEOUT)
                group_at = await group_positions(consumer, unknown, self.config.auto_offset_reset)
        except (KafkaError, OSError, TimeoutError) as exc:
            self._init_retry_at = time.monotonic() + _INIT_RETRY
            _log.warning(
                "%s: cannot compare the partitions with the tables' offsets (%s: %s); they "
                "stay paused until Kafka answers",
                self.name,
                type(exc).__name__,
                exc,
            )
            return
        for part in waiting:
            tp = part.tp
            at = group_at.get(tp)
            part.topic_id = (ids or {}).get(tp.topic)
            change = changes.get(tp)
            if change is not None:
                if not await self._changed(tp, change, "changed under the tables"):
                    self._init_retry_at = time.monotonic() + _INIT_RETRY
                    continue  # stays waiting: tried again
                if change.kind == "recreated":
                    committed[tp] = {t: Ranges() for t in tables}
                at = change.start
            resume = self._parts.start_fetching(consumer, part, committed[tp], at)
            if change is not None and change.kind == "retention":
                part.cover_deleted()
            _log.info(
                "%s: assigned %s[%d], resuming at %s%s",
                self.name,
                tp.topic,
                tp.partition,
                resume,
                " (no table knows it: the group's offset, else auto_offset_reset)"
                if tp in group_at
                else "",
                extra={"topic": tp.topic, "partition": tp.partition},
            )

    async def _changed(self, tp: TopicPartition, change: PartitionChange, when: str) -> bool:
        """Count, log and (a re-created topic) reset the tables' offsets of ``tp``;
        False when resetting failed (the caller retries; counted once it is done)."""
        if change.kind == "recreated" and not await self._forget(tp, change.detail):
            return False
        self._metrics.kafka_partition_changes.labels(topic=tp.topic, kind=change.kind).inc()
        _log.warning(
            "%s: %s[%d] %s: %s; %s",
            self.name,
            tp.topic,
            tp.partition,
            when,
            change.detail,
            "the topic was re-created (or its log truncated): reading it from its "
            f"start, offset {change.start}"
            if change.kind == "recreated"
            else f"those records are lost to the tables; reading on at {change.start}",
            extra={"topic": tp.topic, "partition": tp.partition, "kind": change.kind},
        )
        return True

    async def _out_of_range(
        self, consumer: AIOKafkaConsumer, fetched: Mapping[TopicPartition, int]
    ) -> bool:
        """A fetch position fell out of its partition's range while it was consumed
        (records deleted before they were read, the topic re-created): say what
        happened, count it, and read on at the partition's first offset, never
        silently elsewhere. False when Kafka or the catalog did not answer: the
        partition is sought back to its position, so the next fetch fails again and
        this is tried again."""
        handled = True
        for tp, offset in fetched.items():
            part = self._parts.get(tp)
            if part is None or part.state is not PartitionState.FETCHING:
                continue  # revoked or paused meanwhile: it was sought
            position = part.position if part.position is not None else int(offset)
            try:
                async with asyncio.timeout(PROBE_TIMEOUT):
                    if await consumer.position(tp) != offset:
                        continue  # a fetch from before the source's last seek of it
                    change = await out_of_range(consumer, tp, int(offset), position)
            except (KafkaError, OSError, TimeoutError) as exc:
                _log.warning(
                    "%s: %s[%d] is out of range at offset %d and its edges cannot be read "
                    "(%s); trying again",
                    self.name,
                    *tp,
                    offset,
                    exc,
                )
                change, handled = None, False
            if change is None or not await self._changed(tp, change, "changed while read"):
                handled = handled and change is None
                consumer.seek(tp, position)
                part.epoch += 1
            elif change.kind == "recreated":
                self._read_anew(consumer, part, change.start, None)
            else:
                consumer.seek(tp, change.start)
                part.epoch += 1
                part.position = change.start
        return handled

    def _read_anew(
        self, consumer: AIOKafkaConsumer, part: Partition, start: int, topic_id: bytes | None
    ) -> None:
        """Read a re-created topic's partition from ``start`` (after `_changed`): nothing
        handed or covered of the old topic's partition is this one's."""
        fresh = self._parts.restart(consumer, part)
        fresh.topic_id = topic_id
        self._parts.start_fetching(consumer, fresh, {t: Ranges() for t in self.tables}, start)

    def _ids_overdue(self) -> bool:
        """Whether the watch's topic id check is two ticks late."""
        return time.monotonic() - self._ids_checked > 2 * self.config.offset_commit_interval

    async def _check_topic_ids(self, consumer: AIOKafkaConsumer) -> None:
        """Whether a topic was re-created under partitions this member kept through
        it (see `icespool.kafka._upstream._topic_ids`): its id is not the one seen at assignment."""
        self._ids_checked = time.monotonic()
        asked = [p for p in self._parts if p.ready]
        ids = await topic_ids(consumer, sorted({p.tp.topic for p in asked}), PROBE_TIMEOUT)
        if not ids:
            return
        async with self._lock:
            for part in asked:
                new = ids.get(part.tp.topic)
                if self._parts.get(part.tp) is not part or new is None or part.topic_id == new:
                    continue  # assigned again meanwhile (checked then), or unchanged
                if part.topic_id is None:  # read anew after an out-of-range fetch
                    part.topic_id = new
                    continue
                try:
                    async with asyncio.timeout(PROBE_TIMEOUT):
                        start = (await consumer.beginning_offsets([part.tp]))[part.tp]
                except (KafkaError, OSError, TimeoutError):
                    continue  # the next tick tries again
                change = PartitionChange(
                    "recreated",
                    int(start),
                    f"its topic's id changed from {part.topic_id.hex()} to {new.hex()}",
                )
                if await self._changed(part.tp, change, "changed while read"):
                    self._read_anew(consumer, part, change.start, new)

    async def _forget(self, tp: TopicPartition, why: str) -> bool:
        """Reset every table's offsets and mark of ``tp`` (a re-created topic) after
        committing what the spool holds: those rows keep their old offsets, which must
        not cover the new topic's records. False when a commit failed (retried)."""
        group = self.config.group_id
        keys = (offsets_key(group, *tp), mark_key(group, *tp))
        try:
            for table in self.tables:
                writer = self._writer_for(table)
                if writer.pending_records:
                    await writer.flush("topic-changed")
                self._book_for(table).withheld.pop(keys[0], None)
                await writer.update_properties(
                    lambda current: {k: "" for k in keys if current.get(k)}
                )
        except Exception as exc:
            _log.warning(
                "%s: %s[%d] (%s): resetting the tables' offsets failed, retrying: %s",
                self.name,
                tp.topic,
                tp.partition,
                why,
                exc,
            )
            return False
        return True

    async def revoked(self, partitions: Sequence[TopicPartition]) -> None:
        consumer = self._consumer
        async with self._lock:
            gone = self._parts.revoke(partitions)
            if not gone:
                return
            # Commit what we hold before another member takes these partitions over.
            flushes = [
                self._writer_for(t).flush("revoke")
                for t in self.tables
                if self._writer_for(t).pending_records
            ]
            for result in await asyncio.gather(*flushes, return_exceptions=True):
                if isinstance(result, BaseException):
                    _log.warning(
                        "%s: flush on revoke failed (the spool keeps the records; the next "
                        "owner's commits make ours drop what it commits first): %s",
                        self.name,
                        result,
                    )
            ready = [p for p in gone if p.ready]
            try:
                await self._offsets.advance_idle(ready)
                if consumer is not None:
                    await self._offsets.commit_group(consumer, ready)
            except Exception as exc:
                _log.warning("%s: offset commit on revoke failed: %s", self.name, exc)

    # ------------------------------------------------------------------ unparseable records

    async def _read_past_unparseable(self, consumer: AIOKafkaConsumer, exc: Exception) -> None:
        """aiokafka could not parse a record (a header key that is not UTF-8, a bad
        CRC): its getmany raises at that position on every call. Each fetching
        partition is read once by `fetch_raw` instead, from the next offset this
        source has not processed (which also re-reads whatever the failed getmany
        had taken from other partitions): parseable records go on as usual, the
        others become dead letters (reason ``unparseable``) with what bytes could be
        recovered and their offsets, and the consumer continues after them."""
        _log.warning(
            "%s: Kafka returned a record the client cannot parse (%s: %s); reading the "
            "partitions' raw batches to dead-letter it",
            self.name,
            type(exc).__name__,
            exc,
        )
        for part in self._parts.fetching():
            tp = part.tp
            try:
                offset = part.position
                if offset is None:
                    async with asyncio.timeout(PROBE_TIMEOUT):
                        reset = self.config.auto_offset_reset
                        offset = (await group_positions(consumer, [tp], reset))[tp]
                records, after = await fetch_raw(
                    consumer,
                    tp,
                    offset,
                    _RAW_FETCH_BYTES,
                    PROBE_TIMEOUT,
                    self.config.isolation_level,
                )
            except (KafkaError, OSError, TimeoutError) as error:
                # Back to what was processed: the failed getmany may have taken
                # records of this partition; the next round reads them again.
                _log.warning("%s: raw fetch of %s[%d] failed: %r", self.name, *tp, error)
                if part.position is not None:
                    consumer.seek(tp, part.position)
                    part.epoch += 1
                continue
            if records:
                problems = {r.offset: r.problem for r in records if r.problem is not None}
                await self._process(consumer, tp, records, problems)
            if self._parts.get(tp) is part and part.state is PartitionState.FETCHING:
                consumer.seek(tp, after)
                part.epoch += 1

    # ------------------------------------------------------------------ one fetch

    async def _process(
        self,
        consumer: AIOKafkaConsumer,
        tp: TopicPartition,
        records: Sequence[Any],
        unparseable: Mapping[int, str] | None = None,
    ) -> None:
        part = self._parts.get(tp)
        if part is None or part.state is not PartitionState.FETCHING:
            return  # revoked meanwhile, or fetched just before the pause
        fetch = Fetch.of_records(tp.topic, tp.partition, records)
        self._metrics.kafka_records.labels(topic=tp.topic).inc(len(records))
        if part.start is None:  # once per assignment: `tables` lists every table
            part.begin(int(fetch.offsets[0]), self.tables)
        if await self._handover.spool_fetch(part, fetch, unparseable):
            part.position = int(fetch.offsets[-1]) + 1
        else:
            self._parts.pause(consumer, part, int(fetch.offsets[0]))

    def _new_table(self, table: str) -> None:
        """``auto_create`` made ``table``: its coverage starts with this assignment
        (records before were not its; they went to the dead letters as unknown routes)."""
        for part in self._parts:
            if part.start is not None:
                part.handed.setdefault(table, part.start - 1)
            part.committed.setdefault(table, Ranges())

    # ------------------------------------------------------------------ backpressure

    def _resume_ready(self, consumer: AIOKafkaConsumer) -> None:
        if not self._parts.any_paused() or not self._spool_has_room():
            return
        if not all(self._writer_for(t).has_capacity() for t in self.tables):
            return
        self._parts.resume_all(consumer)

    # ------------------------------------------------------------------ offsets

    async def _tick(self, consumer: AIOKafkaConsumer) -> None:
        self._last_tick = time.monotonic()
        parts = self._parts.ready()
        try:
            await self._offsets.advance_idle(parts)
        except Exception as exc:  # the catalog is down: retried at the next tick
            _log.warning("%s: recording consumed offsets failed: %s", self.name, exc)
        await self._offsets.commit_group(consumer, parts)


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, source: KafkaSource) -> None:
        self._source = source

    async def on_partitions_revoked(self, revoked: Sequence[TopicPartition]) -> None:
        await self._source.revoked(list(revoked))

    async def on_partitions_assigned(self, assigned: Sequence[TopicPartition]) -> None:
        await self._source.assigned(list(assigned))
