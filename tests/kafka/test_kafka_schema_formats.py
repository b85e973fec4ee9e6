"""Kafka formats "protobuf" and "json-schema": records written by Confluent's own serializers
(confluent-kafka's ProtobufSerializer and JSONSerializer, registering their schemas in a real
Apicurio Registry through its Confluent-compatible API), through a real Apache Kafka broker,
into `icespool run` child processes killed with SIGKILL while they consume. Every id lands
exactly once, the table evolves when the producer moves to a schema version with a new
optional field, and the poison records are dead letters with their reasons.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc_tools
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from pyiceberg.catalog import load_catalog
from support.apicurio import PASSWORD, USERNAME, ApicurioRegistry
from support.daemon_harness import CATALOG_NAME, TABLE, Daemon, DaemonDir
from support.kafka_harness import Broker, create_topic, produce_values, unique_name

from icespool.config import Config
from icespool.errors import ConfigError

UTC = dt.UTC
PARTITIONS = 3
UNKNOWN_ID = 2**31 - 1
START = dt.datetime(2025, 1, 1, tzinfo=UTC)

# The table both formats land in; `note` comes with schema version 2, by evolution.
TABLE_KEYS = """create = true
evolve = "add-columns"
schema = [
  { name = "id", type = "long", required = true },
  { name = "name", type = "string" },
  { name = "ts", type = "timestamptz" },
  { name = "point", type = "struct<x: long, y: double>" },
  { name = "tags", type = "list<string>" },
  { name = "kind", type = "string" },
]"""

PROTO = """syntax = "proto3";
package demo;
import "google/protobuf/timestamp.proto";
message Point {{ int64 x = 1; double y = 2; }}
message Event {{
  int64 id = 1;
  string name = 2;
  google.protobuf.Timestamp ts = 3;
  Point point = 4;
  repeated string tags = 5;
  enum Kind {{ UNKNOWN = 0; CLICK = 1; VIEW = 2; }}
  Kind kind = 6;
  {extra}
}}
"""


def _json_schema(version: int) -> str:
    properties: dict[str, Any] = {
        "id": {"type": "integer"},
        "name": {"type": "string"},
        "ts": {"type": "string", "format": "date-time"},
        "point": {
            "type": "object",
            "properties": {"x": {"type": "integer"}, "y": {"type": "number"}},
        },
        "tags": {"type": "array", "items": {"type": "string"}},
        "kind": {"type": "string", "enum": ["UNKNOWN", "CLICK", "VIEW"]},
    }
    if version == 2:
        properties["note"] = {"oneOf": [{"type": "null"}, {"type": "string"}]}
    return json.dumps(
        {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "title": "Event",
            "type": "object",
            "properties": properties,
            "required": ["id"],
        }
    )


def _message_class(text: str) -> Any:
    """demo.Event of ``text``, compiled by protoc (grpcio-tools) into a pool of its own."""
    include = str(Path(grpc_tools.__file__).parent / "_proto")
    with tempfile.TemporaryDirectory() as scratch:
        (Path(scratch) / "event.proto").write_text(text)
        out = Path(scratch) / "out.pb"
        protoc = [sys.executable, "-m", "grpc_tools.protoc", f"-I{scratch}", f"-I{include}"]
        subprocess.run(
            [*protoc, "--include_imports", f"--descriptor_set_out={out}", "event.proto"],
            check=True,
        )
        files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for file in files.file:
        pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("demo.Event"))


def _event(i: int) -> dict[str, Any]:
    return {
        "id": i,
        "name": f"événement {i}",
        "ts": START + dt.timedelta(seconds=i, microseconds=i),
        "point": {"x": i, "y": i / 2},
        "tags": [f"t{j}" for j in range(i % 3)],
        "kind": ["UNKNOWN", "CLICK", "VIEW"][i % 3],
    }


class Writer:
    """The producer side of one format: version 1 and 2 serializers and a value whose
    schema does not fit the table."""

    def __init__(self, fmt: str, registry: ApicurioRegistry, topic: str) -> None:
        client = SchemaRegistryClient(
            {"url": registry.url, "basic.auth.user.info": f"{USERNAME}:{PASSWORD}"}
        )
        self.context = SerializationContext(topic, MessageField.VALUE)
        self.fmt = fmt
        if fmt == "protobuf":
            conf = {"use.deprecated.format": False}
            self.classes = {
                1: _message_class(PROTO.format(extra="")),
                2: _message_class(PROTO.format(extra="optional string note = 7;")),
            }
            self.serializers = {
                v: ProtobufSerializer(cls, client, conf) for v, cls in self.classes.items()
            }
            # `point` a string: the table's struct column cannot take it.
            misfit = _message_class(
                'syntax = "proto3"; package demo; message Event { int64 id = 1; string point = 4; }'
            )
            self.misfit = ProtobufSerializer(misfit, client, conf)(
                misfit(id=-1, point="p"),
                SerializationContext(f"{topic}-misfit", MessageField.VALUE),
            )
        else:
            self.serializers = {v: JSONSerializer(_json_schema(v), client) for v in (1, 2)}
            misfit_schema = json.dumps(
                {
                    "type": "object",
                    "properties": {"id": {"type": "integer"}, "point": {"type": "string"}},
                }
            )
            self.misfit = JSONSerializer(misfit_schema, client)(
                {"id": -1, "point": "p"},
                SerializationContext(f"{topic}-misfit", MessageField.VALUE),
            )

    def value(self, i: int, version: int) -> bytes:
        event = _event(i)
        if version == 2:
            event["note"] = f"note {i}" if i % 2 else None
        if self.fmt == "protobuf":
            message = self.classes[version]()
            message.id, message.name = event["id"], event["name"]
            message.ts.FromDatetime(event["ts"])
            message.point.x, message.point.y = event["point"]["x"], event["point"]["y"]
            message.tags.extend(event["tags"])
            message.kind = i % 3
            if event.get("note") is not None:
                message.note = event["note"]
            value: bytes = self.serializers[version](message, self.context)
        else:
            event["ts"] = event["ts"].isoformat()
            value = self.serializers[version](event, self.context)
        return value


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


def _dead_rows(home: DaemonDir) -> list[dict[str, Any]]:
    catalog = load_catalog(CATALOG_NAME, **home.catalog_properties)
    try:
        return catalog.load_table(f"{TABLE}_dead_letter").scan().to_arrow().to_pylist()
    finally:
        engine = getattr(catalog, "engine", None)
        if engine is not None:
            engine.dispose()


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["protobuf", "json-schema"])
async def test_schema_formats_land_exactly_once_through_kill_9_and_evolve(
    fmt: str, broker: Broker, schema_registry: ApicurioRegistry, tmp_path: Path
) -> None:
    topic = unique_name(f"fmt-{fmt}")
    await create_topic(broker.bootstrap, topic, PARTITIONS)
    writer = await asyncio.to_thread(Writer, fmt, schema_registry, topic)
    n, chunk = 6_000, 500
    # Version 1 for the first half, version 2 (with `note`) after; every 97th record is
    # poison instead.
    values: list[bytes | None] = []
    poison: dict[int, tuple[str, str]] = {}
    for i in range(n):
        good = writer.value(i, 1 if i < n // 2 else 2)
        if i % 97 == 50:
            value, reason, fragment = _poison(writer, i // 97, good)
            values.append(value)
            poison[i] = (reason, fragment)
        else:
            values.append(good)
    home = DaemonDir(tmp_path / "d")
    home.write_config(
        batch_timeout="1s",
        max_batch_records=2_000,
        table=TABLE_KEYS,
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
        good = n - len(poison)
        deadline = time.monotonic() + 120
        rows: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            rows, _ = await asyncio.to_thread(home.read_rows)
            if len(rows) >= good:
                break
            await asyncio.sleep(1)
        await asyncio.sleep(2)  # nothing more may arrive
        rows, table = await asyncio.to_thread(home.read_rows)
        dead = await asyncio.to_thread(_dead_rows, home)
    finally:
        producer.cancel()
        daemon.cleanup()
    ids = Counter(r["id"] for r in rows)
    assert [i for i, c in ids.items() if c > 1] == []
    assert sorted(ids) == sorted(set(range(n)) - set(poison)), daemon.tail()
    assert "note" in table.schema().column_names  # evolved for version 2
    for row in rows:
        i = row["id"]
        want = _event(i) | {"note": (f"note {i}" if i % 2 else None) if i >= n // 2 else None}
        got = {k: row[k] for k in want}
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
