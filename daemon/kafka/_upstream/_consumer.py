"""The consumer group's committed offsets, read through aiokafka's coordinator.

aiokafka's public ``committed(tp)`` asks the coordinator for one partition per
request; where the source starts partitions no table knows (a rebalance handing it
many at once) that is one round trip per partition. The coordinator's
``fetch_committed_offsets`` asks for all of them in one OffsetFetch request, which is
what ``committed`` calls underneath.

Relies on (checked by ``_contract``): ``AIOKafkaConsumer.start`` setting
``_coordinator``, and ``GroupCoordinator.fetch_committed_offsets(partitions)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

__all__ = ["committed_offsets"]


async def committed_offsets(
    consumer: AIOKafkaConsumer, tps: Sequence[TopicPartition]
) -> dict[TopicPartition, Any]:
    """The group's committed ``OffsetAndMetadata`` of each of ``tps`` it has one for
    (one request; the caller bounds it in time)."""
    found: dict[TopicPartition, Any] = await consumer._coordinator.fetch_committed_offsets(
        list(tps)
    )
    return found
