"""``getmany`` that hands over aiokafka's prefetched records a record batch at a time.

aiokafka's ``getmany`` walks every record through three Python frames (its
``FetchResult.getall`` loop, the ``PartitionRecords`` generator and
``_consumer_record``) and builds a ``ConsumerRecord`` per record: about a third of
the CPU a fast consumer spends, paid on the event loop. The records themselves are
already objects of its C reader (``DefaultRecord``: offset, timestamp, key, value,
headers, all the source reads), made by iterating a record batch in C.

`getmany` here is aiokafka's ``Consumer.getmany`` / ``Fetcher.fetched_records``
with one difference: each prefetched partition result is drained by `_drain`,
which takes whole record batches (``list(batch)``, C) instead of records one by
one. Everything else is aiokafka's own state and calls: the fetch positions it
keeps (``consumed_to``), its assignment checks (a paused, revoked or sought
partition's prefetched records are dropped as it drops them), its wake-ups of the
prefetch task, its coordinator errors. A record batch that fails its CRC, or a
record its C reader refuses, raises from here as from aiokafka, and the partition's
result is dropped so that the next call fetches and raises at the same position
again (what the source's unparseable-record path expects).

With ``read_committed``, record batches of aborted transactions are skipped as
aiokafka's ``PartitionRecords._unpack_records`` skips them, with its own state and
calls: the fetch response's aborted-transactions list is consumed up to each batch's
base offset (a producer in it is aborted from there), an abort marker (a control
batch) ends that, and a transactional batch of an aborted producer is passed over
whole. The broker returns nothing past the last stable offset, so what is left is
committed. Control batches are skipped at either level.

Where a result was partly read by aiokafka itself, aiokafka's own path runs.

Relies on (checked by ``_contract``): the steps of ``AIOKafkaConsumer.getmany`` and
``Fetcher.fetched_records`` (exactly the names they use), the consumer's ``_closed``,
``_coordinator``, ``_subscription``, ``_fetcher`` and ``_max_poll_records``, the
fetcher's ``_records``, ``_subscriptions``, ``_notify``, ``_wait_consume_future`` and
``_create_fetch_waiter``, ``FetchResult``'s ``_topic_partition``,
``_partition_records`` and ``_update_position``, and ``PartitionRecords``' state
(``_records``, ``_records_iterator``, ``_isolation_level``, ``_check_crcs``, ``_tp``,
``_aborted_producers``) with ``_consume_aborted_up_to`` and ``_contains_abort_marker``
as ``_unpack_records`` uses them; ``READ_COMMITTED`` is 1.
"""

from __future__ import annotations

import asyncio
import inspect
import time
import weakref
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.consumer import fetcher as _fetcher
from aiokafka.errors import ConsumerStoppedError, CorruptRecordException

__all__ = ["getmany"]


class _Left:
    """A partly returned record batch: its records not returned yet, its end."""

    __slots__ = ("end", "records")

    def __init__(self, records: list[Any], end: int) -> None:
        self.records = records
        self.end = end


# Per aiokafka PartitionRecords: what `_drain` left of its current record batch.
_LEFT: weakref.WeakKeyDictionary[Any, _Left] = weakref.WeakKeyDictionary()


async def getmany(consumer: AIOKafkaConsumer, timeout_ms: int) -> dict[TopicPartition, list[Any]]:
    """The prefetched records of every assigned partition (at most the consumer's
    ``max_poll_records`` in all), waiting up to ``timeout_ms`` for some: aiokafka's
    ``getmany()`` with records drained a record batch at a time. The records have
    offset, timestamp, key, value and headers, as ConsumerRecords do."""
    if consumer._closed:
        raise ConsumerStoppedError()
    consumer._coordinator.check_errors()
    with consumer._subscription.fetch_context():
        return await _fetched(consumer._fetcher, timeout_ms / 1000, consumer._max_poll_records)


async def _fetched(fetcher: Any, wait: float, max_records: int) -> dict[TopicPartition, Any]:
    """aiokafka's ``Fetcher.fetched_records`` (all partitions), draining by batch."""
    while True:
        if fetcher._subscriptions.reassignment_in_progress:
            await fetcher._subscriptions.wait_for_assignment()
        start_time = time.monotonic()
        drained: dict[TopicPartition, list[Any]] = {}
        for tp in list(fetcher._records.keys()):
            result = fetcher._records[tp]
            if type(result) is _fetcher.FetchResult:
                records = _drain(result, max_records)
                if not result.has_more():
                    # Everything was handed out: the prefetch task may fetch it again.
                    del fetcher._records[tp]
                    fetcher._notify(fetcher._wait_consume_future)
                if not records:
                    continue
                drained[tp] = records
                max_records -= len(records)
                if max_records == 0:
                    break
            elif drained:
                return drained  # the error is raised by the next call
            else:
                del fetcher._records[tp]
                fetcher._notify(fetcher._wait_consume_future)
                result.check_raise()
        if drained or not wait:
            return drained
        waiter = fetcher._create_fetch_waiter()
        done, pending = await asyncio.wait([waiter], timeout=wait)
        if not done or fetcher._closed:
            for future in pending:
                future.cancel()
            return {}
        if waiter.done():
            waiter.result()  # authorization errors
        wait = max(0.0, wait - (time.monotonic() - start_time))


def _drain(result: Any, max_records: int) -> list[Any]:
    """Up to ``max_records`` records of one prefetched partition result, whole
    record batches at a time; updates the partition's position as aiokafka does."""
    tp = result._topic_partition
    if not result.check_assignment(tp) or not result.has_more():
        return []
    part = result._partition_records
    iterator = part._records_iterator  # None once aiokafka's own path exhausted it
    if iterator is None or inspect.getgeneratorstate(iterator) != inspect.GEN_CREATED:
        got: list[Any] = result.getall(max_records)  # aiokafka's per-record path
        return got
    try:
        out, exhausted = _take(part, max_records)
    except Exception:
        # As aiokafka's iterator ends on an error: nothing of this result is handed
        # out and the position stays, so the next call fetches (and fails) there again.
        _LEFT.pop(part, None)
        result._partition_records = None
        raise
    result._update_position()
    if exhausted:
        _LEFT.pop(part, None)
        result._partition_records = None
    return out


def _take(part: Any, room: int) -> tuple[list[Any], bool]:
    """Records from ``part`` (aiokafka's PartitionRecords) up to ``room``, and
    whether it has no more. Sets ``part.next_fetch_offset`` past what is taken."""
    out: list[Any] = []
    left = _LEFT.pop(part, None)
    batches = part._records
    committed_only = part._isolation_level == _fetcher.READ_COMMITTED
    while room:
        if left is None:
            if not batches.has_next():
                return out, True
            batch = batches.next_batch()
            if part._check_crcs and not batch.validate_crc():
                raise CorruptRecordException(f"Invalid CRC - {part._tp}")
            if committed_only and _aborted(part, batch):
                part.next_fetch_offset = batch.next_offset
                continue
            if batch.is_control_batch:
                part.next_fetch_offset = batch.next_offset
                continue
            records = list(batch)  # the C reader: no Python frame per record
            if records and records[0].offset < part.next_fetch_offset:
                # A compressed legacy message set may start before the position.
                start = part.next_fetch_offset
                records = [r for r in records if r.offset >= start]
            left = _Left(records, batch.next_offset)
        if len(left.records) <= room:
            out.extend(left.records)
            room -= len(left.records)
            # Past the batch's last offset (compaction may have removed records).
            part.next_fetch_offset = left.end
            left = None
        else:
            taken, left.records = left.records[:room], left.records[room:]
            out.extend(taken)
            part.next_fetch_offset = taken[-1].offset + 1
            room = 0
    if left is not None:
        _LEFT[part] = left
    return out, False


def _aborted(part: Any, batch: Any) -> bool:
    """Whether ``batch`` belongs to an aborted transaction: aiokafka's read_committed
    test in ``PartitionRecords._unpack_records``, on its state (so batches must come in
    log order, as they do)."""
    if batch.producer_id is None:
        return False  # a message set older than transactions
    part._consume_aborted_up_to(batch.base_offset)
    if batch.is_control_batch and part._contains_abort_marker(batch):
        # The abort marker ends the producer's aborted transaction: its later batches
        # are another transaction's. (Kafka may send a marker with nothing before it.)
        part._aborted_producers.discard(batch.producer_id)
    return bool(batch.is_transactional and batch.producer_id in part._aborted_producers)
