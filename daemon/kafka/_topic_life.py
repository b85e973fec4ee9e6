"""What happened to a partition while the tables were not looking at it.

The tables hold the offsets they cover (`icespool.kafka._offsets`), and the mark of the
last record they cover (`RecordMark`: its offset, timestamp and a CRC of its key and
value). Offsets alone cannot tell a partition from another one of the same name: a
topic deleted and re-created starts again at offset 0, and resuming at the old
position would skip every new record below it, silently. So at assignment, before a
partition is fetched, its edges are read and the marked record is fetched again:

- ``recreated``: the tables' position is beyond the partition's end, or the record at
  the marked offset is another one. The topic was deleted and re-created (or its log
  truncated and written again); its offsets mean nothing any more, so the partition is
  read from its start and the tables' ranges of it are reset.
- ``retention``: the tables' position is before the partition's first offset: records
  were deleted (retention, ``kafka-delete-records``) before anyone read them. They are
  gone; reading goes on at the first kept offset.

A marked record that is no longer there (compacted away, or deleted by retention)
cannot be compared: that alone is not a change. Tables written before marks were kept
are checked by their position alone.

The same can happen while a partition is consumed: the consumer never resets an
offset by itself (``auto_offset_reset`` "none", see `icespool.kafka._client`), so a
fetch position that falls out of the partition's range comes back from ``getmany``
as ``OffsetOutOfRangeError``, and `out_of_range` tells which change it was (below
the first offset: ``retention``; beyond the end: ``recreated``). Each finding is
logged at warning by the source and counted in
``icespool_kafka_partition_changes_total{topic,kind}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import OffsetOutOfRangeError

from icespool.kafka._offsets import RecordMark
from icespool.kafka._upstream._raw_fetch import fetch_raw
from icespool.runtime.fanout import fan_out

__all__ = ["PartitionChange", "Resuming", "find_changes", "out_of_range"]

#: One fetch of the marked record's batch (a batch is at most a broker's max.message.bytes).
_FETCH_BYTES = 4 << 20
_FETCH_CONCURRENCY = 16


@dataclass(frozen=True, slots=True)
class Resuming:
    """A partition about to be fetched: where the tables resume, and their mark."""

    tp: TopicPartition
    position: int
    mark: RecordMark | None


@dataclass(frozen=True, slots=True)
class PartitionChange:
    kind: Literal["recreated", "retention"]
    start: int  # the partition's first offset: where reading goes on
    detail: str


async def find_changes(
    consumer: AIOKafkaConsumer, resuming: Sequence[Resuming], seconds: float
) -> dict[TopicPartition, PartitionChange]:
    """The partitions of ``resuming`` that changed under the tables (see the module
    doc); ``seconds`` bounds each fetch. Raises what Kafka raised (the caller retries
    the assignment later)."""
    if not resuming:
        return {}
    tps = [r.tp for r in resuming]
    first = await consumer.beginning_offsets(tps)
    end = await consumer.end_offsets(tps)

    async def check(item: Resuming) -> PartitionChange | None:
        start, stop = int(first[item.tp]), int(end[item.tp])
        mark = item.mark
        # The record the tables end with (without a mark: the one before their position)
        # is fetched even past the partition's reported end: some brokers report an end
        # behind the records they serve, and only a missing record proves a shorter log.
        probe = mark.offset if mark is not None else item.position - 1
        found: RecordMark | None = None
        if probe >= start:
            try:
                records, _ = await fetch_raw(consumer, item.tp, probe, _FETCH_BYTES, seconds)
            except OffsetOutOfRangeError:
                records = []
            record = next((r for r in records if r.offset == probe), None)
            if record is not None:
                found = RecordMark.of(record.offset, record.timestamp, record.key, record.value)
        if found is None and item.position > stop:
            return PartitionChange(
                "recreated",
                start,
                f"the tables resume at offset {item.position} but the partition ends at "
                f"{stop} and has no record at offset {probe}",
            )
        if found is not None and mark is not None and found != mark:
            return PartitionChange(
                "recreated",
                start,
                f"the record at offset {probe} is not the one the tables hold (timestamp "
                f"{found.timestamp}, crc {found.crc}; the tables have timestamp "
                f"{mark.timestamp}, crc {mark.crc})",
            )
        if item.position < start:
            return PartitionChange(
                "retention",
                start,
                f"offsets {item.position}-{start - 1} were deleted before they were read",
            )
        return None

    outcomes = await fan_out(
        "checking partitions against the tables' marks",
        resuming,
        check,
        limit=_FETCH_CONCURRENCY,
    )
    changes: dict[TopicPartition, PartitionChange] = {}
    for item, outcome in zip(resuming, outcomes, strict=True):
        if isinstance(outcome, Exception):
            raise outcome
        if outcome is not None:
            changes[item.tp] = outcome
    return changes


async def out_of_range(
    consumer: AIOKafkaConsumer, tp: TopicPartition, fetched: int, position: int
) -> PartitionChange | None:
    """What made a fetch of ``tp`` at ``fetched`` fail as out of range; ``position`` is
    the next offset the source has not processed (at most ``fetched``: the records
    between were drained ahead of processing). None: both are in range again (the
    fetch raced a seek), the caller just seeks back to ``position``."""
    first = int((await consumer.beginning_offsets([tp]))[tp])
    end = int((await consumer.end_offsets([tp]))[tp])
    if fetched > end or position > end:
        return PartitionChange(
            "recreated",
            first,
            f"the partition ends at offset {end} but was being read at {fetched}",
        )
    if position < first:
        return PartitionChange(
            "retention",
            first,
            f"offsets {position}-{first - 1} were deleted before they were read",
        )
    return None
