"""Events in Kafka formats "protobuf" and "json-schema", written by Confluent's own serializers.

    with Writer("protobuf", registry, topic) as writer:  # registers its schemas (then closes)
    writer.value(i, version)                         # the record of id i, schema version 1 or 2
    writer.misfit                                    # a record whose schema does not fit the table
    expected(fmt, i, version)                        # that record's row, as pyiceberg reads it
    normalized(fmt, row)                             # a row read back, comparable with it

Both formats carry nested types: a nested message / object (``point``, null for some
ids), repeated values (``tags``) and repeated messages (``path``), a map (``counts``),
an enum (``kind``), and the wrapped types each format has: for Protobuf a oneof
(``url`` / ``item``), a Timestamp, a Duration (``took``), an Int64Value (``score``) and a
Struct (``attrs``, JSON text); for JSON Schema ``oneOf`` null-or-integer (``item``) and
the formats date-time, date and uuid and Kafka Connect's decimal. Version 2 of each adds
an optional ``note`` (the registry's BACKWARD rule): the table gets it by evolution.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import tempfile
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import grpc_tools
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from support.apicurio import PASSWORD, USERNAME, ApicurioRegistry

__all__ = [
    "FORMATS",
    "MISFIT_PROTO",
    "PROTO",
    "Writer",
    "expected",
    "json_document",
    "json_schema",
    "message_class",
    "normalized",
    "protobuf_message",
    "table_schema",
]

FORMATS = ("protobuf", "json-schema")
START = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
KINDS = ("UNKNOWN", "CLICK", "VIEW")

PROTO = """syntax = "proto3";
package demo;
import "google/protobuf/timestamp.proto";
import "google/protobuf/duration.proto";
import "google/protobuf/wrappers.proto";
import "google/protobuf/struct.proto";
message Point {{ int64 x = 1; double y = 2; }}
message Event {{
  int64 id = 1;
  string name = 2;
  google.protobuf.Timestamp ts = 3;
  Point point = 4;
  repeated string tags = 5;
  enum Kind {{ UNKNOWN = 0; CLICK = 1; VIEW = 2; }}
  Kind kind = 6;
  repeated Point path = 7;
  map<string, int64> counts = 8;
  oneof target {{ string url = 9; int64 item = 10; }}
  google.protobuf.Duration took = 11;
  google.protobuf.Int64Value score = 12;
  google.protobuf.Struct attrs = 13;
  {extra}
}}
"""

#: A message of the same name whose `point` is a string: no table of the events takes it.
MISFIT_PROTO = 'syntax = "proto3"; package demo; message Event { int64 id = 1; string point = 4; }'

# The columns both tables share, then each format's own; `note` comes by evolution.
_SHARED = [
    {"name": "id", "type": "long", "required": True},
    {"name": "name", "type": "string"},
    {"name": "ts", "type": "timestamptz"},
    {"name": "point", "type": "struct<x: long, y: double>"},
    {"name": "tags", "type": "list<string>"},
    {"name": "kind", "type": "string"},
    {"name": "path", "type": "list<struct<x: long, y: double>>"},
    {"name": "counts", "type": "map<string, long>"},
    {"name": "item", "type": "long"},
]
_OWN = {
    "protobuf": [
        {"name": "url", "type": "string"},
        {"name": "took", "type": "long"},
        {"name": "score", "type": "long"},
        {"name": "attrs", "type": "string"},
    ],
    "json-schema": [
        {"name": "day", "type": "date"},
        {"name": "uid", "type": "uuid"},
        {"name": "price", "type": "decimal(12,2)"},
    ],
}


def table_schema(fmt: str) -> list[dict[str, Any]]:
    """The ``schema`` of the table ``fmt``'s events land in (before evolution)."""
    return [*_SHARED, *_OWN[fmt]]


def json_schema(version: int) -> dict[str, Any]:
    point = {
        "type": "object",
        "properties": {"x": {"type": "integer"}, "y": {"type": "number"}},
    }
    properties: dict[str, Any] = {
        "id": {"type": "integer"},
        "name": {"type": "string"},
        "ts": {"type": "string", "format": "date-time"},
        "point": {"oneOf": [{"type": "null"}, {"$ref": "#/definitions/Point"}]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "kind": {"type": "string", "enum": list(KINDS)},
        "path": {"type": "array", "items": {"$ref": "#/definitions/Point"}},
        "counts": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"key": {"type": "string"}, "value": {"type": "integer"}},
            },
        },
        "item": {"oneOf": [{"type": "null"}, {"type": "integer"}]},
        "day": {"type": "string", "format": "date"},
        "uid": {"type": "string", "format": "uuid"},
        "price": {
            "type": "number",
            "title": "org.apache.kafka.connect.data.Decimal",
            "connect.parameters": {"scale": "2"},
        },
    }
    if version == 2:
        properties["note"] = {"oneOf": [{"type": "null"}, {"type": "string"}]}
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "Event",
        "type": "object",
        "definitions": {"Point": point},
        "properties": properties,
        "required": ["id"],
    }


def message_class(text: str, name: str) -> Any:
    """The message class ``name`` of the .proto ``text``, compiled by protoc (grpcio-tools)
    into a descriptor pool of its own."""
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
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))


def expected(fmt: str, i: int, version: int) -> dict[str, Any]:
    """The row of id ``i`` written with schema ``version``, as pyiceberg reads it (maps
    as dicts, ``attrs`` parsed: see `normalized`); ``note`` is None for version 1."""
    row: dict[str, Any] = {
        "id": i,
        "name": f"événement {i}",
        "ts": START + dt.timedelta(seconds=i, microseconds=i),
        "point": None if i % 5 == 4 else {"x": i, "y": i / 2},
        "tags": [f"t{j}" for j in range(i % 3)],
        "kind": KINDS[i % 3],
        "path": [{"x": j, "y": -j / 4} for j in range(i % 4)],
        "counts": {f"c{j}": i * j for j in range(i % 3)},
        "item": None if i % 2 == 0 else i * 10,
        "note": (f"note {i}" if i % 2 else None) if version == 2 else None,
    }
    if fmt == "protobuf":
        row |= {
            "url": f"https://example.com/{i}" if i % 2 == 0 else None,
            "took": (i - 50) * 1_000_001,
            "score": None if i % 7 == 0 else i % 5,
            "attrs": None if i % 4 == 3 else {"n": i, "even": i % 2 == 0, "names": ["a", "b"]},
        }
    else:
        row |= {
            "day": dt.date(2025, 1, 1) + dt.timedelta(days=i % 30),
            "uid": uuid.UUID(int=i),
            "price": Decimal(i * 7) / 100,
        }
    return row


def normalized(fmt: str, row: dict[str, Any]) -> dict[str, Any]:
    """A row read back (pyiceberg's, or Spark's as a dict) in `expected`'s terms: maps
    as dicts, a Protobuf Struct's JSON text parsed, uuids as UUID."""
    row = dict(row)
    if isinstance(row.get("counts"), list):
        row["counts"] = dict(row["counts"])
    if fmt == "protobuf" and row.get("attrs") is not None:
        row["attrs"] = json.loads(row["attrs"])
    if fmt == "json-schema" and isinstance(row.get("uid"), bytes | str):
        value = row["uid"]
        row["uid"] = uuid.UUID(bytes=value) if isinstance(value, bytes) else uuid.UUID(value)
    return row


class Writer:
    """The producer side of one format on one topic: Confluent's serializers for schema
    versions 1 and 2 (registering them under the topic's subject), and ``misfit``, a
    record of another subject whose ``point`` is a string (the table's is a struct)."""

    def __init__(self, fmt: str, registry: ApicurioRegistry, topic: str) -> None:
        # A bound on each request (the client's default waits forever on a registry slowed
        # by a loaded machine); closed by `close` (an open client's socket left to the
        # garbage collector fails the test that happens to be running then).
        client = SchemaRegistryClient(
            {
                "url": registry.url,
                "basic.auth.user.info": f"{USERNAME}:{PASSWORD}",
                "timeout": 60,
            }
        )
        self._client = client
        self.fmt = fmt
        self.context = SerializationContext(topic, MessageField.VALUE)
        misfit_context = SerializationContext(f"{topic}-misfit", MessageField.VALUE)
        if fmt == "protobuf":
            conf = {"use.deprecated.format": False}
            self.classes = {
                1: message_class(PROTO.format(extra=""), "demo.Event"),
                2: message_class(PROTO.format(extra="optional string note = 14;"), "demo.Event"),
            }
            self.serializers = {
                v: ProtobufSerializer(cls, client, conf) for v, cls in self.classes.items()
            }
            misfit = message_class(MISFIT_PROTO, "demo.Event")
            self.misfit = ProtobufSerializer(misfit, client, conf)(
                misfit(id=-1, point="p"), misfit_context
            )
        else:
            self.serializers = {
                v: JSONSerializer(json.dumps(json_schema(v)), client) for v in (1, 2)
            }
            misfit_schema = {
                "type": "object",
                "properties": {"id": {"type": "integer"}, "point": {"type": "string"}},
            }
            self.misfit = JSONSerializer(json.dumps(misfit_schema), client)(
                {"id": -1, "point": "p"}, misfit_context
            )

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the registry client (`value` needs it for a version it has not written yet)."""
        self._client.close()

    def value(self, i: int, version: int) -> bytes:
        """The record of id ``i`` in schema ``version``, as the serializer writes it."""
        row = expected(self.fmt, i, version)
        value: bytes
        if self.fmt == "protobuf":
            message = protobuf_message(self.classes[version], row, version)
            value = self.serializers[version](message, self.context)
        else:
            value = self.serializers[version](json_document(row, version), self.context)
        return value


def protobuf_message(cls: Any, row: dict[str, Any], version: int) -> Any:
    """The demo.Event message (class ``cls``: `PROTO` of ``version``) of a Protobuf row."""
    message = cls(id=row["id"], name=row["name"], tags=row["tags"], kind=KINDS.index(row["kind"]))
    message.ts.FromDatetime(row["ts"])
    if row["point"] is not None:
        message.point.x, message.point.y = row["point"]["x"], row["point"]["y"]
    for step in row["path"]:
        message.path.add(**step)
    message.counts.update(row["counts"])
    if row["url"] is not None:
        message.url = row["url"]
    if row["item"] is not None:
        message.item = row["item"]
    message.took.FromMicroseconds(row["took"])
    if row["score"] is not None:
        message.score.value = row["score"]
    if row["attrs"] is not None:
        message.attrs.update(row["attrs"])
    if version == 2 and row["note"] is not None:
        message.note = row["note"]
    return message


def json_document(row: dict[str, Any], version: int) -> dict[str, Any]:
    """The JSON value (`json_schema` of ``version``) of a JSON Schema row."""
    document = dict(row)
    document["ts"] = row["ts"].isoformat()
    document["counts"] = [{"key": k, "value": v} for k, v in row["counts"].items()]
    document["day"] = row["day"].isoformat()
    document["uid"] = str(row["uid"])
    document["price"] = float(row["price"])
    if version == 1:
        del document["note"]
    return document
