"""Topic ids: how a consumer that keeps its partitions learns its topic was re-created.

aiokafka speaks Metadata up to v5 and Fetch without topic ids, so a topic deleted and
created again under the same name, with as many partitions, looks the same to it. A
member that holds its partitions through that (frozen, or cut off from the brokers
for less than its session) fetches the new topic at the old position: when the new
log is shorter the fetch is out of range (`icespool.kafka._topic_life.out_of_range`),
but when it is longer the records below the position are skipped silently.

Brokers from Kafka 2.8 give every topic an id (a UUID), returned by Metadata v10 and
later. `topic_ids` asks for them with one Metadata v12 request (Kafka 3.1 and later;
the flexible encoding aiokafka's protocol types already have): the source keeps the
ids it saw when its partitions were checked and compares them on every offset tick.
A broker without v12 (or without ids, as some Kafka-protocol brokers) gives None:
the check is skipped, and the other checks still hold.

Relies on (checked by ``_contract``): aiokafka's protocol classes (``Request`` with
``build(request_struct_class)`` and the struct classes it collects from its generic
parameter, ``RequestStruct``, ``AbstractType``, the compact types), and the consumer's
``_client`` with ``get_random_node`` and ``send``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from io import BytesIO
from typing import Any, ClassVar

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import IncompatibleBrokerVersion, KafkaError
from aiokafka.protocol.abstract import AbstractType
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import (
    Boolean,
    CompactArray,
    CompactString,
    Int16,
    Int32,
    Schema,
    TaggedFields,
)

__all__ = ["topic_ids"]

_log = logging.getLogger("icespool.kafka")
_NO_ID = bytes(16)


class _Uuid(AbstractType[bytes]):  # type: ignore[misc]
    @classmethod
    def encode(cls, value: bytes) -> bytes:
        return value

    @classmethod
    def decode(cls, data: BytesIO) -> bytes:
        value = data.read(16)
        if len(value) != 16:
            raise ValueError("Buffer underrun decoding a UUID")
        return value


class _MetadataResponseV12(Response):  # type: ignore[misc]
    API_KEY = 3
    API_VERSION = 12
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "brokers",
            CompactArray(
                ("node_id", Int32),
                ("host", CompactString("utf-8")),
                ("port", Int32),
                ("rack", CompactString("utf-8")),
                ("tags", TaggedFields),
            ),
        ),
        ("cluster_id", CompactString("utf-8")),
        ("controller_id", Int32),
        (
            "topics",
            CompactArray(
                ("error_code", Int16),
                ("name", CompactString("utf-8")),
                ("topic_id", _Uuid),
                ("is_internal", Boolean),
                (
                    "partitions",
                    CompactArray(
                        ("error_code", Int16),
                        ("partition_index", Int32),
                        ("leader_id", Int32),
                        ("leader_epoch", Int32),
                        ("replica_nodes", CompactArray(Int32)),
                        ("isr_nodes", CompactArray(Int32)),
                        ("offline_replicas", CompactArray(Int32)),
                        ("tags", TaggedFields),
                    ),
                ),
                ("topic_authorized_operations", Int32),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class _MetadataRequestV12(RequestStruct):  # type: ignore[misc]
    FLEXIBLE_VERSION = True
    API_KEY = 3
    API_VERSION = 12
    RESPONSE_TYPE = _MetadataResponseV12
    SCHEMA = Schema(
        (
            "topics",
            CompactArray(
                ("topic_id", _Uuid), ("name", CompactString("utf-8")), ("tags", TaggedFields)
            ),
        ),
        ("allow_auto_topic_creation", Boolean),
        ("include_topic_authorized_operations", Boolean),
        ("tags", TaggedFields),
    )


class _TopicIdsRequest(Request[_MetadataRequestV12]):  # type: ignore[misc]
    API_KEY = 3
    ALLOW_UNKNOWN_API_VERSION: ClassVar[bool] = False

    def __init__(self, topics: Sequence[str]) -> None:
        self._topics = list(topics)

    def build(self, request_struct_class: type[_MetadataRequestV12]) -> _MetadataRequestV12:
        return request_struct_class([(_NO_ID, t, {}) for t in self._topics], False, False, {})


async def topic_ids(
    consumer: AIOKafkaConsumer, topics: Sequence[str], seconds: float
) -> dict[str, bytes] | None:
    """The ids of ``topics`` that exist (one Metadata v12 request through the consumer's
    own client, bounded by ``seconds``); None when the brokers cannot say."""
    if not topics:
        return {}
    client: Any = consumer._client
    try:
        node = client.get_random_node()
        if node is None:
            return None
        response = await asyncio.wait_for(client.send(node, _TopicIdsRequest(topics)), seconds)
    except (
        KafkaError,
        IncompatibleBrokerVersion,
        NotImplementedError,
        OSError,
        TimeoutError,
    ) as exc:
        _log.debug("topic ids of %s not available: %r", list(topics), exc)
        return None
    return {
        name: bytes(topic_id)
        for error_code, name, topic_id, *_ in response.topics
        if error_code == 0 and name is not None and topic_id != _NO_ID
    }
