"""The partitions a source is assigned, each in one explicit state.

Invariants (the source holds its lock around every change):

- A partition is fetched only in state ``FETCHING``. Every other state keeps it
  paused in the consumer, so no record of it reaches the source.
- ``WAITING`` -> ``FETCHING`` only once the tables' offset ranges are read and the
  consumer sought to the lowest position any table needs (`Assignment.ready`).
- ``PAUSED`` (backpressure) always comes with a seek back to the first offset not
  handed to a table, so resuming re-reads exactly what was not spooled.
- ``handed[table]`` only grows within one assignment; records at or below it are
  never handed to that table again (a re-read after a pause skips them).

State changes::

    assign --> WAITING --ready--> FETCHING <--pause/resume--> PAUSED
                  revoke (any state) --> gone
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from aiokafka import AIOKafkaConsumer, TopicPartition

from icespool.kafka._offsets import Ranges, resume_position
from icespool.metrics import Metrics

__all__ = ["Assignment", "Partition", "PartitionState"]

_log = logging.getLogger("icespool.kafka")


class PartitionState(enum.Enum):
    WAITING = "waiting"  # assigned; paused until the tables say where to resume
    FETCHING = "fetching"  # sought to the resume position; records flow
    PAUSED = "paused"  # backpressure; sought back to the first offset not spooled


@dataclass(slots=True)
class Partition:
    tp: TopicPartition
    state: PartitionState = PartitionState.WAITING
    start: int | None = None  # first offset this assignment processed
    position: int | None = None  # next offset to process
    handed: dict[str, int] = field(default_factory=dict)  # table -> last offset covered
    committed: dict[str, Ranges] = field(default_factory=dict)  # per table, at assignment
    kafka_committed: int | None = None  # what the group holds (for lag tooling)
    lag: int | None = None
    # Bumped by every seek the source makes: records a poll drained before one are
    # not where the consumer now is (see KafkaSource._fetch_loop's read-ahead).
    epoch: int = 0
    # The topic's id (Kafka 2.8+) when the partition was checked: another one later
    # means the topic was re-created under it (`icespool.kafka._upstream._topic_ids`).
    topic_id: bytes | None = None

    @property
    def ready(self) -> bool:
        return self.state is not PartitionState.WAITING

    def begin(self, offset: int, tables: Iterable[str]) -> None:
        """The first record of this assignment is at ``offset`` (the group's position,
        when no table knew the partition)."""
        if self.start is None:
            self.start = offset
            for table in tables:
                self.handed.setdefault(table, offset - 1)

    def fresh(self, key: str, offsets: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """Which ``offsets`` ``key`` (a table, or the dead-letter topic) has not got yet:
        neither handed over in this assignment nor held by the table."""
        held = self.committed.get(key, Ranges()).mask(offsets)
        fresh: npt.NDArray[np.bool_] = (offsets > self.handed.get(key, -1)) & ~held
        return fresh

    def hand(self, key: str, last: int) -> None:
        self.handed[key] = max(self.handed.get(key, -1), last)

    def cover_deleted(self) -> None:
        """The records before ``start`` were deleted before any table read them (after
        `Assignment.start_fetching` at the partition's first offset): each table's
        first claim, and the range idle tables record, reach back to where that table
        stopped, so its ranges close over the deleted offsets and the next start does
        not find them missing again."""
        if self.start is None:
            return
        for table, ranges in self.committed.items():
            stopped = ranges.next_position()
            if stopped is not None and stopped < self.start:
                self.handed[table] = min(self.handed.get(table, stopped - 1), stopped - 1)
                self.start = min(self.start, stopped)

    def consumed(self) -> Ranges:
        """What this assignment has processed (empty before its first record)."""
        if self.start is None or self.position is None or self.position <= self.start:
            return Ranges()
        return Ranges.of([(self.start, self.position - 1)])


class Assignment:
    """This member's partitions. Caller: `KafkaSource`, under its lock."""

    def __init__(self, source: str, metrics: Metrics) -> None:
        self._source = source
        self._metrics = metrics
        self._parts: dict[TopicPartition, Partition] = {}

    def __iter__(self) -> Iterator[Partition]:
        return iter(list(self._parts.values()))

    def get(self, tp: TopicPartition) -> Partition | None:
        return self._parts.get(tp)

    def clear(self) -> None:
        self._parts.clear()
        self._gauge()

    def assign(self, consumer: AIOKafkaConsumer, tps: Sequence[TopicPartition]) -> None:
        """Affects: new partitions WAITING, paused in the consumer."""
        for tp in tps:
            consumer.pause(tp)
            self._parts[tp] = Partition(tp)

    def revoke(self, tps: Sequence[TopicPartition]) -> list[Partition]:
        gone = [self._parts.pop(tp) for tp in tps if tp in self._parts]
        for part in gone:
            if part.lag is not None:
                self._metrics.kafka_lag.remove(part.tp.topic, str(part.tp.partition))
        self._gauge()
        return gone

    def waiting(self) -> list[Partition]:
        return [p for p in self._parts.values() if p.state is PartitionState.WAITING]

    def ready(self) -> list[Partition]:
        return [p for p in self._parts.values() if p.ready]

    def fetching(self) -> list[Partition]:
        return [p for p in self._parts.values() if p.state is PartitionState.FETCHING]

    def start_fetching(
        self,
        consumer: AIOKafkaConsumer,
        part: Partition,
        committed: dict[str, Ranges],
        at: int | None = None,
    ) -> int | None:
        """WAITING -> FETCHING at ``at``, else at the lowest position ``committed`` (per
        table) needs; returns it (None: the group's position, no table knows the
        partition)."""
        part.committed = committed
        part.epoch += 1
        resume = at if at is not None else resume_position(committed.values())
        if resume is not None:
            consumer.seek(part.tp, resume)
            part.start = resume
            part.position = resume
            for table in committed:
                part.handed[table] = resume - 1
        part.state = PartitionState.FETCHING
        consumer.resume(part.tp)
        return resume

    def restart(self, consumer: AIOKafkaConsumer, part: Partition) -> Partition:
        """Any state -> WAITING as a new partition (its topic was re-created: nothing
        handed or covered of the old one applies); returns it."""
        fresh = Partition(part.tp, epoch=part.epoch + 1)
        consumer.pause(part.tp)
        self._parts[part.tp] = fresh
        self._gauge()
        return fresh

    def pause(self, consumer: AIOKafkaConsumer, part: Partition, offset: int) -> None:
        """FETCHING -> PAUSED, sought back to ``offset`` (the first one not spooled)."""
        consumer.seek(part.tp, offset)
        consumer.pause(part.tp)
        part.epoch += 1
        part.position = offset
        if part.state is not PartitionState.PAUSED:
            part.state = PartitionState.PAUSED
            self._gauge()
            _log.info(
                "%s: paused %s[%d] at offset %d (backpressure)",
                self._source,
                part.tp.topic,
                part.tp.partition,
                offset,
            )

    def resume_all(self, consumer: AIOKafkaConsumer) -> int:
        """PAUSED -> FETCHING for every paused partition; returns how many."""
        paused = [p for p in self._parts.values() if p.state is PartitionState.PAUSED]
        for part in paused:
            part.state = PartitionState.FETCHING
            consumer.resume(part.tp)
        if paused:
            self._gauge()
            _log.info("%s: resumed %d partitions", self._source, len(paused))
        return len(paused)

    def any_paused(self) -> bool:
        return any(p.state is PartitionState.PAUSED for p in self._parts.values())

    def _gauge(self) -> None:
        self._metrics.kafka_paused.set(
            sum(p.state is PartitionState.PAUSED for p in self._parts.values())
        )
