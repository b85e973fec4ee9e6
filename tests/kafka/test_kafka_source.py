"""Kafka source against a real broker (Apache Kafka), in-process daemon: decoding, dead
letters, routing, fencing and broker outages. Process-kill tests are in
test_kafka_faults.py."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import aiohttp
import pyarrow as pa
import pytest
from aiokafka import AIOKafkaConsumer
from prometheus_client.parser import text_string_to_metric_families
from support.kafka_harness import (
    SESSION_TIMEOUT,
    Broker,
    TansuBroker,
    create_topic,
    produce,
    produce_values,
    unique_name,
)
from support.service_helpers import metric, table_rows, wait_rows

from icespool.config import Config
from icespool.kafka._offsets import Ranges, batch_meta, offsets_key
from icespool.lifecycle.service import Icespool

MakeConfig = Callable[..., Config]
TABLE = "demo.events"
SCHEMA = [
    {"name": "id", "type": "long", "required": True},
    {"name": "kind", "type": "string"},
    {"name": "amount", "type": "double"},
]


def _config(make_config: MakeConfig, broker: Broker, topic: str, **kafka: Any) -> Config:
    source = {
        "bootstrap_servers": broker.bootstrap,
        "topics": [topic],
        "group_id": f"g-{topic}",
        "session_timeout": SESSION_TIMEOUT,
        "offset_commit_interval": "1s",
        **kafka,
    }
    source.setdefault("table", TABLE)
    return make_config(
        tables=[{"name": TABLE, "create": True, "schema": SCHEMA}],
        defaults={"batch_timeout": "1s"},
        kafka=[source],
    )


async def test_poison_records_go_to_the_dead_letter_table_and_good_ones_land_once(
    make_config: MakeConfig, broker: Broker
) -> None:
    topic = unique_name("poison")
    await create_topic(broker.bootstrap, topic, 1)
    values: list[bytes | None] = []
    expected_dead: dict[int, tuple[str, str]] = {}  # offset -> (reason, error fragment)
    good_ids: list[int] = []
    for i in range(3000):
        if i % 250 == 7:
            values.append(b'{"id": 1, "kind": ')  # cut off
            expected_dead[i] = ("invalid", "")
        elif i % 250 == 20:
            values.append(json.dumps({"id": "not a number", "kind": "x"}).encode())
            expected_dead[i] = ("invalid", "'id'")
        elif i % 250 == 33:
            values.append(json.dumps({"id": i, "kind": "x" * 5000}).encode())
            expected_dead[i] = ("oversized", "max_record_bytes")
        elif i % 250 == 40:
            values.append(b"null")
            expected_dead[i] = ("invalid", "")
        elif i % 250 == 41:
            values.append(None)  # a tombstone
            expected_dead[i] = ("empty", "no value")
        elif i % 250 == 42:
            values.append(json.dumps({"id": i, "amount": "12x"}).encode())
            expected_dead[i] = ("invalid", "'amount'")
        else:
            values.append(json.dumps({"id": i, "kind": "ok", "amount": i / 4}).encode())
            good_ids.append(i)
    await produce_values(broker.bootstrap, topic, values)
    config = _config(make_config, broker, topic, max_record_bytes="4KiB")
    async with Icespool(config) as service:
        rows = await wait_rows(service, TABLE, len(good_ids))
        dead = await wait_rows(service, f"{TABLE}_dead_letter", len(expected_dead))
        await asyncio.sleep(1.5)  # nothing more arrives
        rows = await asyncio.to_thread(table_rows, service, TABLE)
        dead = await asyncio.to_thread(table_rows, service, f"{TABLE}_dead_letter")
        assert sorted(r["id"] for r in rows) == good_ids
        assert {r["id"]: r["amount"] for r in rows} == {i: i / 4 for i in good_ids}
        assert sorted(d["offset"] for d in dead) == sorted(expected_dead)
        for d in dead:
            reason, fragment = expected_dead[d["offset"]]
            assert d["reason"] == reason, d
            assert fragment in d["error"], d
            assert d["topic"] == topic and d["partition"] == 0
            assert d["value"] == values[d["offset"]]
            assert d["key"] == str(d["offset"]).encode()
            assert d["target_table"] == TABLE
        by_reason = Counter(reason for reason, _ in expected_dead.values())
        for reason, count in by_reason.items():
            assert (
                metric(service, "icespool_dead_letters_total", table=TABLE, reason=reason) == count
            )
        # Both tables now cover every offset of the partition.
        key = offsets_key(f"g-{topic}", topic, 0)
        for table in (TABLE, f"{TABLE}_dead_letter"):
            await _wait_property(service, table, key, "0-2999")
        # The data snapshots name the offsets they cover too (for people reading history).
        assert service._catalog is not None
        snapshots = service._catalog.load_table(TABLE).metadata.snapshots
        covered = [s.summary.get("icespool.kafka-offsets") for s in snapshots if s.summary]
        assert [c for c in covered if c] and all(
            c.startswith(f"g-{topic}/{topic}/0=") for c in covered if c
        ), covered


async def _wait_property(service: Icespool, table: str, key: str, value: str) -> None:
    assert service._catalog is not None
    catalog = service._catalog
    deadline = time.monotonic() + 20
    current = None
    while time.monotonic() < deadline:
        current = await asyncio.to_thread(
            lambda: catalog.load_table(table).metadata.properties.get(key)
        )
        if current == value:
            return
        await asyncio.sleep(0.3)
    raise AssertionError(f"{table}: {key} = {current!r}, expected {value!r}")


async def test_dynamic_routing_writes_each_table_exactly_once_across_restarts(
    make_config: MakeConfig, broker: Broker
) -> None:
    topic = unique_name("routed")
    await create_topic(broker.bootstrap, topic, 3)
    kinds = ["a", "b", "c"]
    tables = [{"name": f"demo.ev_{k}", "create": True, "schema": SCHEMA} for k in kinds]

    def records(start: int, stop: int) -> list[dict[str, Any]]:
        return [
            {"id": i, "kind": kinds[i % 3] if i % 101 else "zzz", "amount": 1.0}
            for i in range(start, stop)
        ]

    config = make_config(
        tables=tables,
        defaults={"batch_timeout": "1s"},
        kafka=[
            {
                "bootstrap_servers": broker.bootstrap,
                "topics": [topic],
                "group_id": f"g-{topic}",
                "session_timeout": SESSION_TIMEOUT,
                "route_field": "kind",
                "table_template": "demo.ev_{value}",
                "offset_commit_interval": "1s",
            }
        ],
    )
    first, second = records(0, 6000), records(6000, 9000)
    await produce(broker.bootstrap, topic, first, partitions=3)
    everything = first + second
    expected = {k: sorted(r["id"] for r in everything if r["kind"] == k) for k in [*kinds, "zzz"]}
    async with Icespool(config) as service:
        for k in kinds:
            await wait_rows(service, f"demo.ev_{k}", sum(1 for r in first if r["kind"] == k))
    # A new process-equivalent (new service, same spool and catalog) resumes where
    # the tables say, and must not add a record twice.
    await produce(broker.bootstrap, topic, second, partitions=3)
    async with Icespool(config) as service:
        for k in kinds:
            rows = await wait_rows(service, f"demo.ev_{k}", len(expected[k]))
        await asyncio.sleep(1.5)
        for k in kinds:
            ids = sorted(
                r["id"] for r in await asyncio.to_thread(table_rows, service, f"demo.ev_{k}")
            )
            assert ids == expected[k], k
        dead = await wait_rows(service, "demo.kafka_dead_letter", len(expected["zzz"]))
        assert sorted(json.loads(d["value"])["id"] for d in dead) == expected["zzz"]
        assert {d["reason"] for d in dead} == {"unknown_route"}
        assert {d["target_table"] for d in dead} == {"demo.ev_zzz"}
    del rows


async def test_a_stalled_replica_cannot_commit_offsets_another_already_committed(
    make_config: MakeConfig, tmp_path: Any
) -> None:
    """Two daemons on one catalog, each holding spooled records of the same Kafka
    range (the stalled owner and the new one): whichever commits second drops the
    rows the first committed, so every offset lands exactly once."""
    shared = make_config(tables=[{"name": TABLE, "create": True, "schema": SCHEMA}])
    other = shared.model_copy(
        update={"spool": shared.spool.model_copy(update={"dir": tmp_path / "spool-b"})}
    )
    key = offsets_key("g", "events", 0)

    def batch(offsets: range) -> pa.RecordBatch:
        return pa.RecordBatch.from_pydict(
            {
                "id": pa.array(list(offsets), pa.int64()),
                "kind": ["x"] * len(offsets),
                "amount": [0.0] * len(offsets),
            }
        )

    async with Icespool(shared) as a, Icespool(other) as b:
        # A (stalled) spooled 0-99; B (new owner) spooled 0-149 and 150-199.
        await a.writer(TABLE).append(
            batch(range(100)),
            batch_meta("g", "events", 0, Ranges.of([(0, 99)]), Ranges.runs(range(100))),
        )
        await b.writer(TABLE).append(
            batch(range(150)),
            batch_meta("g", "events", 0, Ranges.of([(0, 149)]), Ranges.runs(range(150))),
        )
        first = await b.flush(TABLE)
        assert first.records == 150
        late = await a.flush(TABLE)
        assert late.records == 0 and late.snapshot_id is None
        assert metric(a, "icespool_kafka_duplicates_dropped_total", table=TABLE) == 100
        # The other order: A' commits 150-174 first, then B's 150-199 keeps only 175-199.
        await a.writer(TABLE).append(
            batch(range(150, 175)),
            batch_meta("g", "events", 0, Ranges.of([(150, 174)]), Ranges.runs(range(150, 175))),
        )
        await b.writer(TABLE).append(
            batch(range(150, 200)),
            batch_meta("g", "events", 0, Ranges.of([(150, 199)]), Ranges.runs(range(150, 200))),
        )
        assert (await a.flush(TABLE)).records == 25
        assert (await b.flush(TABLE)).records == 25
        ids = sorted(r["id"] for r in await asyncio.to_thread(table_rows, a, TABLE))
        assert ids == list(range(200))
        assert a._catalog is not None
        props = a._catalog.load_table(TABLE).metadata.properties
        assert props[key] == "0-199"


async def _connected(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """icespool_kafka_connected of a scrape, by source."""
    async with http.get(f"{url}/metrics") as response:
        text = await response.text()
    return {
        sample.labels["source"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "icespool_kafka_connected"
    }


async def test_broker_outage_keeps_http_ingest_and_readyz_reports_it(
    make_config: MakeConfig, run_daemon: Callable[..., Any], tmp_path: Any
) -> None:
    # Tansu, not the shared Apache Kafka: the test kills its broker and brings back an
    # empty one on the same port, which Tansu (in memory, started in milliseconds) does
    # in a blink.
    broker = TansuBroker.start(tmp_path)
    try:
        await create_topic(broker.bootstrap, "outage", 2)
        await produce(broker.bootstrap, "outage", [{"id": i} for i in range(100)], partitions=2)
        config = _config(make_config, broker, "outage")
        async with run_daemon(config) as (service, url), aiohttp.ClientSession() as http:
            await wait_rows(service, TABLE, 100)
            async with http.get(f"{url}/readyz") as response:
                assert response.status == 200
            assert await _connected(http, url) == {"kafka[0]": 1.0}
            broker.stop()
            deadline = time.monotonic() + 30
            status, text = 200, ""
            while time.monotonic() < deadline and status == 200:
                await asyncio.sleep(0.5)
                async with http.get(f"{url}/readyz") as response:
                    status, text = response.status, await response.text()
            assert status == 503 and "Kafka not connected" in text, text
            body = b"".join(json.dumps({"id": 1000 + i}).encode() + b"\n" for i in range(5))
            async with http.post(
                f"{url}/v1/tables/{TABLE}/records",
                data=body,
                headers={"Content-Type": "application/x-ndjson"},
            ) as response:
                assert response.status == 200, await response.text()
            assert (await service.flush(TABLE)).records == 5
            async with http.get(f"{url}/v1/status") as response:
                kafka = (await response.json())["kafka"]
                assert kafka["sources"][0]["connected"] is False
                assert kafka["sources"][0]["last_error"]
            assert await _connected(http, url) == {"kafka[0]": 0.0}
            # The broker comes back (empty: it keeps data in memory) on the same port.
            broker = TansuBroker.start(tmp_path, port=broker.port)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and status != 200:
                await asyncio.sleep(0.5)
                async with http.get(f"{url}/readyz") as response:
                    status = response.status
            assert status == 200
            assert await _connected(http, url) == {"kafka[0]": 1.0}
            rows = await asyncio.to_thread(table_rows, service, TABLE)
            assert sorted(r["id"] for r in rows) == [*range(100), *range(1000, 1005)]
    finally:
        broker.stop()


@pytest.mark.parametrize("fmt", ["raw"])
async def test_raw_format_and_metadata_columns(
    make_config: MakeConfig, broker: Broker, fmt: str
) -> None:
    topic = unique_name("rawtopic")
    await create_topic(broker.bootstrap, topic, 1)
    values = [f"payload-{i}".encode() for i in range(50)]
    await produce_values(
        broker.bootstrap, topic, values, headers_of=lambda i: [("h", str(i).encode())]
    )
    config = make_config(
        tables=[
            {
                "name": "demo.raw",
                "create": True,
                "schema": [
                    {"name": "key", "type": "binary"},
                    {"name": "value", "type": "binary"},
                    {"name": "headers", "type": "string"},
                    {"name": "_kafka_topic", "type": "string"},
                    {"name": "_kafka_partition", "type": "int"},
                    {"name": "_kafka_offset", "type": "long"},
                    {"name": "_kafka_timestamp", "type": "timestamptz"},
                    {"name": "_kafka_key", "type": "binary"},
                ],
            }
        ],
        defaults={"batch_timeout": "1s"},
        kafka=[
            {
                "bootstrap_servers": broker.bootstrap,
                "topics": [topic],
                "group_id": f"g-{topic}",
                "session_timeout": SESSION_TIMEOUT,
                "table": "demo.raw",
                "format": fmt,
                "metadata_columns": [
                    "_kafka_topic",
                    "_kafka_partition",
                    "_kafka_offset",
                    "_kafka_timestamp",
                    "_kafka_key",
                ],
            }
        ],
    )
    async with Icespool(config) as service:
        rows = await wait_rows(service, "demo.raw", 50)
    rows.sort(key=lambda r: r["_kafka_offset"])
    assert [r["value"] for r in rows] == values
    assert [r["_kafka_offset"] for r in rows] == list(range(50))
    assert {r["_kafka_topic"] for r in rows} == {topic}
    assert {r["_kafka_partition"] for r in rows} == {0}
    assert [r["key"] for r in rows] == [str(i).encode() for i in range(50)]
    assert [r["_kafka_key"] for r in rows] == [str(i).encode() for i in range(50)]
    assert [json.loads(r["headers"]) for r in rows][3] == [["h", "Mw=="]]
    assert all(r["_kafka_timestamp"] is not None for r in rows)


async def test_dead_letters_to_a_topic_carry_the_record_and_why(
    make_config: MakeConfig, broker: Broker
) -> None:
    topic, dlq = unique_name("to-dlq"), unique_name("to-dlq-dead")
    await create_topic(broker.bootstrap, topic, 1)
    await create_topic(broker.bootstrap, dlq, 1)
    values = [json.dumps({"id": i}).encode() if i % 10 else b"{broken" for i in range(100)]
    await produce_values(
        broker.bootstrap, topic, values, headers_of=lambda i: [("trace", f"t{i}".encode())]
    )
    config = _config(make_config, broker, topic, dead_letter=dlq)
    async with Icespool(config) as service:
        rows = await wait_rows(service, TABLE, 90)
        consumer = AIOKafkaConsumer(
            dlq, bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest"
        )
        await consumer.start()
        try:
            got: list[Any] = []
            deadline = time.monotonic() + 30
            while len(got) < 10 and time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=500)
                got.extend(r for records in batch.values() for r in records)
        finally:
            await consumer.stop()
        assert metric(service, "icespool_dead_letters_total", table=TABLE, reason="invalid") == 10
    assert sorted(r["id"] for r in rows) == [i for i in range(100) if i % 10]
    assert len(got) == 10
    for record in got:
        headers = dict(record.headers)
        offset = int(headers["icespool.offset"])
        assert offset % 10 == 0 and record.value == b"{broken"
        assert record.key == str(offset).encode()
        assert headers["trace"] == f"t{offset}".encode()
        assert headers["icespool.topic"] == topic.encode()
        assert headers["icespool.partition"] == b"0"
        assert headers["icespool.reason"] == b"invalid"
        assert headers["icespool.target_table"] == TABLE.encode()
        assert headers["icespool.error"]
    assert sorted(int(dict(r.headers)["icespool.offset"]) for r in got) == list(range(0, 100, 10))


async def test_fetches_waiting_their_longest_keep_the_source_ready_and_a_trickle_visible(
    make_config: MakeConfig, broker: Broker
) -> None:
    """fetch_max_wait at its bound and fetch_min_bytes more than the whole topic holds:
    every fetch waits on the broker its full second, on the connection the
    reachability probe (every offset_commit_interval) also uses. The probe still
    answers in time, and each trickled record is visible within batch_timeout +
    fetch_max_wait and a commit."""
    topic = unique_name("fetchwait")
    await create_topic(broker.bootstrap, topic, 2)
    config = _config(make_config, broker, topic, fetch_min_bytes="1MiB", fetch_max_wait="1s")
    async with Icespool(config) as service:
        await produce(broker.bootstrap, topic, [{"id": 0}])
        await wait_rows(service, TABLE, 1, within=60)
        samples: list[float] = []

        async def sample() -> None:
            while True:
                samples.append(metric(service, "icespool_kafka_connected", source="kafka[0]"))
                await asyncio.sleep(0.25)

        sampler = asyncio.create_task(sample())
        try:
            for n in range(1, 5):
                await produce(broker.bootstrap, topic, [{"id": n}])
                produced = time.monotonic()
                await wait_rows(service, TABLE, n + 1, within=30)
                # 1 s batch_timeout + 1 s fetch wait; a commit and wait_rows' polling.
                assert time.monotonic() - produced < 5.0, n
            await asyncio.sleep(6.0)  # several probes with nothing to fetch at all
        finally:
            sampler.cancel()
        assert len(samples) > 30 and set(samples) == {1.0}, samples
        rows = await asyncio.to_thread(table_rows, service, TABLE)
        assert sorted(r["id"] for r in rows) == list(range(5))
