"""A Kafka topic read back whole: the checker's model of the Kafka tables is their topics'
logs; and the tables read (by `support.table_reader`) while the replicas run."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, TopicPartition

__all__ = ["KafkaRecord", "read_table", "topic_log"]

_T = TypeVar("_T")


@dataclass(frozen=True)
class KafkaRecord:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


async def topic_log(bootstrap: str, topic: str, partitions: int) -> list[KafkaRecord]:
    """Every record of ``topic``, read from its first offset to its end."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        assigned = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(assigned)
        await consumer.seek_to_beginning(*assigned)
        ends = await consumer.end_offsets(assigned)
        records: list[KafkaRecord] = []
        while [tp for tp, end in ends.items() if await consumer.position(tp) < end]:
            batches = await asyncio.wait_for(consumer.getmany(timeout_ms=1000), 30)
            for tp, got in batches.items():
                records += [KafkaRecord(tp.partition, r.offset, r.key, r.value) for r in got]
        return records
    finally:
        await consumer.stop()


async def read_table(read: Callable[[Any, str], _T], catalog: Any, name: str) -> _T:
    """``read(catalog, name)`` off the event loop, again when a file it read is gone: the
    replicas' maintenance goes on meanwhile (the snapshot a read loaded may expire and
    its files be removed before the read ends)."""
    for attempt in range(5):
        try:
            return await asyncio.to_thread(read, catalog, name)
        except FileNotFoundError:
            if attempt == 4:
                raise
            await asyncio.sleep(1.0)
    raise AssertionError("unreachable")
