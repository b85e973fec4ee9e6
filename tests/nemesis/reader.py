"""A Kafka topic read back whole: the checker's model of the Kafka tables is their topics'
logs (the tables themselves are read by `support.table_reader`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition

__all__ = ["KafkaRecord", "topic_log"]


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
