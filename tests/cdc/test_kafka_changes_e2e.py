"""Kafka changes end to end: a real broker (Apache Kafka), an in-process daemon with an upsert
table, and the table's merged state read back from its committed data and
equality-delete files (computed here, independently of the daemon's readers).

A Debezium-shaped stream (c/r/u/d, tombstones, re-inserts, both JSON spellings,
deletes keyed by ``before`` or by the Kafka key) with poison mixed in: the merged
table equals the final state computed in the test key by key, every poison record
is exactly one dead letter with its reason, every offset is consumed once.
"""

from __future__ import annotations

import asyncio
import io
import json
import random
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from aiokafka import AIOKafkaProducer
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.manifest import DataFileContent
from support.apicurio import PASSWORD, USERNAME, ApicurioRegistry
from support.daemon_harness import TABLE as HARNESS_TABLE
from support.daemon_harness import Daemon, DaemonDir
from support.kafka_harness import SESSION_TIMEOUT, Broker, create_topic, unique_name
from support.service_helpers import metric, table_rows

from icespool.cdc import read_merged
from icespool.config import Config
from icespool.kafka._offsets import ranges_from_properties
from icespool.lifecycle.service import Icespool

MakeConfig = Callable[..., Config]
TABLE = "cdc.items"
DEAD = f"{TABLE}_dead_letter"
APPEND = "cdc.log"
SCHEMA = [
    {"name": "id", "type": "long", "required": True},
    {"name": "name", "type": "string"},
    {"name": "qty", "type": "long", "required": True},
]
PARTITIONS = 2
Record = tuple[int, bytes | None, bytes | None]  # partition, key, value


def _j(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _stream(
    seed: int, changes: int, keys: int
) -> tuple[list[Record], dict[int, dict[str, Any]], dict[tuple[int, int], str]]:
    """Changes of ``keys`` ids with poison mixed in; returns the records, the final
    state by id and the poison's expected reason by (partition, offset)."""
    rng = random.Random(seed)
    state: dict[int, dict[str, Any]] = {}
    records: list[Record] = []
    poison: dict[tuple[int, int], str] = {}
    sent = Counter[int]()

    def send(partition: int, key: bytes | None, value: bytes | None, reason: str | None) -> None:
        if reason is not None:
            poison[(partition, sent[partition])] = reason
        records.append((partition, key, value))
        sent[partition] += 1

    schema_doc = {"type": "struct", "optional": False, "name": "shop.items.Envelope"}
    for n in range(changes):
        i = rng.randrange(keys)
        p = i % PARTITIONS  # Debezium keeps a key in one partition
        key = _j({"id": i}) if n % 3 else _j({"schema": {"type": "struct"}, "payload": {"id": i}})
        before = state.get(i)
        roll = rng.random()
        if before is None or roll < 0.6:
            after = {"id": i, "name": f"n{n}", "qty": n}
            op = "c" if before is None else "u"
            op = "r" if before is None and roll < 0.1 else op
            change: dict[str, Any] = {"op": op, "before": before, "after": after}
            change["source"] = {"connector": "postgresql", "lsn": n, "snapshot": op == "r"}
            state[i] = after
        else:
            # A delete keyed by `before` or (before without key columns) by the Kafka key.
            change = {"op": "d", "before": before if roll < 0.8 else None, "after": None}
            del state[i]
        value = _j({"schema": schema_doc, "payload": change}) if n % 4 == 0 else _j(change)
        send(p, key, value, None)
        if change["op"] == "d" and roll < 0.9:
            send(p, key, None, None)  # Debezium's tombstone
        if n % 97 == 0:  # poison, which must change nothing
            kind = (n // 97) % 8
            if kind == 0:
                send(p, key, _j({"op": "t", "source": {}}), "bad_change")
            elif kind == 1:
                send(p, key, _j({"after": {"id": i, "qty": 1}}), "bad_change")
            elif kind == 2:
                # A tombstone without a key (aiokafka sends no null key with a null value;
                # an empty value is a tombstone too).
                send(p, None, b"", "missing_key")
            elif kind == 3:
                send(p, _j({"id": "x"}), None, "bad_key")
            elif kind == 4:
                send(p, key, _j({"op": "u", "after": {"id": i, "name": "x" * 3000, "qty": 1}}),
                     "oversized")  # fmt: skip
            elif kind == 5:
                deep = b'{"op":"u","after":{"id":1,"qty":1,"name":' + b"[" * 500 + b"]" * 500
                send(p, key, deep + b"}}", "too_deep")
            elif kind == 6:
                send(p, key, b'{"op":"u","after":{"id":1,"qty":1,"name":"\xff"}}', "bad_utf8")
            else:
                send(p, key, _j({"op": "u", "after": {"id": i, "name": "no qty"}}), "invalid")
    return records, state, poison


async def _produce(bootstrap: str, topic: str, records: list[Record]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        futures = [
            await producer.send(topic, value=value, key=key, partition=p)
            for p, key, value in records
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


def merged(service: Icespool, table: str) -> list[dict[str, Any]]:
    """The table's merged state through the daemon's reader (`icespool.cdc.read_merged`)."""
    assert service._catalog is not None
    rows: list[dict[str, Any]] = read_merged(service._catalog.load_table(table)).to_pylist()
    return rows


def merged_rows(service: Icespool, table: str) -> list[dict[str, Any]]:
    """The same, computed here independently of the daemon: a row of a data file with
    data sequence number s is gone when a delete file of sequence number > s holds its
    key (Iceberg's rule), read from the current snapshot's manifests."""
    assert service._catalog is not None
    loaded = service._catalog.load_table(table)
    snapshot = loaded.current_snapshot()
    if snapshot is None:
        return []
    io = loaded.io
    data: list[tuple[str, int, pa.Table]] = []
    deleted: dict[tuple[Any, ...], int] = {}  # key -> highest delete sequence number
    # (data file, position) -> highest sequence number of a position delete naming it
    positions: dict[tuple[str, int], int] = {}
    for manifest in snapshot.manifests(io):
        for entry in manifest.fetch_manifest_entry(io, discard_deleted=True):
            file = entry.data_file
            assert entry.sequence_number is not None
            with io.new_input(file.file_path).open() as stream:
                rows = pq.read_table(stream)
            if file.content == DataFileContent.DATA:
                data.append((file.file_path, entry.sequence_number, rows))
            elif file.content == DataFileContent.POSITION_DELETES:
                for path, pos in zip(
                    rows.column("file_path").to_pylist(),
                    rows.column("pos").to_pylist(),
                    strict=True,
                ):
                    at = (path, pos)
                    positions[at] = max(positions.get(at, 0), entry.sequence_number)
            else:
                assert file.content == DataFileContent.EQUALITY_DELETES, file.content
                names = [loaded.schema().find_column_name(f) for f in file.equality_ids or []]
                for key in zip(*(rows.column(n).to_pylist() for n in names), strict=True):
                    deleted[key] = max(deleted.get(key, 0), entry.sequence_number)
    key_names = [loaded.schema().find_column_name(f) for f in loaded.schema().identifier_field_ids]
    out: list[dict[str, Any]] = []
    for path, sequence, rows in data:
        for pos, row in enumerate(rows.to_pylist()):
            if positions.get((path, pos), 0) >= sequence:
                continue  # a position delete applies to files of its sequence number or older
            if deleted.get(tuple(row[n] for n in key_names), 0) <= sequence:
                out.append(row)
    return out


async def test_debezium_stream_with_poison_merges_to_the_final_state_key_by_key(
    make_config: MakeConfig, broker: Broker
) -> None:
    topic = unique_name("cdc-debezium")
    await create_topic(broker.bootstrap, topic, PARTITIONS)
    records, state, poison = _stream(seed=16, changes=3000, keys=300)
    group = f"g-{topic}"
    config = make_config(
        tables=[{"name": TABLE, "create": True, "schema": SCHEMA, "key": ["id"]}],
        defaults={"batch_timeout": "1s"},
        kafka=[
            {
                "bootstrap_servers": broker.bootstrap,
                "topics": [topic],
                "group_id": group,
                "session_timeout": SESSION_TIMEOUT,
                "offset_commit_interval": "1s",
                "table": TABLE,
                "changes": "debezium",
                "max_record_bytes": 2000,
                "max_poll_records": 500,  # several fetches, several commits
            }
        ],
    )
    # Two runs: the second daemon resumes from the offsets the first one committed.
    half = len(records) // 2
    for part in (records[:half], records):
        await _produce(broker.bootstrap, topic, part[half:] if part is records else part)
        counts = Counter(p for p, _, _ in part)
        async with Icespool(config) as service:
            assert await _wait_claims(service, group, topic, counts), "offsets not all claimed"
    expected = dict(state)
    async with Icespool(config) as service:
        await asyncio.sleep(1.5)  # a third start: nothing more arrives, nothing twice
        rows = await asyncio.to_thread(merged, service, TABLE)
        dead = await asyncio.to_thread(table_rows, service, DEAD)
        assert len(rows) == len(expected)  # no key twice
        assert _by_key(rows) == expected
        independent = await asyncio.to_thread(merged_rows, service, TABLE)
        assert sorted(map(_row_key, independent)) == sorted(map(_row_key, rows))
        assert Counter((d["partition"], d["offset"]) for d in dead) == Counter(poison.keys())
        assert {(d["partition"], d["offset"]): d["reason"] for d in dead} == poison
        assert all(d["target_table"] == TABLE for d in dead)
        assert metric(service, "icespool_kafka_duplicates_dropped_total", table=TABLE) == 0
        counts = Counter(p for p, _, _ in records)
        assert await _wait_claims(service, group, topic, counts, within=0)


async def _wait_claims(
    service: Icespool, group: str, topic: str, counts: Counter[int], within: float = 60
) -> bool:
    """Whether (polling up to ``within`` s) the table's offset claims are exactly
    0..count-1 of every partition: each offset consumed once, none skipped."""
    deadline = time.monotonic() + within
    while True:
        assert service._catalog is not None
        properties = (await asyncio.to_thread(service._catalog.load_table, TABLE)).properties
        spans = {p: list(ranges_from_properties(properties, group, topic, p).spans) for p in counts}
        if spans == {p: [(0, n - 1)] for p, n in counts.items()}:
            return True
        if time.monotonic() >= deadline:
            print(f"claims: {spans}, expected {dict(counts)}")
            return False
        await asyncio.sleep(0.3)


def _rows_or_none(service: Icespool, table: str) -> list[dict[str, Any]]:
    try:
        return table_rows(service, table)
    except NoSuchTableError:  # the dead-letter table appears with its first rows
        return []


def _row_key(row: dict[str, Any]) -> tuple[int, str, int]:
    return (row["id"], row["name"], row["qty"])


def _by_key(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {r["id"]: {"id": r["id"], "name": r["name"], "qty": r["qty"]} for r in rows}


async def test_keyed_records_and_an_append_table(make_config: MakeConfig, broker: Broker) -> None:
    """``changes = "keyed"``: the value is the row, a null value deletes by the Kafka
    key (string keys); the same stream into a table without a key appends the rows
    and dead-letters the deletes as ``not_upsert`` (and rows without their key column
    as ``invalid``: a table without a key takes nothing from the Kafka key)."""
    topic = unique_name("cdc-keyed")
    await create_topic(broker.bootstrap, topic, 1)
    rng = random.Random(7)
    state: dict[int, dict[str, Any]] = {}
    records: list[Record] = []
    upserts: list[dict[str, Any]] = []  # the rows holding their key
    deletes: list[int] = []  # offsets
    keyless: list[int] = []  # offsets of rows that leave the key to the Kafka key
    offsets: dict[int, int] = {}  # the offset of each key's last upsert
    for n in range(600):
        i = rng.randrange(60)
        if i in state and rng.random() < 0.3:
            deletes.append(len(records))
            records.append((0, str(i).encode(), None))
            del state[i]
        else:
            row = {"id": i, "name": f"n{n}", "qty": n}
            # Half the rows leave the key to the Kafka key.
            if n % 2:
                upserts.append(row)
            else:
                keyless.append(len(records))
            value = row if n % 2 else {"name": row["name"], "qty": n}
            records.append((0, str(i).encode(), _j(value)))
            state[i] = row
            offsets[i] = len(records) - 1
    await _produce(broker.bootstrap, topic, records)
    with_offset = [*SCHEMA, {"name": "_kafka_offset", "type": "long"}]
    source = {
        "bootstrap_servers": broker.bootstrap,
        "topics": [topic],
        "session_timeout": SESSION_TIMEOUT,
        "offset_commit_interval": "1s",
        "changes": "keyed",
        "key_format": "string",
        "metadata_columns": ["_kafka_offset"],
    }
    config = make_config(
        tables=[
            {"name": TABLE, "create": True, "schema": with_offset, "key": ["id"]},
            {"name": APPEND, "create": True, "schema": with_offset},
        ],
        defaults={"batch_timeout": "1s"},
        kafka=[
            {**source, "group_id": f"g-keyed-{topic}", "table": TABLE},
            {**source, "group_id": f"g-append-{topic}", "table": APPEND},
        ],
    )
    async with Icespool(config) as service:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            now = await asyncio.to_thread(merged, service, TABLE)
            appended = await asyncio.to_thread(_rows_or_none, service, APPEND)
            dead = await asyncio.to_thread(_rows_or_none, service, f"{APPEND}_dead_letter")
            if (
                _by_key(now) == state
                and len(appended) >= len(upserts)
                and len(dead) >= len(deletes) + len(keyless)
            ):
                break
            await asyncio.sleep(0.5)
        await asyncio.sleep(1.5)
        rows = await asyncio.to_thread(merged, service, TABLE)
        appended = await asyncio.to_thread(table_rows, service, APPEND)
        dead = await asyncio.to_thread(table_rows, service, f"{APPEND}_dead_letter")
        assert len(rows) == len(state) and _by_key(rows) == state
        assert {r["id"]: r["_kafka_offset"] for r in rows} == {i: offsets[i] for i in state}
        key = lambda r: (r["id"], r["qty"])  # noqa: E731
        assert sorted(map(key, appended)) == sorted(map(key, upserts))
        reasons = {d["offset"]: d["reason"] for d in dead}
        assert len(dead) == len(reasons)  # each once
        expected_dead = dict.fromkeys(deletes, "not_upsert") | dict.fromkeys(keyless, "invalid")
        assert reasons == expected_dead
        assert _rows_or_none(service, f"{TABLE}_dead_letter") == []


async def test_debezium_avro_through_the_schema_registry(
    make_config: MakeConfig, broker: Broker, schema_registry: ApicurioRegistry
) -> None:
    """``format = "avro"``, ``key_format = "avro"``: Debezium's Avro envelopes and keys
    (Confluent wire format) through a real schema registry into the upsert table."""
    row = {
        "type": "record",
        "name": "Value",
        "namespace": "shop.items",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "name", "type": ["null", "string"], "default": None},
            {"name": "qty", "type": "long"},
        ],
    }
    envelope = {
        "type": "record",
        "name": "Envelope",
        "namespace": "shop.items",
        "fields": [
            {"name": "before", "type": ["null", row], "default": None},
            {"name": "after", "type": ["null", "shop.items.Value"], "default": None},
            {"name": "source", "type": {"type": "map", "values": "string"}},
            {"name": "op", "type": "string"},
            {"name": "ts_ms", "type": ["null", "long"], "default": None},
        ],
    }
    key_schema = {"type": "record", "name": "Key", "fields": [{"name": "id", "type": "long"}]}
    # Debezium's Avro converter registers the topic's value and key subjects.
    topic = unique_name("cdc-avro")
    envelope_id = schema_registry.register(f"{topic}-value", envelope)
    key_id = schema_registry.register(f"{topic}-key", key_schema)
    unknown_id = 2**31 - 1  # a registry's ids count up from 1

    def framed(schema_id: int, schema: dict[str, Any], record: dict[str, Any]) -> bytes:
        out = io.BytesIO()
        fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
        return b"\x00" + schema_id.to_bytes(4, "big") + out.getvalue()

    rng = random.Random(3)
    state: dict[int, dict[str, Any]] = {}
    records: list[Record] = []
    poison: dict[int, str] = {}
    for n in range(400):
        i = rng.randrange(40)
        key = framed(key_id, key_schema, {"id": i})
        before = state.get(i)
        if before is not None and rng.random() < 0.3:
            change = {"before": before, "after": None, "op": "d"}
            del state[i]
            records.append((0, key, framed(envelope_id, envelope, {**change, "source": {}})))
            records.append((0, key, None))  # tombstone: the Avro key says which
        else:
            after = {"id": i, "name": f"n{n}", "qty": n}
            op = "u" if before else "c"
            change = {"before": before, "after": after, "op": op, "source": {"db": "shop"}}
            state[i] = after
            records.append((0, key, framed(envelope_id, envelope, change)))
        if n % 50 == 0:
            poison[len(records)] = "bad_change"
            records.append((0, key, framed(envelope_id, envelope, {"op": "t", "source": {}})))
            poison[len(records)] = "schema_unavailable"
            records.append((0, key, framed(unknown_id, envelope, {"op": "c", "source": {}})))
    await create_topic(broker.bootstrap, topic, 1)
    await _produce(broker.bootstrap, topic, records)
    config = make_config(
        tables=[{"name": TABLE, "create": True, "schema": SCHEMA, "key": ["id"]}],
        defaults={"batch_timeout": "1s"},
        kafka=[
            {
                "bootstrap_servers": broker.bootstrap,
                "topics": [topic],
                "group_id": f"g-{topic}",
                "session_timeout": SESSION_TIMEOUT,
                "table": TABLE,
                "changes": "debezium",
                "format": "avro",
                "key_format": "avro",
                "schema_registry_url": schema_registry.url,
                "schema_registry_username": USERNAME,
                "schema_registry_password": PASSWORD,
                "schema_registry_timeout": "1s",
            }
        ],
    )
    async with Icespool(config) as service:
        counts = Counter(p for p, _, _ in records)
        assert await _wait_claims(service, f"g-{topic}", topic, counts)
        rows = await asyncio.to_thread(merged, service, TABLE)
        dead = await asyncio.to_thread(table_rows, service, DEAD)
    assert len(rows) == len(state) and _by_key(rows) == state
    assert {d["offset"]: d["reason"] for d in dead} == poison
    assert len(dead) == len(poison)
    unknown = f"schema id {unknown_id} unavailable after 3 tries: the registry answered 404"
    assert {d["error"] for d in dead if d["reason"] == "schema_unavailable"} == {
        f"{unknown}: Schema {unknown_id} not found."
    }


@pytest.mark.slow
async def test_kill_9_mid_stream_keeps_debezium_changes_exactly_once(
    broker: Broker, tmp_path: Path
) -> None:
    """SIGKILL of a real ``icespool run`` child while it consumes Debezium changes:
    after the restart the merged table is the final state key by key, every poison
    record one dead letter, every offset claimed once."""
    topic = unique_name("cdc-kill")
    await create_topic(broker.bootstrap, topic, PARTITIONS)
    rng = random.Random(9)
    state: dict[int, str] = {}
    records: list[Record] = []
    poison: set[tuple[int, int]] = set()
    sent = Counter[int]()

    def send(p: int, key: bytes | None, value: bytes | None) -> None:
        records.append((p, key, value))
        sent[p] += 1

    for n in range(6000):
        i = rng.randrange(300)
        p, key = i % PARTITIONS, _j({"id": i})
        if i in state and rng.random() < 0.25:
            send(p, key, _j({"op": "d", "before": {"id": i, "v": state.pop(i)}}))
            send(p, key, None)
        else:
            change = {"op": "u" if i in state else "c", "after": {"id": i, "v": f"v{n}"}}
            state[i] = f"v{n}"
            plain = _j(change)
            send(p, key, plain if n % 3 else _j({"schema": {}, "payload": change}))
        if n % 500 == 0:
            poison.add((p, sent[p]))
            send(p, key, _j({"op": "m", "source": {}}))
    home = DaemonDir(tmp_path / "d")
    home.write_config(
        batch_timeout="1s",
        extra=f"""key = ["id"]

[[kafka]]
bootstrap_servers = "{broker.bootstrap}"
group_id = "g-{topic}"
topics = ["{topic}"]
table = "{HARNESS_TABLE}"
changes = "debezium"
offset_commit_interval = "1s"
session_timeout = "6s"
max_poll_records = 1000
""",
    )
    daemon = Daemon(home)
    half = len(records) // 2
    try:
        # One kill mid-stream (a start costs seconds; the in-process tests cover
        # restarts): half the stream is there at the start, half comes after the kill.
        await _produce(broker.bootstrap, topic, records[:half])
        daemon.start()
        await daemon.wait_ready()
        await asyncio.sleep(rng.uniform(0.3, 1.5))
        assert daemon.kill() == -9
        await _produce(broker.bootstrap, topic, records[half:])
        daemon.start()
        await daemon.wait_ready()
        deadline = time.monotonic() + 60
        expected = {p: [(0, n - 1)] for p, n in sent.items()}
        while True:
            table, catalog = await asyncio.to_thread(home.load_table)
            claims = {
                p: list(ranges_from_properties(table.properties, f"g-{topic}", topic, p).spans)
                for p in sent
            }
            # The dead-letter table commits on its own batch_timeout, after the claims
            # of the table its records were routed from.
            dead_table = catalog.load_table(f"{HARNESS_TABLE}_dead_letter")
            dead_rows = len(await asyncio.to_thread(dead_table.scan().to_arrow))
            if (claims == expected and dead_rows >= len(poison)) or time.monotonic() > deadline:
                break
            catalog.engine.dispose()
            await asyncio.sleep(0.5)
        assert claims == expected, daemon.tail()
        rows = await asyncio.to_thread(read_merged, table)
        dead = catalog.load_table(f"{HARNESS_TABLE}_dead_letter").scan().to_arrow().to_pylist()
        catalog.engine.dispose()
        assert rows.num_rows == len(state)  # no key twice
        assert dict(zip(rows["id"].to_pylist(), rows["v"].to_pylist(), strict=True)) == state
        assert Counter((d["partition"], d["offset"]) for d in dead) == Counter(poison)
        assert {d["reason"] for d in dead} == {"bad_change"}
    finally:
        daemon.cleanup()
