"""Kafka formats "protobuf" and "json-schema" beside "json": decode rows/s of the same events.

Run: .venv/bin/python tests/bench/bench_kafka_formats.py [--quick] [--records N] [--fetch N]
         [--trials N]

The benchmark's 8-column events (tests/bench/_events.py, about 163 bytes as JSON) are
encoded three ways: JSON values (format "json"), the Confluent wire format with a
Protobuf message of the same fields (``google.protobuf.Timestamp`` for ``ts``), and the
Confluent wire format with JSON text and a JSON Schema declaring the same types. Each
format's decoder (`icespool.decode.decoder_for`, as a Kafka source builds it) decodes them
in fetches of --fetch records (20,000: a source's max_poll_records) into the table's Arrow
schema; the schemas come from an in-process stand-in for the registry (one lookup each,
then cached, as against a real one). Per trial every format decodes all records once, in
turn; min / median / max rows/s over the trials are printed, with each format's median
ratio to JSON's (target: >= 0.7x).

This measures the decode, the only step where the formats differ: the Kafka fetch, the
spool, Parquet and the Iceberg commit are the same for all three (see bench_kafka.py for
the whole path, where the decode is part of what a JSON event costs).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

import grpc_tools
import pyarrow as pa
from _events import COLUMNS, ndjson_body
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from icespool.config import embedded_default, validate_config
from icespool.decode import RecordArrays, Target, decoder_for
from icespool.decode._registry import RegistryAnswer, SchemaRegistry
from icespool.schema import arrow_schema_for, parse_schema

PROTO = """syntax = "proto3";
package bench;
import "google/protobuf/timestamp.proto";
message Event {
  int64 event_id = 1; google.protobuf.Timestamp ts = 2; string kind = 3; string user = 4;
  double value = 5; int32 count = 6; bool ok = 7; string payload = 8;
}
"""
JSON_SCHEMA = {
    "type": "object",
    "properties": {
        "event_id": {"type": "integer"},
        "ts": {"type": "string", "format": "date-time"},
        "kind": {"type": "string"},
        "user": {"type": "string"},
        "value": {"type": "number"},
        "count": {"type": "integer", "connect.type": "int32"},
        "ok": {"type": "boolean"},
        "payload": {"type": "string"},
    },
    "required": ["event_id"],
}
SCHEMAS = {
    1: RegistryAnswer("schema id 1", "PROTOBUF", PROTO, ()),
    2: RegistryAnswer("schema id 2", "JSON", json.dumps(JSON_SCHEMA), ()),
}


class StandIn(SchemaRegistry):
    """The registry's answers without a registry."""

    def schema(self, schema_id: int) -> RegistryAnswer:
        return SCHEMAS[schema_id]


def _event_class() -> Any:
    include = str(Path(grpc_tools.__file__).parent / "_proto")
    with tempfile.TemporaryDirectory() as scratch:
        (Path(scratch) / "e.proto").write_text(PROTO)
        out = Path(scratch) / "out.pb"
        protoc = [sys.executable, "-m", "grpc_tools.protoc", f"-I{scratch}", f"-I{include}"]
        subprocess.run(
            [*protoc, "--include_imports", f"--descriptor_set_out={out}", "e.proto"], check=True
        )
        files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for file in files.file:
        pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("bench.Event"))


def _values(records: int) -> dict[str, list[bytes]]:
    lines = ndjson_body(records, 0).splitlines()
    event = _event_class()
    proto: list[bytes] = []
    for line in lines:
        row = json.loads(line)
        message = event(**{k: v for k, v in row.items() if k != "ts"})
        message.ts.FromDatetime(dt.datetime.fromisoformat(row["ts"]))
        proto.append(b"\x00" + (1).to_bytes(4, "big") + b"\x00" + message.SerializeToString())
    framed = [b"\x00" + (2).to_bytes(4, "big") + line for line in lines]
    return {"json": lines, "protobuf": proto, "json-schema": framed}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="100,000 records, 3 trials")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--fetch", type=int, default=20_000)
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()
    records, trials = (100_000, 3) if args.quick else (args.records, args.trials)
    values = _values(records)
    schema = arrow_schema_for(parse_schema(COLUMNS))
    target = Target("bench.events", schema)
    decoders = {}
    for fmt in values:
        raw = embedded_default(Path(tempfile.mkdtemp()))
        source = validate_config(
            raw
            | {
                "kafka": [
                    {
                        "bootstrap_servers": "127.0.0.1:9092",
                        "topics": ["t"],
                        "table": "bench.events",
                        "format": fmt,
                        **({} if fmt == "json" else {"schema_registry_url": "http://stand-in"}),
                    }
                ],
                "tables": [{"name": "bench.events", "create": True, "schema": COLUMNS}],
            }
        ).kafka[0]
        decoder = decoder_for(fmt, source=source)
        if fmt != "json":
            # The stand-in in place of the configured registry's client.
            decoder._schemas().registry = StandIn("http://stand-in")  # type: ignore[attr-defined]
        decoders[fmt] = decoder
    fetches = {
        fmt: [pa.array(v[i : i + args.fetch], pa.binary()) for i in range(0, records, args.fetch)]
        for fmt, v in values.items()
    }
    rates: dict[str, list[float]] = {fmt: [] for fmt in values}
    for _ in range(trials):
        for fmt, decoder in decoders.items():
            began = time.perf_counter()
            rows = 0
            for fetch in fetches[fmt]:
                decoded = decoder.decode(RecordArrays(fetch), target)
                assert not decoded.dead, decoded.dead[:3]
                rows += len(decoded.rows)
            assert rows == records
            rates[fmt].append(records / (time.perf_counter() - began))
    base = median(rates["json"])
    print(f"{records:,} events, fetches of {args.fetch:,}, {trials} trials (decode only)")
    print(f"{'format':<12} {'rows/s min / median / max':>36}  vs json")
    for fmt, r in rates.items():
        print(
            f"{fmt:<12} {min(r):>11,.0f} / {median(r):>11,.0f} / {max(r):>11,.0f}  "
            f"{median(r) / base:.2f}x"
        )


if __name__ == "__main__":
    main()
