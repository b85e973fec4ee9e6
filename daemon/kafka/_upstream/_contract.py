"""What the fence relies on in aiokafka, checked when the fence is imported.

``PINS`` lists, per module of the fence, what it relies on in aiokafka beyond its public
API: private names exist, take the parameters they took, set or use the attributes the
fence reads, and, where the fence copies a step sequence (``getmany`` and
``Fetcher.fetched_records`` in `_batches`), exactly the names those steps use, so an
upstream change to them turns red here instead of silently diverging. The version must
lie in the range the suite ran against (pyproject.toml pins the same).

``check_contract`` raises ``UpstreamContractError`` with one line: the library, the
version, what changed, and the fence module to update (the machinery is shared with the
pyiceberg fence: ``icespool._upstream_contract``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from icespool import _upstream_contract as contract
from icespool._upstream_contract import (
    Pin,
    UpstreamContractError,
    accepts,
    equals,
    has,
    locals_named,
    params,
    says,
    uses,
    uses_exactly,
)

__all__ = [
    "FENCE",
    "LIBRARY",
    "PINS",
    "TESTED_RANGE",
    "Pin",
    "UpstreamContractError",
    "check_contract",
    "problems",
]

LIBRARY: Final = "aiokafka"
#: The versions the suite ran against: >=0.14, <0.15 (pyproject.toml pins the same).
TESTED_RANGE: Final = ((0, 14), (0, 15))
FENCE: Final = contract.Fence(LIBRARY, "daemon/kafka/_upstream/", TESTED_RANGE)

_CONSUMER = "aiokafka.consumer.consumer.AIOKafkaConsumer"
_FETCHER = "aiokafka.consumer.fetcher"
_BATCH = "aiokafka.record.default_records._DefaultRecordBatchPy"
_CLIENT = "aiokafka.client.AIOKafkaClient"

PINS: Final[tuple[Pin, ...]] = (
    # _batches.py: getmany / Fetcher.fetched_records, drained a record batch at a time
    Pin(
        "_batches.py",
        f"{_CONSUMER}.getmany",
        (
            uses_exactly(
                "ConsumerStoppedError",
                "ValueError",
                "_closed",
                "_coordinator",
                "_fetcher",
                "_max_poll_records",
                "_subscription",
                "all",
                "check_errors",
                "fetch_context",
                "fetched_records",
                "int",
                "isinstance",
            ),
        ),
    ),
    Pin(
        "_batches.py",
        f"{_FETCHER}.Fetcher.fetched_records",
        (
            params("self", "partitions", "timeout", "max_records"),
            uses_exactly(
                "FetchResult",
                "_closed",
                "_create_fetch_waiter",
                "_notify",
                "_records",
                "_subscriptions",
                "_wait_consume_future",
                "asyncio",
                "cancel",
                "check_raise",
                "done",
                "getall",
                "has_more",
                "is_assigned",
                "keys",
                "len",
                "list",
                "max",
                "monotonic",
                "pop",
                "reassignment_in_progress",
                "result",
                "time",
                "type",
                "wait",
                "wait_for_assignment",
            ),
        ),
    ),
    Pin("_batches.py", f"{_FETCHER}.Fetcher._create_fetch_waiter", (params("self"),)),
    Pin("_batches.py", f"{_FETCHER}.Fetcher._notify", (params("self", "future"),)),
    Pin(
        "_batches.py",
        f"{_FETCHER}.FetchResult.__init__",
        (uses("_topic_partition", "_partition_records"),),
    ),
    Pin(
        "_batches.py",
        f"{_FETCHER}.FetchResult.getall",
        (
            params("self", "max_records"),
            uses("_partition_records", "_topic_partition", "_update_position", "check_assignment"),
        ),
    ),
    Pin("_batches.py", f"{_FETCHER}.FetchResult._update_position", (params("self"),)),
    Pin("_batches.py", f"{_FETCHER}.FetchResult", (has("check_assignment", "has_more"),)),
    Pin("_batches.py", f"{_FETCHER}.FetchError", (has("check_raise"),)),
    Pin(
        "_batches.py",
        f"{_FETCHER}.PartitionRecords.__init__",
        (
            uses(
                "_tp",
                "_records",
                "_aborted_producers",
                "_check_crcs",
                "_isolation_level",
                "next_fetch_offset",
                "_records_iterator",
                "_unpack_records",
            ),
        ),
    ),
    # _aborted and _take repeat its filter, on its state.
    Pin(
        "_batches.py",
        f"{_FETCHER}.PartitionRecords._unpack_records",
        (
            uses(
                "READ_COMMITTED",
                "_aborted_producers",
                "_check_crcs",
                "_consume_aborted_up_to",
                "_contains_abort_marker",
                "_isolation_level",
                "is_control_batch",
                "is_transactional",
                "next_fetch_offset",
                "producer_id",
                "validate_crc",
            ),
        ),
    ),
    Pin(
        "_batches.py",
        f"{_FETCHER}.PartitionRecords._consume_aborted_up_to",
        (params("self", "batch_offset"),),
    ),
    Pin(
        "_batches.py",
        f"{_FETCHER}.PartitionRecords._contains_abort_marker",
        (params("self", "next_batch"),),
    ),
    Pin("_batches.py", f"{_FETCHER}.READ_COMMITTED", (equals(1),)),
    # _raw_fetch.py: one Fetch request through the consumer's client; a tolerant batch
    Pin("_raw_fetch.py", f"{_CONSUMER}.__init__", (uses("_client"),)),
    Pin("_raw_fetch.py", f"{_CLIENT}.send", (params("self", "node_id", "request"),)),
    Pin("_raw_fetch.py", f"{_CLIENT}.__init__", (uses("cluster"),)),
    Pin(
        "_raw_fetch.py",
        "aiokafka.protocol.fetch.FetchRequest",
        (params("max_wait_time", "min_bytes", "max_bytes", "isolation_level", "topics"),),
    ),
    Pin(
        "_raw_fetch.py",
        f"{_BATCH}.__init__",
        (params("self", "buffer"), uses("_buffer", "_pos", "_num_records")),
    ),
    Pin("_raw_fetch.py", f"{_BATCH}._maybe_uncompress", (params("self"),)),
    # _read_tolerant reads a record as _read_msg does, from the same fields.
    Pin(
        "_raw_fetch.py",
        f"{_BATCH}._read_msg",
        (
            uses(
                "LOG_APPEND_TIME",
                "_buffer",
                "_pos",
                "base_offset",
                "first_timestamp",
                "max_timestamp",
                "timestamp_type",
            ),
        ),
    ),
    Pin(
        "_raw_fetch.py",
        _BATCH,
        (has("validate_crc", "is_control_batch", "is_transactional", "producer_id"),),
    ),
    Pin("_raw_fetch.py", "aiokafka.record.util.decode_varint_py", (params("buffer", "pos"),)),
    # _topic_ids.py: a Metadata v12 request aiokafka's protocol types can carry
    Pin("_topic_ids.py", f"{_CLIENT}.get_random_node", (params("self"),)),
    Pin(
        "_topic_ids.py",
        "aiokafka.protocol.api.Request",
        (has("ALLOW_UNKNOWN_API_VERSION", "build", "prepare"),),
    ),
    Pin(
        "_topic_ids.py",
        "aiokafka.protocol.api.Request.build",
        (params("self", "request_struct_class"),),
    ),
    Pin("_topic_ids.py", "aiokafka.protocol.api.Request.__init_subclass__", (uses("_CLASSES"),)),
    Pin("_topic_ids.py", "aiokafka.protocol.api.RequestStruct", (has("FLEXIBLE_VERSION"),)),
    Pin("_topic_ids.py", "aiokafka.protocol.abstract.AbstractType", (has("encode", "decode"),)),
    Pin(
        "_topic_ids.py",
        "aiokafka.protocol.types",
        (
            has(
                "Boolean",
                "CompactArray",
                "CompactString",
                "Int16",
                "Int32",
                "Schema",
                "TaggedFields",
            ),
        ),
    ),
    # _consumer.py: the group's committed offsets
    Pin("_consumer.py", f"{_CONSUMER}.start", (uses("_coordinator"),)),
    Pin(
        "_consumer.py",
        "aiokafka.consumer.group_coordinator.GroupCoordinator.fetch_committed_offsets",
        (params("self", "partitions"),),
    ),
    # _probe.py: one bare connection; the broker's refusal of a SCRAM login
    Pin(
        "_probe.py",
        "aiokafka.conn.create_conn",
        (
            params("host", "port"),
            accepts(
                "request_timeout_ms",
                "security_protocol",
                "ssl_context",
                "sasl_mechanism",
                "sasl_plain_username",
                "sasl_plain_password",
            ),
        ),
    ),
    # _probe.py: connect_problem probes when the bootstrap failed, told by its message
    Pin("_probe.py", f"{_CLIENT}.bootstrap", (says("Unable to bootstrap from "),)),
    Pin(
        "_probe.py",
        "aiokafka.conn.ScramAuthenticator.process_server_final_message",
        (params("self", "server_final"), locals_named("server_final")),
    ),
    # _bootstrap_log.py: the per-server failures it lowers to debug, by format string
    Pin(
        "_bootstrap_log.py",
        f"{_CLIENT}.bootstrap",
        (says('Unable connect to "%s:%s": %s', 'Unable to request metadata from "%s:%s": %s'),),
    ),
)


def problems(pins: Iterable[Pin] = PINS) -> list[str]:
    """What changed, one line per broken check of ``pins`` (the fence module named)."""
    return contract.problems(FENCE, pins)


def check_contract(pins: Iterable[Pin] = PINS) -> None:
    """Raise UpstreamContractError (one line) unless the installed aiokafka has what
    ``pins`` rely on, in a version the suite ran against."""
    contract.check_contract(FENCE, pins)
