"""Request-body decoding: NDJSON and Arrow IPC streams into a table's Arrow schema."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import subprocess
import sys
import uuid

import pyarrow as pa
import pytest

from icespool.decode import decode_arrow_stream, decode_ndjson
from icespool.errors import BadInputError, SchemaError
from icespool.schema import arrow_schema_for, parse_schema

UTC = dt.UTC

SCHEMA = arrow_schema_for(
    parse_schema(
        [
            {"name": "id", "type": "long", "required": True},
            {"name": "n", "type": "int"},
            {"name": "ok", "type": "boolean"},
            {"name": "score", "type": "double"},
            {"name": "ratio", "type": "float"},
            {"name": "amount", "type": "decimal(10,2)"},
            {"name": "day", "type": "date"},
            {"name": "at", "type": "time"},
            {"name": "local", "type": "timestamp"},
            {"name": "ts", "type": "timestamptz"},
            {"name": "name", "type": "string"},
            {"name": "key", "type": "uuid"},
            {"name": "blob", "type": "binary"},
            {"name": "tag", "type": "fixed(4)"},
        ]
    )
)
FULL = {
    "id": 1,
    "n": -7,
    "ok": True,
    "score": 2.25,
    "ratio": 0.5,
    "amount": "12.34",
    "day": "2024-02-29",
    "at": "23:59:58.123456",
    "local": "2024-05-01 12:00:00.5",
    "ts": "2024-05-01T14:00:00+02:00",
    "name": "zoë",
    "key": "12345678-1234-5678-1234-567812345678",
    "blob": "aGVsbG8=",
    "tag": "YWJjZA==",
}


def ndjson(*records: object) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def test_every_type_decodes_to_the_exact_schema_and_values() -> None:
    table = decode_ndjson(ndjson(FULL, {"id": 2}), SCHEMA)
    assert table.schema.equals(SCHEMA, check_metadata=True)
    first, second = table.to_pylist()
    assert first == {
        "id": 1,
        "n": -7,
        "ok": True,
        "score": 2.25,
        "ratio": 0.5,
        "amount": decimal.Decimal("12.34"),
        "day": dt.date(2024, 2, 29),
        "at": dt.time(23, 59, 58, 123456),
        "local": dt.datetime(2024, 5, 1, 12, 0, 0, 500000),
        "ts": dt.datetime(2024, 5, 1, 12, 0, tzinfo=UTC),
        "name": "zoë",
        "key": uuid.UUID("12345678-1234-5678-1234-567812345678"),
        "blob": b"hello",
        "tag": b"abcd",
    }
    assert second == dict.fromkeys(SCHEMA.names) | {"id": 2}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-05-01T12:00:00Z", dt.datetime(2024, 5, 1, 12, tzinfo=UTC)),
        ("2024-05-01T14:00:00+02:00", dt.datetime(2024, 5, 1, 12, tzinfo=UTC)),
        ("2024-05-01T09:30:00-0230", dt.datetime(2024, 5, 1, 12, tzinfo=UTC)),
        ("2024-05-01T12:00:00", dt.datetime(2024, 5, 1, 12, tzinfo=UTC)),  # naive = UTC
        ("2024-05-01 12:00:00.123456Z", dt.datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)),
        ("2024-05-01", dt.datetime(2024, 5, 1, tzinfo=UTC)),
    ],
)
def test_timestamptz_accepts_offsets_and_takes_naive_values_as_utc(
    text: str, expected: dt.datetime
) -> None:
    table = decode_ndjson(ndjson({"id": 1, "ts": text}), SCHEMA)
    assert table.column("ts").to_pylist() == [expected]


@pytest.mark.parametrize("text", ["2024-05-01T12:00:00Z", "2024-05-01T12:00:00+02:00"])
def test_timestamp_without_zone_refuses_offsets(text: str) -> None:
    with pytest.raises(SchemaError) as info:
        decode_ndjson(ndjson({"id": 1}, {"id": 2, "local": text}), SCHEMA)
    assert info.value.column == "local"
    assert "WITHOUT offset" in str(info.value) and "(line 2)" in str(info.value)
    assert text in str(info.value)


def test_blank_lines_and_crlf_are_fine_and_count_in_line_numbers() -> None:
    body = b'\r\n{"id": 1}\r\n\r\n  \n{"id": 2}\r\n'
    assert decode_ndjson(body, SCHEMA).column("id").to_pylist() == [1, 2]
    with pytest.raises(SchemaError, match=r"\(line 5\)"):
        decode_ndjson(b'\n{"id": 1}\n\n  \n{"id": "2"}\n', SCHEMA)


@pytest.mark.parametrize("body", [b"", b"\n", b" \r\n \n\t"])
def test_empty_body_is_no_records(body: bytes) -> None:
    with pytest.raises(BadInputError, match="no records"):
        decode_ndjson(body, SCHEMA)


BAD_LINES = [
    # (body, error class, column or None, fragments of the message)
    (b'{"id": 1}\n{"id": 2,\n', BadInputError, None, ["line 2", "invalid JSON"]),
    (b'{"id": 1}\n{"id": 2}}\n', BadInputError, None, ["line 2", "invalid JSON"]),
    (b'{"id": 1, "name": 5}\n', SchemaError, "name", ["expected a string", "got 5", "line 1"]),
    (b'{"id": 1.5}\n', SchemaError, "id", ["expected an integer", "got 1.5", "line 1"]),
    (b'{"id": "1"}\n', SchemaError, "id", ["expected an integer", 'got "1"']),
    (b'{"id": 1, "n": 2147483648}\n', SchemaError, "n", ["to 2147483647", "got 2147483648"]),
    (b'{"id": 1, "ok": "yes"}\n', SchemaError, "ok", ["true or false"]),
    (b'{"id": 1, "ts": 1714564800}\n', SchemaError, "ts", ["ISO-8601", "got 1714564800"]),
    (b'{"id": 1, "ts": "yesterday"}\n', SchemaError, "ts", ["ISO-8601", '"yesterday"']),
    (b'{"id": 1, "amount": 1.234}\n', SchemaError, "amount", ["2 fractional digits"]),
    (b'{"id": 1, "day": "01/02/2024"}\n', SchemaError, "day", ["YYYY-MM-DD"]),
    (b'{"id": 1, "at": "25:00:00"}\n', SchemaError, "at", ["HH:MM:SS"]),
    (b'{"id": 1, "key": "not-a-uuid"}\n', SchemaError, "key", ["UUID"]),
    (b'{"id": 1, "blob": "***"}\n', SchemaError, "blob", ["base64"]),
    (b'{"id": 1, "tag": "YWI="}\n', SchemaError, "tag", ["exactly 4 bytes"]),
    (b'{"id": 1, "name": {"a": 1}}\n', SchemaError, "name", ["expected a string"]),
    (b'{"id": 1}\n{"id": 2, "colour": "red"}\n', SchemaError, "colour", ["not in the table"]),
    (b'{"id": 1, "id": 2}\n', SchemaError, "id", ["twice", "line 1"]),
    (b'{"name": "x"}\n', SchemaError, "id", ["required column is missing", "line 1"]),
    (b'{"id": 1}\n{"id": null}\n', SchemaError, "id", ["required", "line 2"]),
    (b'{"id": 1}\n[1, 2]\n', BadInputError, None, ["line 2", "expected a JSON object"]),
    (b'{"id": 1}\n7\n', BadInputError, None, ["line 2", "expected a JSON object"]),
    (b'{"id": 1}{"id": 2}\n', BadInputError, None, ["line 1", "invalid JSON"]),
    (b'{"id": 1,\n "name": "x"}\n', BadInputError, None, ["line 1", "one JSON object per line"]),
    (b'{"id": 1, "name": "a\xffb"}\n', SchemaError, "name", ["UTF-8", "line 1"]),
    # A top-level null used to become an all-null row (or crash pyarrow, see below).
    (b'{"id": 1}\nnull\n', BadInputError, None, ["line 2", "expected a JSON object, got null"]),
    (b"null\n", BadInputError, None, ["line 1", "got null"]),
]


@pytest.mark.parametrize(("body", "error", "column", "fragments"), BAD_LINES)
def test_bad_input_names_line_column_and_expectation(
    body: bytes, error: type[BadInputError], column: str | None, fragments: list[str]
) -> None:
    with pytest.raises(error) as info:
        decode_ndjson(body, SCHEMA)
    if column is not None:
        assert isinstance(info.value, SchemaError) and info.value.column == column
    for fragment in fragments:
        assert fragment in str(info.value)


def test_a_late_bad_line_is_found_in_a_large_body() -> None:
    records = [{"id": i, "name": f"n{i}", "ts": "2024-05-01T12:00:00Z"} for i in range(10_000)]
    records[8_765]["name"] = 8765
    with pytest.raises(SchemaError) as info:
        decode_ndjson(ndjson(*records), SCHEMA)
    assert info.value.column == "name" and "(line 8766)" in str(info.value)


def test_a_large_body_decodes_in_one_piece() -> None:
    records = [{"id": i, "n": i % 1000, "name": f"n{i}"} for i in range(20_000)]
    table = decode_ndjson(ndjson(*records), SCHEMA)
    assert table.num_rows == 20_000
    assert table.column("id").to_pylist() == list(range(20_000))
    assert table.column("name").to_pylist()[-1] == "n19999"


def test_a_string_that_looks_like_a_top_level_null_is_data() -> None:
    # "} null" inside a string trips the cheap scan; the strict check clears it.
    table = decode_ndjson(ndjson({"id": 1, "name": "} null {"}), SCHEMA)
    assert table.column("name").to_pylist() == ["} null {"]


def test_pyarrow_still_needs_the_top_level_null_guard() -> None:
    """Documents why decode_ndjson pre-scans: remove the guard when this starts failing."""
    code = (
        "import pyarrow as pa, pyarrow.json as pj\n"
        "schema = pa.schema([('id', pa.int64())])\n"
        "options = pj.ParseOptions(explicit_schema=schema)\n"
        "print(pj.read_json(pa.BufferReader(b'null\\n'), parse_options=options))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert result.returncode != 0, "pyarrow reads a leading top-level null now"


# ------------------------------------------------------------------ Arrow IPC streams


def arrow_stream(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def test_arrow_stream_round_trips() -> None:
    table = pa.table({"id": pa.array([1, 2], pa.int64()), "name": ["a", None]})
    decoded = decode_arrow_stream(arrow_stream(table))
    assert decoded.equals(table)


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"", "no records"),
        (b"definitely not arrow", "not a valid Arrow IPC stream"),
        (b"\xff\xff\xff\xff" + b"\x00" * 64, "not a valid Arrow IPC stream"),
        (arrow_stream(pa.table({"id": pa.array([], pa.int64())})), "no records"),
    ],
)
def test_bad_arrow_streams_are_bad_input(body: bytes, fragment: str) -> None:
    with pytest.raises(BadInputError, match=fragment):
        decode_arrow_stream(body)


def test_truncated_arrow_stream_is_bad_input() -> None:
    body = arrow_stream(pa.table({"id": pa.array(range(1000), pa.int64())}))
    with pytest.raises(BadInputError, match="not a valid Arrow IPC stream"):
        decode_arrow_stream(body[: len(body) // 2])
