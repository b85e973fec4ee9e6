"""A fetch as whole arrays: the vectorized poison guards at their edges, and aiokafka's
prefetched records drained a record batch at a time (issue 17).

The guards (`icespool.decode._screen.screened_values`) work on the values' lengths, their
joined body and its bytes, never value by value: these tests pin that every record
still gets exactly the outcome the per-record guards gave it (empty, oversized at
the byte boundary, whitespace only, raw newlines and CRs, too deep, null keys), in
fetches of a few records and of more than 100,000. The batched ``getmany``
(`icespool.kafka._upstream._batches`) is checked against aiokafka's own ``getmany`` on a real
broker (Apache Kafka), with poll limits that cut record batches, a pause and a seek.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pyarrow as pa
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from support.kafka_harness import Broker, create_topic, produce_values, unique_name

from icespool.decode import Decoded, JsonOptions, JsonValues, Records, Target
from icespool.kafka._fetch import Fetch
from icespool.kafka._upstream._batches import getmany
from icespool.kafka._upstream._contract import problems
from icespool.kafka._upstream._raw_fetch import RawRecord

META = ["_kafka_offset", "_kafka_key", "_kafka_timestamp"]
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("s", pa.string()),
        pa.field("_kafka_offset", pa.int64()),
        pa.field("_kafka_key", pa.binary()),
        pa.field("_kafka_timestamp", pa.timestamp("us", "UTC")),
    ]
)
LIMIT = 64  # max_record_bytes in these tests
OPTIONS = JsonOptions(max_depth=16)


def _decode(records: Records) -> Decoded:
    decoder = JsonValues(source_columns=META, max_record_bytes=LIMIT)
    return decoder.decode(records, Target("t", SCHEMA, options=OPTIONS))


def _value(i: int, width: int | None = None) -> bytes:
    """A record of exactly ``width`` bytes (padding its string), or a short one."""
    head = b'{"id":%d,"s":"' % i
    if width is None:
        return head + b'x"}'
    return head + b"y" * (width - len(head) - 2) + b'"}'


def _records(values: list[bytes | None], keys: list[bytes | None]) -> list[RawRecord]:
    return [
        RawRecord(100 + i, 1_700_000_000_000 + i, key, value, [("h", b"%d" % i)])
        for i, (key, value) in enumerate(zip(keys, values, strict=True))
    ]


def test_every_guard_edge_gets_the_outcome_it_had_record_by_record() -> None:
    deep = b'{"id":1,"x":' + b"[" * 20 + b"]" * 20 + b"}"  # 21 levels: too deep for 16
    cases: list[tuple[bytes | None, str | None]] = [
        (_value(0), None),
        (None, "empty"),  # a tombstone
        (b"", "empty"),
        (b" \t\r\n ", "empty"),  # only whitespace, raw newline and CR included
        (b"\x0b\x0c", "empty"),  # what str.isspace also counts
        (_value(5, LIMIT), None),  # exactly max_record_bytes: lands
        (_value(6, LIMIT + 1), "oversized"),
        (b" " * (LIMIT + 1), "empty"),  # oversized but only whitespace: empty, as before
        (b'{"id":8,\n"s":\r"nl"}', None),  # raw newline and CR as JSON whitespace
        (b'{"id":9,"s":"crlf"}\r\n', None),
        # A raw newline inside a string is blanked too (as the per-record guard did).
        (b'{"id":10,"s":"a\nb"}', None),
        (deep, "too_deep"),
        (b"null", "invalid"),
        (b'{"id":13,"s":"\\u00e9"}', None),
    ]
    values = [v for v, _ in cases]
    keys = [None if i % 3 else b"k%d" % i for i in range(len(values))]
    fetch = Fetch.of_records("t", 0, _records(values, keys))
    decoded = _decode(fetch)

    landed = [i for i, (_, reason) in enumerate(cases) if reason is None]
    assert decoded.rows.tolist() == landed
    assert [(d.index, d.reason) for d in decoded.dead] == [
        (i, reason) for i, (_, reason) in enumerate(cases) if reason is not None
    ]
    by_index = {d.index: d.error for d in decoded.dead}
    assert by_index[6] == f"value of {LIMIT + 1} bytes exceeds max_record_bytes ({LIMIT})"
    assert "nests deeper than" in by_index[11]
    assert decoded.batch is not None
    rows = decoded.batch.to_pydict()
    assert rows["id"] == [0, 5, 8, 9, 10, 13]
    assert rows["s"][2:] == ["nl", "crlf", "a b", "\u00e9"]
    assert rows["_kafka_offset"] == [100 + i for i in landed]
    assert rows["_kafka_key"] == [keys[i] for i in landed]  # null keys stay null
    stamps = decoded.batch.column("_kafka_timestamp").cast(pa.int64()).to_pylist()
    assert stamps == [(1_700_000_000_000 + i) * 1000 for i in landed]

    # The same records as a subset of a larger fetch (a routed table's share).
    wider = Fetch.of_records("t", 0, _records([_value(99), *values], [None, *keys]))
    subset = np.arange(1, len(values) + 1, dtype=np.int64)
    again = _decode(wider.take(subset)).placed(subset)
    assert again.rows.tolist() == [i + 1 for i in landed]
    assert [(d.index, d.reason) for d in again.dead] == [
        (d.index + 1, d.reason) for d in decoded.dead
    ]
    assert again.batch is not None
    assert again.batch.to_pydict()["_kafka_key"] == rows["_kafka_key"]


def test_a_fetch_of_150000_records_keeps_every_good_one_and_finds_each_poison() -> None:
    n = 150_000
    poison = {0: b"", 77_777: _value(77_777, LIMIT + 1), 100_000: b"[" * 40, 149_999: b"  "}
    values: list[bytes | None] = [poison.get(i, _value(i)) for i in range(n)]
    values[123_456] = b'{"id":123456,\r\n"s":"x"}'
    fetch = Fetch("t", 3, np.arange(n, dtype=np.int64), values, [None] * n, [0] * n, [[]] * n)
    decoded = _decode(fetch)
    assert [(d.index, d.reason) for d in decoded.dead] == [
        (0, "empty"),
        (77_777, "oversized"),
        (100_000, "too_deep"),
        (149_999, "empty"),
    ]
    assert decoded.batch is not None
    ids = decoded.batch.column("id").to_numpy()
    expected = np.setdiff1d(np.arange(n), list(poison))
    assert np.array_equal(ids, expected)
    assert np.array_equal(decoded.rows, expected)
    assert decoded.batch.column("_kafka_key").null_count == len(expected)


def test_timestamps_and_headers_are_read_only_when_asked_and_follow_take() -> None:
    values: list[bytes | None] = [_value(i) for i in range(6)]
    records = _records(values, [None] * 6)
    fetch = Fetch.of_records("t", 1, records)
    part = fetch.take(np.asarray([1, 3, 5], np.int64)).take(np.asarray([0, 2], np.int64))
    assert part.offsets.tolist() == [101, 105]
    assert part.timestamps.tolist() == [1_700_000_000_001, 1_700_000_000_005]
    assert part.headers == [[("h", b"1")], [("h", b"5")]]
    assert part.values.to_pylist() == [values[1], values[5]]
    assert part.keys.to_pylist() == [None, None]
    assert fetch.value(4) == values[4] and fetch.key(4) is None


async def _drain(
    consumer: AIOKafkaConsumer, batched: bool, total: int
) -> dict[int, list[tuple[int, bytes]]]:
    got: dict[int, list[tuple[int, bytes]]] = {}
    seen = 0
    async with asyncio.timeout(60):
        while seen < total:
            if batched:
                fetched = await getmany(consumer, 200)
            else:
                fetched = await consumer.getmany(timeout_ms=200)
            for tp, records in fetched.items():
                assert len(records) <= 333
                got.setdefault(tp.partition, []).extend((r.offset, r.value) for r in records)
                seen += len(records)
                # The consumer's position follows what was handed out, as aiokafka's.
                assert await consumer.position(tp) >= records[-1].offset + 1
    return got


async def _consumer(broker: Broker, topic: str, group: str) -> AIOKafkaConsumer:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=broker.bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=333,  # cuts the producer's record batches
    )
    await consumer.start()
    consumer.subscribe(topics=[topic])
    return consumer


async def test_batched_getmany_hands_out_what_aiokafka_does_across_cuts_pause_and_seek(
    broker: Broker,
) -> None:
    assert problems() == [], "the aiokafka version changed: check daemon/kafka/_upstream/"
    topic = unique_name("fetch-arrays")
    await create_topic(broker.bootstrap, topic, 2)
    total = 4_000
    values = [json.dumps({"id": i}).encode() for i in range(total)]
    await produce_values(
        broker.bootstrap, topic, values, partition_of=lambda i: i % 2, linger_ms=20
    )
    reference = await _consumer(broker, topic, f"plain-{topic}")
    try:
        expected = await _drain(reference, False, total)
    finally:
        await reference.stop()
    consumer = await _consumer(broker, topic, f"batched-{topic}")
    try:
        got = await _drain(consumer, True, total)
        assert got == expected
        assert sorted(len(v) for v in got.values()) == [total // 2, total // 2]
        # Back to an offset mid-batch on one partition, the other paused: exactly
        # the records from there, in order, and none of the paused partition.
        tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
        consumer.pause(tp0)
        consumer.seek(tp1, 777)
        again = await _drain(consumer, True, total // 2 - 777)
        assert again == {1: expected[1][777:]}
        consumer.resume(tp0)
        assert await getmany(consumer, 300) == {}
    finally:
        await consumer.stop()


def test_a_fetch_is_an_error_without_timestamps_headers_or_records() -> None:
    with pytest.raises(ValueError, match="keys, timestamps and headers, or the records"):
        Fetch("t", 0, [0], [b"{}"], [None])
    fetch = Fetch("t", 0, [0], [b"{}"], [None], [5], [[]])
    assert fetch.timestamps.tolist() == [5]
