"""The Kafka decoders of formats "protobuf" and "json-schema", as a source builds them
(`decoder_for` from a ``[[kafka]]`` section), against a stand-in schema registry served
over HTTP on loopback: every type the formats map, record order across schema ids, and
each poison record a dead letter with its reason while the others decode.

(Records through a real registry, broker and daemon: tests/kafka/test_kafka_schema_formats.py.)
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pyarrow as pa
import pytest
from google.protobuf import descriptor_pb2
from support.schema_formats import (
    MISFIT_PROTO,
    PROTO,
    expected,
    json_document,
    json_schema,
    message_class,
    normalized,
    protobuf_message,
    table_schema,
)

from icespool.config import Config
from icespool.decode import Decoded, RecordArrays, Target, decoder_for
from icespool.schema import arrow_schema_for, parse_schema

NOTE = {"name": "note", "type": "string"}
V1, V2, OTHER, MISFIT, GROUPS, UNPARSABLE = 1, 2, 3, 4, 5, 6


class StandInRegistry:
    """``GET /schemas/ids/{id}`` of a Confluent-compatible registry, from a dict; any
    other id is 404 as the registry answers it."""

    def __init__(self, schemas: dict[int, tuple[str, str]]) -> None:
        self.schemas = schemas
        self.asked: list[int] = []
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                found = re.fullmatch(r"/schemas/ids/(\d+)", self.path)
                schema_id = int(found.group(1)) if found else -1
                registry.asked.append(schema_id)
                if schema_id in registry.schemas:
                    kind, text = registry.schemas[schema_id]
                    status, body = 200, {"schema": text, "schemaType": kind}
                else:
                    status, body = 404, {"error_code": 40403, "message": "Schema not found"}
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def registry() -> Iterator[StandInRegistry]:
    other = """syntax = "proto3"; package demo;
message First { int64 id = 1; }
message Second { int64 id = 1; message Inner { string name = 1; } Inner inner = 2; }"""
    groups = 'syntax = "proto2"; package demo; message Event { optional int64 id = 1; ' + (
        "optional group Point = 4 { optional int64 x = 5; } }"
    )
    unparsable = 'syntax = "proto3"; message Event { int64 id = 1; Missing m = 2; }'
    stand_in = StandInRegistry(
        {
            V1: ("PROTOBUF", PROTO.format(extra="")),
            V2: ("PROTOBUF", PROTO.format(extra="optional string note = 14;")),
            OTHER: ("PROTOBUF", other),
            MISFIT: ("PROTOBUF", MISFIT_PROTO),
            GROUPS: ("PROTOBUF", groups),
            UNPARSABLE: ("PROTOBUF", unparsable),
        }
    )
    yield stand_in
    stand_in.server.shutdown()
    stand_in.server.server_close()


def _decoder(make_config: Callable[..., Config], fmt: str, url: str, **kafka: Any) -> Any:
    config = make_config(
        tables=[{"name": "demo.t", "create": True, "schema": [{"name": "id", "type": "long"}]}],
        kafka=[
            {
                "bootstrap_servers": "127.0.0.1:9092",
                "topics": ["t"],
                "table": "demo.t",
                "format": fmt,
                "schema_registry_url": url,
                "schema_registry_timeout": "1s",
            }
            | kafka
        ],
    )
    return decoder_for(fmt, source=config.kafka[0])


def _target(columns: list[dict[str, Any]]) -> Target:
    return Target("demo.t", arrow_schema_for(parse_schema(columns)))


#: demo.Event's message-index path in PROTO: [1] (count 1, index 1: zigzag varints).
EVENT = b"\x02\x02"


def _framed(schema_id: int, payload: bytes, path: bytes = EVENT) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + path + payload


def _rows(decoded: Decoded) -> list[dict[str, Any]]:
    assert decoded.batch is not None
    return [normalized("protobuf", r) for r in decoded.batch.to_pylist()]


def _dead(decoded: Decoded) -> dict[int, tuple[str, str, str | None]]:
    return {d.index: (d.reason, d.error, d.column) for d in decoded.dead}


_CLASSES = {
    v: message_class(PROTO.format(extra=extra), "demo.Event")
    for v, extra in ((1, ""), (2, "optional string note = 14;"))
}


def _event_payload(i: int, version: int) -> bytes:
    """The message of id ``i`` in schema ``version``, serialized."""
    message = protobuf_message(_CLASSES[version], expected("protobuf", i, version), version)
    payload: bytes = message.SerializeToString()
    return payload


# ------------------------------------------------------------------ Protobuf


def test_protobuf_every_mapped_type_in_record_order_across_schema_ids(
    make_config: Callable[..., Config], registry: StandInRegistry
) -> None:
    decoder = _decoder(make_config, "protobuf", registry.url, metadata_columns=[])
    # Versions interleaved: each id decodes as one group, rows come back in record order.
    versions = [1 + (i % 3 == 0) for i in range(60)]
    values = [_framed(v, _event_payload(i, v)) for i, v in enumerate(versions)]
    decoded = decoder.decode(RecordArrays(values), _target([*table_schema("protobuf"), NOTE]))
    assert decoded.dead == []
    assert decoded.rows.tolist() == list(range(60))
    assert _rows(decoded) == [expected("protobuf", i, v) for i, v in enumerate(versions)]
    assert sorted(registry.asked) == [V1, V2]  # each id asked once
    column = decoded.batch.schema if decoded.batch is not None else None
    assert column is not None and column.field("ts").type == pa.timestamp("us", "UTC")


def test_protobuf_declares_the_columns_a_table_lacks_with_their_types(
    make_config: Callable[..., Config], registry: StandInRegistry
) -> None:
    decoder = _decoder(make_config, "protobuf", registry.url)
    records = RecordArrays([_framed(V2, _event_payload(1, 2)), _framed(V1, _event_payload(2, 1))])
    target = _target(table_schema("protobuf"))
    decoded = decoder.decode(records, target)
    # Version 2's `note` is no column yet: its record waits for the evolution.
    assert [(d.index, d.reason, d.column) for d in decoded.dead] == [(0, "invalid", "note")]
    assert decoded.rows.tolist() == [1]
    assert decoded.declared == pa.schema([pa.field("note", pa.string())])
    request = decoder.evolve_request(records, decoded, target)
    assert request is not None and request.columns == {"note"}
    # A table made for the records (auto_create) gets the message's own schema.
    incoming = decoder.incoming(records, Target("demo.t"))
    assert incoming.field("attrs").type == pa.string()
    assert incoming.field("took").type == pa.int64()
    assert incoming.field("counts").type == pa.map_(pa.string(), pa.int64())
    assert incoming.field("path").type == pa.list_(
        pa.struct([("x", pa.int64()), ("y", pa.float64())])
    )


def test_protobuf_message_index_paths_name_the_message_type(
    make_config: Callable[..., Config], registry: StandInRegistry
) -> None:
    decoder = _decoder(make_config, "protobuf", registry.url)
    first = message_class(
        'syntax = "proto3"; package demo; message First { int64 id = 1; }', "demo.First"
    )
    inner = message_class(
        'syntax = "proto3"; package demo; message Second { message Inner { string name = 1; } }',
        "demo.Second.Inner",
    )
    values = [
        _framed(OTHER, first(id=1).SerializeToString(), path=b"\x00"),
        # [1, 0]: the first nested message of the second: count 2, then 1 and 0 (zigzag)
        _framed(OTHER, inner(name="x").SerializeToString(), path=b"\x04\x02\x00"),
        # [0] spelled out (count 1, index 0) rather than the single 0 byte
        _framed(OTHER, first(id=3).SerializeToString(), path=b"\x02\x00"),
        _framed(OTHER, b"", path=b"\x02\x08"),  # [4]: no such message
        _framed(OTHER, b"", path=b"\x02"),  # the path is cut short
    ]
    target = _target([{"name": "id", "type": "long"}, {"name": "name", "type": "string"}])
    decoded = decoder.decode(RecordArrays(values), target)
    assert decoded.batch is not None
    assert decoded.batch.to_pylist() == [
        {"id": 1, "name": None},
        {"id": None, "name": "x"},
        {"id": 3, "name": None},
    ]
    dead = _dead(decoded)
    assert sorted(dead) == [3, 4]
    assert dead[3][0] == "invalid" and "no message at index path [4]" in dead[3][1]
    assert dead[4][0] == "invalid" and "the message-index path is cut short" in dead[4][1]


def test_protobuf_poison_records_are_dead_letters_one_by_one(
    make_config: Callable[..., Config], registry: StandInRegistry
) -> None:
    decoder = _decoder(make_config, "protobuf", registry.url, max_record_bytes=2000)
    good = [_framed(V1, _event_payload(i, 1)) for i in range(40)]
    too_far = message_class(
        'syntax = "proto3"; package demo; import "google/protobuf/timestamp.proto"; '
        "message Event { int64 id = 1; google.protobuf.Timestamp ts = 3; }",
        "demo.Event",
    )(id=7)
    too_far.ts.seconds = 10**12  # year 33658: past what a timestamp column holds
    poison: dict[int, tuple[str, str, str | None]] = {
        3: ("invalid", "not Protobuf of schema id 1 (demo.Event)", None),
        9: ("schema_unavailable", "schema id 99 unavailable after 3 tries", None),
        11: ("invalid", "magic byte is 7, not 0", None),
        14: ("invalid", "not Protobuf of schema id 1 (demo.Point)", None),
        17: ("empty", "no value", None),
        20: ("oversized", "exceeds max_record_bytes (2000)", None),
        23: ("invalid", "cannot convert Protobuf string to struct", "point"),
        26: ("invalid", "(demo.Point): column 'x': Protobuf field is not a column", "x"),
        29: ("invalid", "groups (deprecated since proto2) are not read", "point"),
        31: ("invalid", "schema id 6: not a valid Protobuf schema", None),
        35: ("out_of_range", "", "ts"),
        38: ("invalid", "not Protobuf of schema id 1 (demo.Event)", None),
    }
    misfit = message_class(MISFIT_PROTO, "demo.Event")
    values: list[bytes | None] = list(good)
    values[3] = _framed(V1, b"\x08\x01\x12\x05ab")  # `name` cut short
    values[9] = _framed(99, _event_payload(9, 1))
    values[11] = b"\x07" + good[11][1:]
    # Path [0]: demo.Point, whose fields are no columns; bytes that do not parse say so first.
    values[14] = _framed(V1, b"\xff\xff\xff", b"\x00")
    values[26] = _framed(V1, b"\x08\x01", b"\x00")
    values[17] = None
    values[20] = _framed(V1, b"\x12" + b"\xd0\x0f" + b"x" * 2000)  # `name` of 2000 bytes
    values[23] = _framed(MISFIT, misfit(id=23, point="p").SerializeToString(), b"\x00")
    values[29] = _framed(GROUPS, b"\x08\x1d", b"\x00")
    values[31] = _framed(UNPARSABLE, b"\x08\x1f", b"\x00")
    values[35] = _framed(V1, too_far.SerializeToString())
    values[38] = _framed(V1, b"\x2a\x02\xff\xfe")  # `tags` element not UTF-8
    decoded = decoder.decode(RecordArrays(values), _target(table_schema("protobuf")))
    dead = _dead(decoded)
    assert sorted(dead) == sorted(poison)
    for index, (reason, fragment, column) in poison.items():
        assert dead[index][0] == reason, (index, dead[index])
        assert fragment in dead[index][1], (index, dead[index])
        if column is not None:
            assert dead[index][2] is not None and column in dead[index][2], (index, dead[index])
    kept = [i for i in range(40) if i not in poison]
    assert decoded.rows.tolist() == kept
    assert [r | {"note": None} for r in _rows(decoded)] == [
        expected("protobuf", i, 1) for i in kept
    ]


def test_protobuf_a_uint64_past_long_is_a_dead_letter_naming_its_column(
    make_config: Callable[..., Config], registry: StandInRegistry
) -> None:
    registry.schemas[40] = (
        "PROTOBUF",
        'syntax = "proto3"; message E { uint64 n = 1; google.protobuf.Duration d = 2; }'.replace(
            "message", 'import "google/protobuf/duration.proto"; message', 1
        ),
    )
    cls = message_class(registry.schemas[40][1], "E")
    values = [
        _framed(40, cls(n=2**63 - 1).SerializeToString(), b"\x00"),
        _framed(40, cls(n=2**63).SerializeToString(), b"\x00"),
        _framed(40, _with_duration(cls(n=5), -1, -500_000).SerializeToString(), b"\x00"),
    ]
    decoder = _decoder(make_config, "protobuf", registry.url)
    target = _target([{"name": "n", "type": "long"}, {"name": "d", "type": "long"}])
    decoded = decoder.decode(RecordArrays(values), target)
    assert decoded.batch is not None
    assert decoded.batch.to_pylist() == [{"n": 2**63 - 1, "d": None}, {"n": 5, "d": -1_000_500}]
    ((index, (reason, error, column)),) = _dead(decoded).items()
    assert (index, reason, column) == (1, "invalid", "n")
    assert "cannot convert Protobuf uint64" in error


def _with_duration(message: Any, seconds: int, nanos: int) -> Any:
    message.d.seconds, message.d.nanos = seconds, nanos
    return message


def test_protobuf_schemas_given_as_descriptors_compile_too(
    make_config: Callable[..., Config], registry: StandInRegistry
) -> None:
    """What Confluent's Python and Go serializers register: a base64 FileDescriptorProto."""
    file = descriptor_pb2.FileDescriptorProto()
    _CLASSES[1].DESCRIPTOR.file.CopyToProto(file)
    registry.schemas[50] = ("PROTOBUF", base64.b64encode(file.SerializeToString()).decode())
    decoder = _decoder(make_config, "protobuf", registry.url)
    decoded = decoder.decode(
        RecordArrays([_framed(50, _event_payload(5, 1))]), _target(table_schema("protobuf"))
    )
    assert decoded.dead == []
    (row,) = _rows(decoded)
    assert row | {"note": None} == expected("protobuf", 5, 1)


# ------------------------------------------------------------------ JSON Schema


def _document(i: int, **changes: Any) -> dict[str, Any]:
    return json_document(expected("json-schema", i, 2), 2) | changes


@pytest.fixture
def json_registry() -> Iterator[StandInRegistry]:
    stand_in = StandInRegistry({V2: ("JSON", json.dumps(json_schema(2)))})
    yield stand_in
    stand_in.server.shutdown()
    stand_in.server.server_close()


def test_json_schema_values_typed_by_the_schema_and_checked(
    make_config: Callable[..., Config], json_registry: StandInRegistry
) -> None:
    decoder = _decoder(make_config, "json-schema", json_registry.url)
    documents = [_document(i) for i in range(12)]
    documents[4] = _document(4, kind="OTHER")  # not in the enum
    documents[7] = _document(7, id=None)  # required
    documents[9] = _document(9, ts="yesterday")  # not a date-time
    values = [_framed(V2, json.dumps(d).encode(), path=b"") for d in documents]
    values.append(b"\x00\x00\x00\x00\x63{}")  # id 99: unknown
    target = _target([*table_schema("json-schema"), NOTE])
    decoded = decoder.decode(RecordArrays(values), target)
    dead = _dead(decoded)
    assert sorted(dead) == [4, 7, 9, 12]
    assert dead[4][:2] == (
        "invalid",
        'does not match schema id 2: property \'kind\' is not one of ["UNKNOWN", "CLICK", "VIEW"]',
    )
    assert dead[7] == ("invalid", "column 'id': required column is missing or null", "id")
    assert dead[9][0] == "invalid" and dead[9][2] == "ts"
    assert dead[12][0] == "schema_unavailable"
    kept = [0, 1, 2, 3, 5, 6, 8, 10, 11]
    assert decoded.rows.tolist() == kept
    assert decoded.batch is not None
    got = [normalized("json-schema", r) for r in decoded.batch.to_pylist()]
    assert got == [expected("json-schema", i, 2) for i in kept]
    assert decoded.batch.schema.field("ts").type == pa.timestamp("us", "UTC")
    assert decoded.batch.schema.field("day").type == pa.date32()
    assert got[0]["ts"] == dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
