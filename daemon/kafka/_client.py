"""aiokafka clients of one source: options (security included), creation, liveness.

Every call to the brokers that the source makes outside ``getmany`` is bounded by
`PROBE_TIMEOUT`, and a client that is given up on is stopped within it too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any, Final

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.helpers import create_ssl_context

from icespool.config import KafkaConfig
from icespool.kafka._upstream._consumer import committed_offsets

__all__ = [
    "PROBE_TIMEOUT",
    "client_options",
    "group_positions",
    "new_consumer",
    "new_producer",
    "stop_quietly",
]

_log = logging.getLogger("icespool.kafka")
#: Bound on metadata probes, group offset commits, offset look-ups and client stops.
PROBE_TIMEOUT: Final = 5.0


def client_options(config: KafkaConfig) -> dict[str, Any]:
    """Connection and security options shared by the consumer and the producer."""
    options: dict[str, Any] = {
        "bootstrap_servers": config.bootstrap_servers,
        "security_protocol": config.security_protocol,
    }
    if config.sasl_mechanism is not None:
        options["sasl_mechanism"] = config.sasl_mechanism
        options["sasl_plain_username"] = config.sasl_plain_username
        options["sasl_plain_password"] = config.sasl_plain_password
    if config.security_protocol.endswith("SSL"):
        options["ssl_context"] = create_ssl_context(
            cafile=config.ssl_cafile and str(config.ssl_cafile),
            certfile=config.ssl_certfile and str(config.ssl_certfile),
            keyfile=config.ssl_keyfile and str(config.ssl_keyfile),
            password=config.ssl_password,
        )
    return options


async def new_consumer(
    config: KafkaConfig, listener: ConsumerRebalanceListener
) -> AIOKafkaConsumer:
    """A started consumer subscribed to the source's topics (or pattern)."""
    consumer = AIOKafkaConsumer(
        group_id=config.group_id,
        enable_auto_commit=False,  # offsets go to Kafka only after Iceberg has them
        # Never reset a position silently: where a partition no table knows starts is
        # the source's choice (the group's offset, else config.auto_offset_reset), and
        # a position out of range (retention, a re-created topic) surfaces from
        # getmany as OffsetOutOfRangeError, for the source to log and count.
        auto_offset_reset="none",
        metadata_max_age_ms=int(config.metadata_max_age * 1000),
        isolation_level=config.isolation_level,
        max_poll_records=config.max_poll_records,
        fetch_min_bytes=config.fetch_min_bytes,
        fetch_max_wait_ms=int(config.fetch_max_wait * 1000),
        session_timeout_ms=int(config.session_timeout * 1000),
        heartbeat_interval_ms=max(100, int(config.session_timeout * 1000 / 3)),
        **client_options(config),
    )
    try:
        await consumer.start()
    except BaseException:
        await stop_quietly(consumer)
        raise
    if config.topic_pattern is not None:
        consumer.subscribe(pattern=config.topic_pattern, listener=listener)
    else:
        consumer.subscribe(topics=config.topics, listener=listener)
    return consumer


async def group_positions(
    consumer: AIOKafkaConsumer, tps: Sequence[TopicPartition], reset: str
) -> dict[TopicPartition, int]:
    """Where partitions no table knows start: the group's committed offset, else the
    partition's first (``reset`` "earliest") or next offset. The consumer resets
    nothing itself (`new_consumer`)."""
    if not tps:
        return {}
    found = await committed_offsets(consumer, tps)
    positions = {tp: int(found[tp].offset) for tp in tps if tp in found and found[tp].offset >= 0}
    rest = [tp for tp in tps if tp not in positions]
    if rest:
        if reset == "earliest":
            edges = await consumer.beginning_offsets(rest)
        else:
            edges = await consumer.end_offsets(rest)
        positions.update({tp: int(edges[tp]) for tp in rest})
    return positions


async def new_producer(config: KafkaConfig) -> AIOKafkaProducer:
    """A started producer for the dead-letter topic (acks from every replica)."""
    producer = AIOKafkaProducer(acks="all", **client_options(config))
    try:
        await producer.start()
    except BaseException:
        await stop_quietly(producer)
        raise
    return producer


async def stop_quietly(client: AIOKafkaConsumer | AIOKafkaProducer) -> None:
    """Stop a client the source gives up on; a broker that does not answer is not
    waited for longer than `PROBE_TIMEOUT`."""
    try:
        async with asyncio.timeout(PROBE_TIMEOUT):
            await client.stop()
    except Exception as exc:  # it is being discarded: only say so
        _log.debug("stopping a Kafka client failed: %r", exc)
