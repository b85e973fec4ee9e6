"""The fence: every place icespool reaches into aiokafka's internals (private names,
subclasses of its private classes, copied step sequences, its protocol classes).

One module per replaced or added behaviour; each docstring names the upstream behaviour,
why, and what it relies on:

    _batches     AIOKafkaConsumer.getmany / Fetcher.fetched_records draining whole
                 record batches (no Python frame per record)
    _raw_fetch   one Fetch request through the consumer's client, record batches
                 parsed past what aiokafka's parser refuses
    _topic_ids   a Metadata v12 request for topic ids (aiokafka speaks up to v5)
    _consumer    the group's committed offsets in one request (the coordinator's)
    _probe       one bare connection (create_conn); the broker's SCRAM refusal
    _bootstrap_log  aiokafka's per-server bootstrap failures logged at debug level
    _contract    what all of these rely on, checked here on import

Importing the fence checks the installed aiokafka against ``_contract.PINS`` and raises
``UpstreamContractError`` (one line: the library, its version, what changed, the module
to update) rather than letting a changed aiokafka misbehave at the first fetch. Only a
Kafka source imports it (an HTTP-only daemon never imports aiokafka). Nothing outside
this folder touches aiokafka's private names (tests/kafka/test_kafka_fence.py).
"""

from icespool.kafka._upstream._contract import UpstreamContractError, check_contract

__all__ = ["UpstreamContractError", "check_contract"]

check_contract()
