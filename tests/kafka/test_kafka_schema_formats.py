"""Kafka formats "protobuf" and "json-schema": records written by Confluent's own serializers
(confluent-kafka's ProtobufSerializer and JSONSerializer, registering their schemas in a real
Apicurio Registry through its Confluent-compatible API), through a real Apache Kafka broker,
into `icespool run` child processes killed with SIGKILL while they consume. Every id lands
exactly once, the table evolves when the producer moves to a schema version with a new
optional field, and the poison records are dead letters with their reasons.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.exceptions import NoSuchTableError
from support.apicurio import PASSWORD, USERNAME, ApicurioRegistry
from support.daemon_harness import CATALOG_NAME, TABLE, Daemon, DaemonDir
from support.kafka_harness import Broker, create_topic, produce_values, unique_name
from support.schema_formats import FORMATS, Writer, expected, normalized, table_schema

from icespool.config import Config
from icespool.errors import ConfigError

PARTITIONS = 3
UNKNOWN_ID = 2**31 - 1
METADATA = [{"name": "_kafka_partition", "type": "int"}, {"name": "_kafka_offset", "type": "long"}]


def _table_keys(fmt: str) -> str:
    """The [[tables]] keys of the table ``fmt``'s events land in; `note` comes with schema
    version 2, by evolution."""
    columns = ",\n".join(
        "  { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in c.items()) + " }"
        for c in [*table_schema(fmt), *METADATA]
    )
    return f'create = true\nevolve = "add-columns"\nschema = [\n{columns},\n]'


def _poison(writer: Writer, i: int, good: bytes) -> tuple[bytes | None, str, str]:
    """The poison record at position ``i``: its value, reason and an error fragment."""
    kind = i % 4
    if kind == 0:
        return (
            b"\x00" + UNKNOWN_ID.to_bytes(4, "big") + good[5:],
            "schema_unavailable",
            (f"schema id {UNKNOWN_ID} unavailable after 3 tries"),
        )
    if kind == 1:
        garbage = b"\x00\xff\xff\xff" if writer.fmt == "protobuf" else b"{not json"
        return (
            good[:5] + garbage,
            "invalid",
            "not Protobuf" if writer.fmt == "protobuf" else ("invalid JSON"),
        )
    if kind == 2:
        return b"\x07" + good[1:], "invalid", "magic byte is 7, not 0"
    return writer.misfit, "invalid", "column 'point'"


def _values(
    fmt: str, registry: ApicurioRegistry, topic: str, n: int
) -> tuple[list[bytes | None], dict[int, tuple[str, str]]]:
    """The ``n`` values to produce and the poison among them (position: reason, error
    fragment): version 1 for the first half, version 2 (with `note`) after; every 97th
    record is poison instead."""
    values: list[bytes | None] = []
    poison: dict[int, tuple[str, str]] = {}
    with Writer(fmt, registry, topic) as writer:
        for i in range(n):
            good = writer.value(i, 1 if i < n // 2 else 2)
            if i % 97 == 50:
                value, reason, fragment = _poison(writer, i // 97, good)
                values.append(value)
                poison[i] = (reason, fragment)
            else:
                values.append(good)
    return values, poison


def _counts(home: DaemonDir) -> tuple[int, int]:
    """The rows of the table and of its dead-letter table (their snapshots' summaries:
    no scan), 0 for a table not made yet."""
    catalog = load_catalog(CATALOG_NAME, **home.catalog_properties)
    try:
        counts = []
        for name in (TABLE, f"{TABLE}_dead_letter"):
            try:
                snapshot = catalog.load_table(name).current_snapshot()
            except NoSuchTableError:
                snapshot = None
            summary = snapshot.summary if snapshot is not None else None
            counts.append(int(summary["total-records"]) if summary is not None else 0)
        return counts[0], counts[1]
    finally:
        engine = getattr(catalog, "engine", None)
        if engine is not None:
            engine.dispose()


async def _wait_drained(home: DaemonDir, daemon: Daemon, good: int, dead: int) -> None:
    """Until the table holds ``good`` rows and its dead-letter table ``dead``: as long as
    they keep growing (a loaded machine may take minutes to get there), and at most two
    minutes without a new row in either."""
    stall, limit = 120.0, 600.0
    start = last_change = time.monotonic()
    seen = (-1, -1)
    while (now := time.monotonic()) - last_change < stall and now - start < limit:
        counts = await asyncio.to_thread(_counts, home)
        if counts[0] >= good and counts[1] >= dead:
            return
        if counts != seen:
            seen, last_change = counts, now
        await asyncio.sleep(1)
    raise AssertionError(f"rows, dead letters: {seen}, expected {(good, dead)}\n{daemon.tail(80)}")


def _dead_rows(home: DaemonDir) -> list[dict[str, Any]]:
    catalog = load_catalog(CATALOG_NAME, **home.catalog_properties)
    try:
        return catalog.load_table(f"{TABLE}_dead_letter").scan().to_arrow().to_pylist()
    finally:
        engine = getattr(catalog, "engine", None)
        if engine is not None:
            engine.dispose()


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
async def test_schema_formats_land_exactly_once_through_kill_9_and_evolve(
    fmt: str, broker: Broker, schema_registry: ApicurioRegistry, tmp_path: Path
) -> None:
    topic = unique_name(f"fmt-{fmt}")
    await create_topic(broker.bootstrap, topic, PARTITIONS)
    n, chunk = 6_000, 500
    values, poison = await asyncio.to_thread(_values, fmt, schema_registry, topic, n)
    # Each start fetches the schemas again (and the kill -9 rounds make four starts): on a
    # loaded machine the registry's JVM may take longer than the default 2 s to answer,
    # and a schema the daemon cannot get makes its records dead letters
    # (`schema_unavailable`), which this test is not about.
    home = DaemonDir(tmp_path / "d")
    home.write_config(
        batch_timeout="1s",
        max_batch_records=2_000,
        table=_table_keys(fmt),
        extra=f"""
[[kafka]]
bootstrap_servers = "{broker.bootstrap}"
group_id = "g-{topic}"
topics = ["{topic}"]
table = "{TABLE}"
format = "{fmt}"
schema_registry_url = "{schema_registry.url}"
schema_registry_username = "{USERNAME}"
schema_registry_password = "{PASSWORD}"
schema_registry_timeout = "30s"
metadata_columns = ["_kafka_partition", "_kafka_offset"]
offset_commit_interval = "1s"
session_timeout = "6s"
""",
    )

    async def produce() -> None:
        for start in range(0, n, chunk):
            await produce_values(
                broker.bootstrap,
                topic,
                values[start : start + chunk],
                partition_of=lambda k, s=start: (s + k) % PARTITIONS,
            )
            await asyncio.sleep(0.4)

    daemon = Daemon(home)
    rng = random.Random(7)
    producer = asyncio.create_task(produce())
    try:
        for _ in range(3):
            daemon.start()
            await daemon.wait_ready()
            await asyncio.sleep(rng.uniform(1.0, 3.0))
            assert daemon.kill() == -9
        await producer
        daemon.start()
        await daemon.wait_ready()
        await _wait_drained(home, daemon, n - len(poison), len(poison))
        await asyncio.sleep(2)  # nothing more may arrive
        rows, table = await asyncio.to_thread(home.read_rows)
        dead = await asyncio.to_thread(_dead_rows, home)
    finally:
        producer.cancel()
        daemon.cleanup()
    ids = Counter(r["id"] for r in rows)
    assert [i for i, c in ids.items() if c > 1] == []
    missing = sorted(set(range(n)) - set(poison) - set(ids))
    reasons = Counter((d["reason"], d["error"][:120]) for d in dead)
    assert missing == [], (len(missing), missing[:10], missing[-10:], reasons, daemon.tail(80))
    assert sorted(ids) == sorted(set(range(n)) - set(poison))
    assert "note" in table.schema().column_names  # evolved for version 2
    for row in rows:
        i = row["id"]
        want = expected(fmt, i, 1 if i < n // 2 else 2)
        got = normalized(fmt, {k: row[k] for k in want})
        assert got == want, (i, got)
    # Each poison record once, by its position (partition i % 3, offset i // 3 of its chunk
    # order: the producer's partitioner is explicit).
    assert len(dead) == len(poison), [(d["reason"], d["error"]) for d in dead]
    by_value = Counter((d["reason"], d["value"]) for d in dead)
    for i, (reason, fragment) in poison.items():
        assert by_value[(reason, values[i])] >= 1, (i, reason)
        matching = [d for d in dead if d["value"] == values[i]]
        assert any(fragment in d["error"] for d in matching), (i, fragment, matching)


# ------------------------------------------------------------------ config


def _kafka_config(make_config: Callable[..., Config], **kafka: Any) -> Config:
    source = {"bootstrap_servers": "127.0.0.1:9092", "topics": ["t"], "table": "demo.t"} | kafka
    return make_config(
        tables=[{"name": "demo.t", "create": True, "schema": [{"name": "a", "type": "long"}]}],
        kafka=[source],
    )


@pytest.mark.parametrize("fmt", ["protobuf", "json-schema"])
@pytest.mark.parametrize(
    ("kafka", "key", "fragment"),
    [
        ({}, "kafka[0].schema_registry_url", "needs 'schema_registry_url'"),
        (
            {"schema_registry_url": "http://r:8081", "avro_schema_file": "/x.avsc"},
            "kafka[0].avro_schema_file",
            'only used with format = "avro"',
        ),
        (
            {"schema_registry_url": "http://r:8081", "schema_registry_username": "u"},
            "kafka[0].schema_registry_username",
            "needs both",
        ),
        (
            {"schema_registry_url": "http://r:8081", "changes": "keyed"},
            "kafka[0].changes",
            "is read as rows only",
        ),
    ],
)
def test_schema_format_config_errors_name_the_key(
    make_config: Callable[..., Config], fmt: str, kafka: dict[str, Any], key: str, fragment: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        _kafka_config(make_config, format=fmt, **kafka)
    assert caught.value.key == key
    assert fragment in caught.value.problem


@pytest.mark.parametrize("fmt", ["protobuf", "json-schema"])
def test_schema_formats_take_the_registry_keys(
    make_config: Callable[..., Config], fmt: str
) -> None:
    config = _kafka_config(
        make_config,
        format=fmt,
        schema_registry_url="https://registry:8081/apis/ccompat/v7",
        schema_registry_username="u",
        schema_registry_password="p",
        schema_registry_timeout="1s",
    )
    assert config.kafka[0].format == fmt
    assert config.kafka[0].schema_registry_timeout == 1.0
