"""Transactional producers and a source with ``isolation_level = "read_committed"``:
real `icespool run` children on the tests' Apache Kafka broker.

Every test ends by reading the table back: each id of a committed transaction is in it
exactly once, no id of an aborted (or never ended) transaction is.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import aiohttp
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.record.default_records import _DefaultRecordBatchBuilderPy
from aiokafka.structs import ConsumerRecord
from pyiceberg.catalog import load_catalog
from support.daemon_harness import CATALOG_NAME, TABLE, Daemon, DaemonDir
from support.kafka_harness import Broker, create_topic, produce_transaction, unique_name

from icespool.kafka._upstream._batches import getmany
from icespool.kafka._upstream._contract import problems
from icespool.kafka._upstream._raw_fetch import fetch_raw

PARTITIONS = 4
#: The longest a source may take to drain what was produced before it (seconds).
DRAIN_WITHIN = 60.0


def _kafka_section(broker: Broker, topic: str) -> str:
    return f"""
[[kafka]]
bootstrap_servers = "{broker.bootstrap}"
group_id = "g-{topic}"
topics = ["{topic}"]
table = "{TABLE}"
isolation_level = "read_committed"
offset_commit_interval = "1s"
session_timeout = "6s"
"""


def _start_home(broker: Broker, root: Path, topic: str) -> tuple[DaemonDir, Daemon]:
    home = DaemonDir(root)
    home.write_config(
        batch_timeout="1s", max_batch_records=30_000, extra=_kafka_section(broker, topic)
    )
    return home, Daemon(home)


def _records(ids: Sequence[int], tag: str) -> list[dict[str, object]]:
    return [{"id": i, "v": f"{tag}{i}"} for i in ids]


async def _transactional(broker: Broker, **options: object) -> AIOKafkaProducer:
    producer = AIOKafkaProducer(
        bootstrap_servers=broker.bootstrap,
        transactional_id=unique_name("tx"),
        linger_ms=5,
        **options,
    )
    await producer.start()
    return producer


async def _ids(home: DaemonDir) -> Counter[int]:
    rows, _ = await asyncio.to_thread(home.read_rows)
    return Counter(int(r["id"]) for r in rows)


async def _wait_rows(home: DaemonDir, n: int, within: float, daemon: Daemon) -> float:
    """Seconds until the table has ``n`` rows (fails after ``within``)."""
    began = time.monotonic()
    count = -1
    while time.monotonic() - began < within:
        count = sum((await _ids(home)).values())
        if count >= n:
            return time.monotonic() - began
        await asyncio.sleep(0.5)
    raise AssertionError(f"{count} of {n} rows after {within:.0f} s\n{daemon.tail()}")


async def _assert_exactly(home: DaemonDir, committed: set[int], aborted: set[int]) -> None:
    ids = await _ids(home)
    twice = sorted(i for i, c in ids.items() if c > 1)
    leaked = sorted(aborted & set(ids))
    missing = sorted(committed - set(ids))
    assert not leaked, f"{len(leaked)} ids of aborted transactions read, e.g. {leaked[:5]}"
    assert not twice, f"{len(twice)} ids twice, e.g. {twice[:5]}"
    assert not missing, f"{len(missing)} committed ids missing, e.g. {missing[:5]}"
    assert set(ids) == committed, sorted(set(ids) - committed)[:5]


async def _lags(daemon: Daemon) -> dict[int, int]:
    async with aiohttp.ClientSession() as http, http.get(f"{daemon.url}/v1/status") as resp:
        assert resp.status == 200, resp.status
        status = json.loads(await resp.text())
    (source,) = status["kafka"]["sources"]
    return {a["partition"]: a["lag"] for a in source["assignments"]}


def _plan(
    producers: int, transactions: int, size: int, aborts_every: Sequence[int]
) -> list[list[tuple[list[int], bool]]]:
    """Per producer, its transactions: (ids, commit). Ids are unique across all of them;
    producer ``p`` aborts every ``aborts_every[p]``-th transaction (from its first)."""
    plans: list[list[tuple[list[int], bool]]] = [[] for _ in range(producers)]
    next_id = 0
    for t in range(transactions):
        for p in range(producers):
            plans[p].append((list(range(next_id, next_id + size)), t % aborts_every[p] != 0))
            next_id += size
    return plans


async def _run_plan(
    broker: Broker, topic: str, plan: list[tuple[list[int], bool]], pause: float = 0.0
) -> None:
    producer = await _transactional(broker)
    try:
        for ids, commit in plan:
            await produce_transaction(
                producer,
                topic,
                _records(ids, "c" if commit else "a"),
                partitions=PARTITIONS,
                commit=commit,
            )
            await asyncio.sleep(pause)
    finally:
        await producer.stop()


def _split(plans: list[list[tuple[list[int], bool]]]) -> tuple[set[int], set[int]]:
    committed = {i for plan in plans for ids, ok in plan if ok for i in ids}
    aborted = {i for plan in plans for ids, ok in plan if not ok for i in ids}
    return committed, aborted


async def test_interleaved_commits_and_aborts_read_once_and_never(
    broker: Broker, tmp_path: Path
) -> None:
    """Two transactional producers at once, each transaction spanning every partition:
    their committed and aborted batches (and commit/abort markers) alternate within
    each partition's log."""
    topic = unique_name("txn-mixed")
    await create_topic(broker.bootstrap, topic, PARTITIONS)
    plans = _plan(producers=2, transactions=24, size=400, aborts_every=[3, 2])
    committed, aborted = _split(plans)
    assert len(committed) == 11_200 and len(aborted) == 8_000
    home, daemon = _start_home(broker, tmp_path / "d", topic)
    try:
        daemon.start()
        await daemon.wait_ready()
        # Half while the source reads along, then the rest before it catches up.
        await asyncio.gather(*(_run_plan(broker, topic, plan[:12]) for plan in plans))
        await asyncio.gather(*(_run_plan(broker, topic, plan[12:]) for plan in plans))
        drained = await _wait_rows(home, len(committed), DRAIN_WITHIN, daemon)
        await asyncio.sleep(2)  # nothing more may arrive
        await _assert_exactly(home, committed, aborted)
        # The markers after the last records do not hold the source: a later
        # transaction is read as soon as it commits.
        later = list(range(100_000, 100_100))
        await _run_plan(broker, topic, [(later, True)])
        await _wait_rows(home, len(committed) + len(later), 15, daemon)
        await _assert_exactly(home, committed | set(later), aborted)
        # Lag counts records to read: a partition that ends in a commit marker has none.
        deadline = time.monotonic() + 10
        while (lags := await _lags(daemon)) != dict.fromkeys(range(PARTITIONS), 0):
            assert time.monotonic() < deadline, lags
            await asyncio.sleep(0.5)
        print(f"drained {len(committed)} committed records within {drained:.1f} s")
    finally:
        daemon.cleanup()


@pytest.mark.parametrize("ending", ["commit", "abort"])
async def test_an_open_transaction_holds_what_follows_until_it_ends(
    ending: str, broker: Broker, tmp_path: Path
) -> None:
    topic = unique_name(f"txn-open-{ending}")
    await create_topic(broker.bootstrap, topic, PARTITIONS)
    home, daemon = _start_home(broker, tmp_path / "d", topic)
    early, held, later = range(400), range(1000, 1200), range(400, 800)
    steady = await _transactional(broker)
    opened = await _transactional(broker)
    try:
        daemon.start()
        await daemon.wait_ready()
        await produce_transaction(
            steady, topic, _records(early, "e"), partitions=PARTITIONS, commit=True
        )
        # Begun and written to every partition, not ended: the last stable offset
        # stops before it, and the committed transaction after it waits behind it.
        await opened.begin_transaction()
        await asyncio.gather(
            *[
                await opened.send(topic, json.dumps(r).encode(), partition=i % PARTITIONS)
                for i, r in enumerate(_records(held, "h"))
            ]
        )
        await produce_transaction(
            steady, topic, _records(later, "l"), partitions=PARTITIONS, commit=True
        )
        await _wait_rows(home, len(early), DRAIN_WITHIN, daemon)
        await asyncio.sleep(5)  # five batch timeouts: what follows the open one waits
        await _assert_exactly(home, set(early), set(held) | set(later))
        if ending == "commit":
            await opened.commit_transaction()
            expected, never = set(early) | set(held) | set(later), set()
        else:
            await opened.abort_transaction()
            expected, never = set(early) | set(later), set(held)
        await _wait_rows(home, len(expected), 20, daemon)
        await asyncio.sleep(2)
        await _assert_exactly(home, expected, never)
        # No stall afterwards.
        after = range(2000, 2100)
        await produce_transaction(
            steady, topic, _records(after, "n"), partitions=PARTITIONS, commit=True
        )
        await _wait_rows(home, len(expected) + len(after), 15, daemon)
        await _assert_exactly(home, expected | set(after), never)
    finally:
        await opened.stop()
        await steady.stop()
        daemon.cleanup()


# A producer that commits one transaction, writes a second to every partition and
# then waits, never ending it: the test kills it with SIGKILL.
_DYING_PRODUCER = """
import asyncio, json, sys
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.record.default_records import _DefaultRecordBatchBuilderPy
from aiokafka.structs import ConsumerRecord
from pyiceberg.catalog import load_catalog

async def main(bootstrap, topic, partitions, txid):
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=txid, transaction_timeout_ms=5000
    )
    await producer.start()
    async def send(first, count):
        return [
            await producer.send(
                topic, json.dumps({"id": i, "v": "k"}).encode(), partition=i % partitions
            )
            for i in range(first, first + count)
        ]
    await producer.begin_transaction()
    await asyncio.gather(*await send(0, 300))
    await producer.commit_transaction()
    await producer.begin_transaction()
    await asyncio.gather(*await send(5000, 300))
    print("in-transaction", flush=True)
    await asyncio.sleep(600)

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]))
"""


async def test_a_producer_killed_mid_transaction_is_aborted_by_its_timeout(
    broker: Broker, tmp_path: Path
) -> None:
    topic = unique_name("txn-dead")
    await create_topic(broker.bootstrap, topic, PARTITIONS)
    home, daemon = _start_home(broker, tmp_path / "d", topic)
    script = tmp_path / "dying_producer.py"
    script.write_text(_DYING_PRODUCER)
    child = subprocess.Popen(
        [sys.executable, str(script), broker.bootstrap, topic, str(PARTITIONS), unique_name("tx")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        daemon.start()
        await daemon.wait_ready()
        assert child.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 60)
        assert line == b"in-transaction\n", line + child.stdout.read()
        child.kill()
        assert child.wait(10) == -9
        # Committed after the dead transaction began: held behind it until the broker
        # aborts it (transaction_timeout_ms 5 s), then read.
        after = range(300, 600)
        await _run_plan(broker, topic, [(list(after), True)])
        await _wait_rows(home, 600, DRAIN_WITHIN, daemon)
        await asyncio.sleep(2)
        await _assert_exactly(home, set(range(600)), set(range(5000, 5300)))
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        if child.stdout is not None:
            child.stdout.close()
        daemon.cleanup()


@pytest.mark.slow
async def test_kill_9_during_a_transactional_workload(broker: Broker, tmp_path: Path) -> None:
    topic = unique_name("txn-kills")
    await create_topic(broker.bootstrap, topic, PARTITIONS)
    plans = _plan(producers=2, transactions=40, size=1000, aborts_every=[4, 3])
    committed, aborted = _split(plans)
    home, daemon = _start_home(broker, tmp_path / "d", topic)
    rng = random.Random(7)
    producers = asyncio.gather(*(_run_plan(broker, topic, plan, pause=0.15) for plan in plans))
    try:
        for _ in range(3):
            daemon.start()
            await daemon.wait_ready()
            await asyncio.sleep(rng.uniform(1.0, 4.0))
            assert daemon.kill() == -9
        await producers
        daemon.start()
        await daemon.wait_ready()
        await _wait_rows(home, len(committed), 120, daemon)
        await asyncio.sleep(2)
        await _assert_exactly(home, committed, aborted)
    finally:
        producers.cancel()
        daemon.cleanup()


async def _read_committed(
    broker: Broker, topic: str, total: int, *, batched: bool
) -> dict[int, list[tuple[int, bytes]]]:
    """Every partition's (offset, value) pairs as a read_committed consumer hands them
    out: the daemon's batch-drained `getmany`, or aiokafka's own."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=broker.bootstrap,
        group_id=unique_name("g"),
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        max_poll_records=333,  # cuts the producers' record batches
    )
    await consumer.start()
    consumer.subscribe(topics=[topic])
    got: dict[int, list[tuple[int, bytes]]] = {}
    seen = 0
    try:
        async with asyncio.timeout(60):
            while seen < total:
                if batched:
                    fetched = await getmany(consumer, 200)
                else:
                    fetched = await consumer.getmany(timeout_ms=200)
                for tp, records in fetched.items():
                    # The batch-drained path hands out aiokafka's C records as they are.
                    assert all(isinstance(r, ConsumerRecord) != batched for r in records)
                    got.setdefault(tp.partition, []).extend((r.offset, r.value) for r in records)
                    seen += len(records)
            assert await getmany(consumer, 300) == {}
    finally:
        await consumer.stop()
    return got


async def test_batch_drained_read_committed_hands_out_what_aiokafka_does(broker: Broker) -> None:
    """The daemon drains read_committed fetches a record batch at a time too: aborted
    transactions (from the fetch's aborted-transactions list, up to each abort marker)
    and control batches are skipped exactly as aiokafka's per-record path skips them."""
    assert problems() == [], "the aiokafka version changed: check daemon/kafka/_upstream/"
    topic = unique_name("txn-drain")
    await create_topic(broker.bootstrap, topic, PARTITIONS)
    plans = _plan(producers=3, transactions=10, size=300, aborts_every=[2, 3, 1])
    committed, aborted = _split(plans)
    await asyncio.gather(*(_run_plan(broker, topic, plan) for plan in plans))
    expected = await _read_committed(broker, topic, len(committed), batched=False)
    got = await _read_committed(broker, topic, len(committed), batched=True)
    assert got == expected
    ids = Counter(json.loads(v)["id"] for pairs in got.values() for _, v in pairs)
    assert set(ids) == committed and max(ids.values()) == 1
    assert not aborted & set(ids)


class _RawKey(str):
    """A header key whose bytes on the wire are not UTF-8 (aiokafka's own producer only
    sends str keys it can encode): aiokafka's reader cannot parse its record."""

    raw: bytes

    def __new__(cls, raw: bytes) -> _RawKey:
        made = super().__new__(cls, "x" * len(raw))
        made.raw = raw
        return made

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return self.raw


async def _poison_batch(broker: Broker, topic: str, ids: Sequence[int], bad: int) -> None:
    """One record batch (not transactional) of ``ids`` on partition 0, the record of
    ``bad`` with a header key that is not UTF-8, written by aiokafka's pure-Python
    builder (it writes the key's bytes as ``encode`` returns them)."""
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
    await producer.start()
    try:
        batch = producer.create_batch()
        batch._builder = _DefaultRecordBatchBuilderPy(2, 0, 0, -1, -1, -1, 4 << 20)
        for i in ids:
            headers = [(_RawKey(b"\xff\xfe") if i == bad else "h", b"v")]
            value = json.dumps({"id": i, "v": "p"}).encode()
            assert batch.append(timestamp=None, key=b"k", value=value, headers=headers)
        await (await producer.send_batch(batch, topic, partition=0))
    finally:
        await producer.stop()


async def _one_partition_log(
    broker: Broker, topic: str, opened: AIOKafkaProducer, poison: bool
) -> None:
    """Partition 0: an aborted transaction (ids 0-9), [a batch of ids 100-102 whose
    101 does not parse], a committed one (200-209), an open one (300-309) and a plain
    record after it (400)."""
    producer = await _transactional(broker)
    try:
        await produce_transaction(
            producer, topic, _records(range(10), "a"), partitions=1, commit=False
        )
        if poison:
            await _poison_batch(broker, topic, [100, 101, 102], bad=101)
        await produce_transaction(
            producer, topic, _records(range(200, 210), "c"), partitions=1, commit=True
        )
    finally:
        await producer.stop()
    await opened.begin_transaction()
    await asyncio.gather(
        *[
            await opened.send(topic, json.dumps(r).encode(), partition=0)
            for r in _records(range(300, 310), "o")
        ]
    )
    plain = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
    await plain.start()
    try:
        await plain.send_and_wait(topic, json.dumps({"id": 400, "v": "p"}).encode(), partition=0)
    finally:
        await plain.stop()


async def test_a_raw_fetch_read_committed_leaves_out_aborted_and_open_transactions(
    broker: Broker,
) -> None:
    """`fetch_raw` (how the source reads past records its client cannot parse) reads
    what a read_committed consumer reads: up to the last stable offset, without the
    aborted transactions."""
    topic = unique_name("txn-raw")
    await create_topic(broker.bootstrap, topic, 1)
    opened = await _transactional(broker)
    client = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap)
    await client.start()
    try:
        await _one_partition_log(broker, topic, opened, poison=False)
        tp = TopicPartition(topic, 0)
        await client._client.force_metadata_update()
        committed, after = await fetch_raw(client, tp, 0, 1 << 20, 10, "read_committed")
        assert [json.loads(r.value or b"")["id"] for r in committed] == list(range(200, 210))
        # Ten aborted records and their marker, ten committed and theirs: the open
        # transaction starts at offset 22, where the committed read stops.
        assert after == 22
        everything, end = await fetch_raw(client, tp, 0, 1 << 20, 10)
        ids = [json.loads(r.value or b"")["id"] for r in everything]
        assert ids == [*range(10), *range(200, 210), *range(300, 310), 400]
        assert end == 33
    finally:
        await client.stop()
        await opened.stop()


async def test_an_unparseable_record_read_committed_skips_aborted_and_open_transactions(
    broker: Broker, tmp_path: Path
) -> None:
    """The poison record makes the source read the partition's raw batches: those
    must not bring in the aborted transaction before it or the open one after it."""
    topic = unique_name("txn-poison")
    await create_topic(broker.bootstrap, topic, 1)
    opened = await _transactional(broker)
    home, daemon = _start_home(broker, tmp_path / "d", topic)
    try:
        await _one_partition_log(broker, topic, opened, poison=True)
        daemon.start()
        await daemon.wait_ready()
        expected = {100, 102, *range(200, 210)}
        await _wait_rows(home, len(expected), DRAIN_WITHIN, daemon)
        await asyncio.sleep(3)
        never = {*range(10), *range(300, 310), 400}
        await _assert_exactly(home, expected, never)
        assert "cannot parse" in daemon.log(), daemon.tail()
        catalog = load_catalog(CATALOG_NAME, **home.catalog_properties)
        dead = catalog.load_table(f"{TABLE}_dead_letter").scan().to_arrow().to_pylist()
        assert [(d["offset"], d["reason"]) for d in dead] == [(12, "unparseable")]
        # The open transaction aborted: what followed it is read, its records never.
        await opened.abort_transaction()
        await _wait_rows(home, len(expected) + 1, 20, daemon)
        await asyncio.sleep(2)
        await _assert_exactly(home, expected | {400}, {*range(10), *range(300, 310)})
    finally:
        await opened.stop()
        daemon.cleanup()
