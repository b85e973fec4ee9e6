"""Every Iceberg type, from JSON and from Arrow, through our encoder into a real Iceberg
table (SQLite catalog) and back through pyiceberg, compared exactly; and per-record
decode errors naming the column."""

from __future__ import annotations

import datetime as dt
import decimal
import itertools
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.catalog import Catalog
from support.json_values import b64_json, decimal_json, dumps, storage_type

from icespool.decode import JsonOptions, decode_ndjson, decode_ndjson_lenient
from icespool.errors import SchemaError
from icespool.iceberg import commit_files
from icespool.iceberg._catalog import ensure_table, load_catalog
from icespool.iceberg._parquet import encode_data_files
from icespool.schema import arrow_schema_for, conform, parse_partition_spec, parse_schema

UTC = dt.UTC
D = decimal.Decimal

# ------------------------------------------------------------------ the matrix
# column name -> (type, value strategy, JSON text of a value)


_INSTANTS = st.datetimes(min_value=dt.datetime(1900, 1, 1), max_value=dt.datetime(2200, 1, 1))
_OFFSETS = st.integers(-14 * 60, 14 * 60).map(lambda m: dt.timezone(dt.timedelta(minutes=m)))
_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=20)
_DEC_10_2 = st.decimals(min_value=D("-99999999.99"), max_value=D("99999999.99"), places=2)
_DEC_38_0 = st.decimals(min_value=D(-(10**38) + 1), max_value=D(10**38 - 1), places=0)
_DEC_38_38 = st.decimals(min_value=D("-0." + "9" * 38), max_value=D("0." + "9" * 38), places=38)


def _struct_text(value: dict[str, Any]) -> str:
    tags = "null" if value["tags"] is None else "[" + ",".join(map(dumps, value["tags"])) + "]"
    entries = ",".join(
        f'{{"key":{dumps(k)},"value":{decimal_json(v)}}}' for k, v in value["m"].items()
    )
    return f'{{"a":{value["a"]},"tags":{tags},"m":[{entries}],"u":{dumps(str(value["u"]))}}}'


_STRUCT = st.fixed_dictionaries(
    {
        "a": st.integers(-(2**31), 2**31 - 1),
        "tags": st.none() | st.lists(_TEXT, max_size=3),
        "m": st.dictionaries(_TEXT, _DEC_10_2, max_size=3),
        "u": st.uuids(),
    }
)

MATRIX: dict[str, tuple[str, st.SearchStrategy[Any], Callable[[Any], str]]] = {
    "b": ("boolean", st.booleans(), dumps),
    "i": ("int", st.integers(-(2**31), 2**31 - 1), dumps),
    "l": ("long", st.integers(-(2**63), 2**63 - 1), dumps),
    "f": ("float", st.floats(width=32, allow_nan=False, allow_infinity=False), dumps),
    "d": ("double", st.floats(allow_nan=False, allow_infinity=False), dumps),
    "dec": ("decimal(10,2)", _DEC_10_2, decimal_json),
    "dec38": ("decimal(38,0)", _DEC_38_0, decimal_json),
    "frac38": ("decimal(38,38)", _DEC_38_38, decimal_json),
    "day": ("date", st.dates(), lambda v: dumps(v.isoformat())),
    "t": ("time", st.times(), lambda v: dumps(v.isoformat())),
    "ts": ("timestamp", _INSTANTS, lambda v: dumps(v.isoformat())),
    "tstz": (
        "timestamptz",
        st.builds(lambda d, tz: d.replace(tzinfo=tz), _INSTANTS, _OFFSETS),
        lambda v: dumps(v.isoformat()),
    ),
    "s": ("string", _TEXT, dumps),
    "u": ("uuid", st.uuids(), lambda v: dumps(str(v))),
    "fx": ("fixed[5]", st.binary(min_size=5, max_size=5), b64_json),
    "bin": ("binary", st.binary(max_size=20), b64_json),
    "tags": ("list<long not null>", st.lists(st.integers(-(2**63), 2**63 - 1), max_size=4), dumps),
    "st": (
        "struct<a: int not null, tags: list<string>, m: map<string, decimal(10,2)>, u: uuid>",
        _STRUCT,
        _struct_text,
    ),
}
COLUMNS = [{"name": "id", "type": "long", "required": True}] + [
    {"name": name, "type": spec[0]} for name, spec in MATRIX.items()
]
ROWS = st.lists(
    st.fixed_dictionaries({name: st.none() | spec[1] for name, spec in MATRIX.items()}),
    min_size=1,
    max_size=4,
)


def _expected(name: str, value: Any) -> Any:
    """What pyiceberg reads back for a value written to column ``name``."""
    if value is None:
        return None
    if name == "tstz":
        return value.astimezone(UTC)
    if name == "st":
        return {**value, "m": list(value["m"].items())}
    return value


def _json_line(row_id: int, row: dict[str, Any]) -> str:
    parts = [f'"id":{row_id}']
    parts += [f'"{name}":{MATRIX[name][2](v)}' for name, v in row.items() if v is not None]
    return "{" + ",".join(parts) + "}"


def _arrow_value(name: str, value: Any) -> Any:
    if value is None:
        return None
    if name == "st":
        return {**value, "m": list(value["m"].items()), "u": value["u"].bytes}
    if name == "u":
        return value.bytes
    return value


# ------------------------------------------------------------------ a real table


@pytest.fixture(scope="module")
def catalog() -> Iterator[Catalog]:
    # Module-scoped: hypothesis reruns the test body, and a catalog per example would
    # only add SQLite set-up time. Every example writes its own table.
    with tempfile.TemporaryDirectory() as directory:
        yield load_catalog(
            "matrix",
            {
                "type": "sql",
                "uri": f"sqlite:///{directory}/catalog.db",
                "warehouse": f"file://{directory}/warehouse",
            },
        )


_names = itertools.count()


def _round_trip(catalog: Catalog, columns: list[dict[str, object]], batch: pa.Table) -> pa.Table:
    """Conform, encode with our encoder, commit with our committer, read with pyiceberg."""
    schema = parse_schema(columns)
    name = f"matrix.t{next(_names)}"
    table = ensure_table(catalog, name, schema, parse_partition_spec(schema, []), {}, create=True)
    conformed = conform(batch, arrow_schema_for(table))
    files = encode_data_files(
        table,
        [conformed],
        target_file_size=1 << 20,
        row_group_records=1000,
        compression="zstd",
        file_prefix="seg",
    )
    commit_files(table, files, segment_ids=["seg"], summary={})
    return catalog.load_table(name).scan().to_arrow().sort_by("id")


_SETTINGS = settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@_SETTINGS
@given(rows=ROWS)
def test_every_type_round_trips_from_json(catalog: Catalog, rows: list[dict[str, Any]]) -> None:
    body = "\n".join(_json_line(i, row) for i, row in enumerate(rows)).encode()
    arrow_schema = arrow_schema_for(parse_schema(COLUMNS))
    decoded = decode_ndjson(body, arrow_schema)
    result = _round_trip(catalog, COLUMNS, decoded)
    assert result.to_pylist() == [
        {"id": i} | {name: _expected(name, v) for name, v in row.items()}
        for i, row in enumerate(rows)
    ]


@_SETTINGS
@given(rows=ROWS)
def test_every_type_round_trips_from_arrow(catalog: Catalog, rows: list[dict[str, Any]]) -> None:
    arrow_schema = arrow_schema_for(parse_schema(COLUMNS))
    data = {"id": pa.array(range(len(rows)), pa.int64())}
    for name in MATRIX:
        field = arrow_schema.field(name)
        # Clients send uuids as 16-byte binaries (pa.array cannot build the extension
        # type from Python values); conform() converts them, nested ones too.
        data[name] = pa.array(
            [_arrow_value(name, row[name]) for row in rows], storage_type(field.type)
        )
    result = _round_trip(catalog, COLUMNS, pa.table(data))
    assert result.to_pylist() == [
        {"id": i} | {name: _expected(name, v) for name, v in row.items()}
        for i, row in enumerate(rows)
    ]


# ------------------------------------------------------------------ epoch timestamps


EPOCH_COLUMNS: list[dict[str, object]] = [
    {"name": "id", "type": "long", "required": True},
    {"name": "ts", "type": "timestamptz"},
    {"name": "local", "type": "timestamp", "timestamp_unit": "us"},
]


@_SETTINGS
@given(stamps=st.lists(st.datetimes(min_value=dt.datetime(1900, 1, 1)), min_size=1, max_size=4))
def test_epoch_numbers_in_the_configured_unit(catalog: Catalog, stamps: list[dt.datetime]) -> None:
    options = JsonOptions("ms", (("local", "us"),))
    lines = []
    for i, stamp in enumerate(stamps):
        micros = (stamp - dt.datetime(1970, 1, 1)) // dt.timedelta(microseconds=1)
        millis = micros // 1000
        lines.append(f'{{"id":{i},"ts":{millis},"local":{micros}}}')
    schema = arrow_schema_for(parse_schema(EPOCH_COLUMNS))
    result = _round_trip(
        catalog, EPOCH_COLUMNS, decode_ndjson("\n".join(lines).encode(), schema, options)
    )
    assert result.column("local").to_pylist() == stamps
    assert result.column("ts").to_pylist() == [
        stamp.replace(microsecond=stamp.microsecond // 1000 * 1000, tzinfo=UTC) for stamp in stamps
    ]


def test_epoch_numbers_and_iso_text_mix_in_one_body() -> None:
    schema = arrow_schema_for(parse_schema(EPOCH_COLUMNS))
    body = b'{"id":1,"ts":1714564800000}\n{"id":2,"ts":"2024-05-01T14:00:00+02:00"}\n'
    table = decode_ndjson(body, schema, JsonOptions("ms"))
    expected = dt.datetime(2024, 5, 1, 12, tzinfo=UTC)
    assert table.column("ts").to_pylist() == [expected, expected]


def test_without_a_unit_epoch_numbers_are_refused() -> None:
    schema = arrow_schema_for(parse_schema(EPOCH_COLUMNS))
    with pytest.raises(SchemaError) as info:
        decode_ndjson(b'{"id":1,"ts":1714564800000}\n', schema)
    assert info.value.column == "ts" and "ISO-8601" in info.value.problem


def test_decimals_are_exact_not_rounded_through_double() -> None:
    schema = arrow_schema_for(
        parse_schema(
            [{"name": "a", "type": "decimal(38,1)"}, {"name": "b", "type": "decimal(38,0)"}]
        )
    )
    body = (
        b'{"a": 0.1, "b": 12345678901234567890123456789012345678}\n'
        b'{"a": "1234567890123456789012345678901234567.8", '
        b'"b": "-99999999999999999999999999999999999999"}\n'
    )
    assert decode_ndjson(body, schema).to_pylist() == [
        {"a": D("0.1"), "b": D("12345678901234567890123456789012345678")},
        {"a": D("1234567890123456789012345678901234567.8"), "b": D("-" + "9" * 38)},
    ]


# ------------------------------------------------------------------ per-record errors


ERROR_COLUMNS: list[dict[str, object]] = [
    {"name": "id", "type": "long", "required": True},
    {"name": "n", "type": "int"},
    {"name": "big", "type": "long"},
    {"name": "amount", "type": "decimal(5,2)"},
    {"name": "day", "type": "date"},
    {"name": "ts", "type": "timestamptz"},
    {"name": "key", "type": "uuid"},
    {"name": "blob", "type": "binary"},
    {"name": "tag", "type": "fixed[4]"},
    {"name": "st", "type": "struct<a: int not null, u: uuid, l: list<decimal(5,2)>>"},
    {"name": "m", "type": "map<string, long>"},
]
ERROR_SCHEMA = arrow_schema_for(parse_schema(ERROR_COLUMNS))

_INTEGER = "expected an integer from -9223372036854775808 to 9223372036854775807"
_DECIMAL = "expected a decimal (number or string) with at most 3 integer and 2 fractional digits"
_TIMESTAMPTZ = (
    'expected an ISO-8601 timestamp string such as "2024-05-01T12:00:00Z" or '
    '"2024-05-01T14:00:00.5+02:00" (no offset means UTC; at most 6 fractional digits)'
)
BAD_RECORDS = [
    ('"n": 2147483648', "n", "expected an integer from -2147483648 to 2147483647, got 2147483648"),
    (
        '"big": 9223372036854775808',
        "big",
        f"{_INTEGER}, got 9223372036854775808",
    ),
    (
        '"amount": 1234.5',
        "amount",
        f"{_DECIMAL}, got 1234.50",
    ),
    (
        '"amount": 1.234',
        "amount",
        f"{_DECIMAL}, got 1.234",
    ),
    ('"day": "2023-02-29"', "day", 'expected a date string "YYYY-MM-DD", got "2023-02-29"'),
    (
        '"ts": "2024-13-01T00:00:00Z"',
        "ts",
        f'{_TIMESTAMPTZ}, got "2024-13-01T00:00:00Z"',
    ),
    ('"key": "12345678-1234"', "key", 'expected a UUID string, got "12345678-1234"'),
    ('"blob": "a*b"', "blob", 'expected a base64 string, got "a*b"'),
    ('"tag": "YWI="', "tag", 'expected a base64 string of exactly 4 bytes, got "YWI="'),
    ('"st": {"a": 1, "u": "nope"}', "st.u", 'expected a UUID string, got "nope"'),
    ('"st": {"u": null}', "st.a", "required field is null"),
    (
        '"st": {"a": 1, "l": [1.5, 1000]}',
        "st.l.element",
        f"{_DECIMAL}, got 1000.00",
    ),
    ('"m": [{"key": null, "value": 1}]', "m.key", "a map key is missing or null"),
    (
        '"extra": 1',
        "extra",
        "not in the table schema; the columns are id, n, big, amount, day, ts, key, blob, "
        "tag, st, m",
    ),
]


@pytest.mark.parametrize(("fields", "column", "message"), BAD_RECORDS)
def test_a_bad_record_is_a_record_error_naming_the_column(
    fields: str, column: str, message: str
) -> None:
    values = [b'{"id": 0}', ('{"id": 1, ' + fields + "}").encode(), b'{"id": 2, "n": 5}']
    result = decode_ndjson_lenient(values, ERROR_SCHEMA)
    assert [(e.index, e.column, e.message, e.raw) for e in result.errors] == [
        (1, column, message, values[1])
    ]
    assert result.table is not None and result.table.column("id").to_pylist() == [0, 2]
    # The all-or-nothing path reports the same problem with its line.
    with pytest.raises(SchemaError) as info:
        decode_ndjson(b"\n".join(values), ERROR_SCHEMA)
    assert info.value.column == column.split(".")[0] or info.value.column == column
    assert "(line 2)" in info.value.problem


def test_lenient_decoding_of_many_records_keeps_the_good_ones_in_order() -> None:
    values = [f'{{"id": {i}, "n": {i}}}'.encode() for i in range(5000)]
    values[10] = b'{"id": 10, "n": "ten"}'
    values[4000] = b"not json"
    values[4001] = b""
    values[4002] = b"null"
    result = decode_ndjson_lenient(values, ERROR_SCHEMA)
    assert [(e.index, e.column) for e in result.errors] == [
        (10, "n"),
        (4000, None),
        (4001, None),
        (4002, None),
    ]
    assert result.table is not None
    assert result.table.column("id").to_pylist() == [
        i for i in range(5000) if i not in (10, 4000, 4001, 4002)
    ]
