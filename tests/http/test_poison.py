"""Poison corpus for HTTP ingest against ONE real ``icespool run`` child: every poison
body gets its exact 4xx and a message naming the problem, nothing of it is
written, every good body lands exactly once, and the child is alive at the end
(the 100,000-deep body into ``infer = true`` used to overflow pyarrow's C stack:
SIGSEGV).

Covers issue 11 items 3 (out-of-range values), 4 (deep nesting), 5 (UTF-8 at every
depth), plus non-object JSON and empty bodies, for NDJSON and Arrow stream bodies.
"""

from __future__ import annotations

import asyncio
import datetime
import decimal
import itertools
import json
import random
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from pyiceberg.catalog import load_catalog
from support.daemon_harness import CATALOG_NAME, Daemon, DaemonDir
from support.daemon_harness import TABLE as HARNESS_TABLE

from icespool.config import validate_config
from icespool.decode import JsonOptions, decode_ndjson
from icespool.decode._nesting import depth, too_deep_lines
from icespool.errors import BadInputError, ConfigError

TABLE = "t.poison"
INFERRED = "t.inferred"
NDJSON = "application/x-ndjson"
ARROW = "application/vnd.apache.arrow.stream"
NESTED_10 = "list<" * 9 + "long" + ">" * 9  # the record object is the 10th level

_EXTRA = f"""
[[tables]]
name = "{TABLE}"
create = true
schema = [
  {{ name = "id", type = "long", required = true }},
  {{ name = "s", type = "string" }},
  {{ name = "l", type = "list<string>" }},
  {{ name = "st", type = "struct<f: string, d: date>" }},
  {{ name = "m", type = "map<string, string>" }},
  {{ name = "n", type = "{NESTED_10}" }},
  {{ name = "tz", type = "timestamptz" }},
  {{ name = "ts", type = "timestamp" }},
  {{ name = "d", type = "date" }},
  {{ name = "t", type = "time" }},
  {{ name = "dec", type = "decimal(10,2)" }},
  {{ name = "big", type = "decimal(38,0)" }},
  {{ name = "d38", type = "decimal(38,10)" }},
]

[[tables]]
name = "{INFERRED}"
create = true
infer = true
"""

_ids = itertools.count(1)


def _line(**fields: Any) -> bytes:
    return json.dumps({"id": next(_ids), **fields}).encode()


def _body(*lines: bytes) -> bytes:
    return b"\n".join(lines) + b"\n"


def _deep(depth: int) -> bytes:
    """A line nesting ``depth`` levels inside column ``n`` (the object is level 1)."""
    return b'{"id":0,"n":' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


def _arrow(column: str, values: pa.Array) -> bytes:
    ids = [next(_ids) for _ in range(len(values))]
    table = pa.table({"id": pa.array(ids, pa.int64()), column: values})
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


_US = pa.timestamp("us", "UTC")
_FIRST_US, _LAST_US = -62135596800_000_000, 253402300799_999_999
_FIRST_DAY, _LAST_DAY = -719162, 2932896
_DAY_US = 86_400_000_000

# (case, table, body, content type, status, fragments the message must contain)
POISON: list[tuple[str, str, bytes, str, int, list[str]]] = [
    ("deep-1000", TABLE, _body(_line(), _deep(1_000)), NDJSON, 400,
     ["line 2", "nests deeper than 64 levels", "max_nesting_depth"]),
    ("deep-100000", TABLE, _body(_deep(100_000)), NDJSON, 400,
     ["line 1", "nests deeper than 64 levels"]),
    ("deep-65", TABLE, _body(_deep(65)), NDJSON, 400, ["line 1", "nests deeper than 64"]),
    ("infer-deep-100000", INFERRED,
     _body(b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"), NDJSON, 400,
     ["line 1", "nests deeper than 64"]),
    # Created, acked, then uncommittable: Iceberg's Avro manifests refuse empty names.
    ("infer-empty-name", INFERRED, _body(b'{"":1}'), NDJSON, 400, ["must not be empty"]),
    ("infer-empty-nested-name", INFERRED, _body(b'{"s":{"":1}}'), NDJSON, 400,
     ["'s.'", "must not be empty"]),
    # 100,000 keys made a table whose first flush ran for minutes and stalled the loop.
    ("infer-too-many-fields", INFERRED,
     _body(json.dumps({f"c{i}": i for i in range(10_001)}).encode()), NDJSON, 400,
     ["10001 fields", "at most 10000"]),
    ("utf8-top", TABLE, _body(_line(), b'{"id":1,"s":"a\xffb"}'), NDJSON, 400,
     ["'s'", "not valid UTF-8", "line 2"]),
    ("utf8-list", TABLE, _body(_line(), b'{"id":1,"l":["ok","\xfe"]}'), NDJSON, 400,
     ["'l'", "not valid UTF-8", "line 2"]),
    ("utf8-struct", TABLE, _body(b'{"id":1,"st":{"f":"\xc3\x28"}}'), NDJSON, 400,
     ["'st'", "not valid UTF-8", "line 1"]),
    ("utf8-map-key", TABLE, _body(b'{"id":1,"m":[{"key":"\xff","value":"v"}]}'), NDJSON, 400,
     ["'m'", "not valid UTF-8", "line 1"]),
    ("utf8-map-value", TABLE, _body(b'{"id":1,"m":[{"key":"k","value":"\xff"}]}'), NDJSON,
     400, ["'m'", "not valid UTF-8", "line 1"]),
    ("huge-long", TABLE, _body(b'{"id":9223372036854775808}'), NDJSON, 400, ["'id'"]),
    ("huge-decimal", TABLE, _body(_line(big="1" + "0" * 38)), NDJSON, 400, ["'big'"]),
    # pyarrow's decimal parser crashed the process (SIGSEGV) on these exponents.
    ("decimal-huge-exponent", TABLE, _body(_line(), _line(big="1e-9999999")), NDJSON, 400,
     ["line 2", "exponent of 5 or more digits"]),
    ("decimal-huge-exponent-number", TABLE, _body(b'{"id":1,"dec":0e-5000000}'), NDJSON, 400,
     ["line 1", "exponent of 5 or more digits"]),
    ("arrow-decimal-huge-exponent-text", TABLE, _arrow("big", pa.array(["1.5", "1e-9999999"])),
     ARROW, 400, ["'big'", "exponent of 5 or more digits"]),
    # 29 integer digits as written, 39 once scaled to 10 places: one past 38.
    ("decimal-38-one-past-by-scale", TABLE, _body(_line(d38="1e28")), NDJSON, 400,
     ["'d38'", "at most 28 integer"]),
    # A token pyarrow cannot read at all is the line's fault, not the first column's.
    ("lone-surrogate", TABLE, _body(b'{"id":1,"s":"\\ud800"}'), NDJSON, 400,
     ["line 1", "surrogate"]),
    ("decimal-one-past", TABLE, _body(_line(dec="100000000.00")), NDJSON, 400,
     ["'dec'", "at most 8 integer"]),
    ("tz-year-0", TABLE, _body(_line(tz="0000-12-31T23:59:59Z")), NDJSON, 400,
     ["'tz'", "out of range", "0001-01-01", "line 1"]),
    ("tz-year-10000", TABLE, _body(_line(tz="10000-01-01T00:00:00Z")), NDJSON, 400, ["'tz'"]),
    ("ts-year-0", TABLE, _body(_line(ts="0000-12-31T23:59:59.999999")), NDJSON, 400,
     ["'ts'", "out of range"]),
    ("date-year-0", TABLE, _body(_line(d="0000-12-31")), NDJSON, 400,
     ["'d'", "out of range"]),
    ("nested-date-year-0", TABLE, _body(_line(), _line(st={"d": "0000-12-31"})), NDJSON, 400,
     ["'st.d'", "out of range", "line 2"]),
    ("time-24h", TABLE, _body(_line(t="24:00:00")), NDJSON, 400, ["'t'"]),
    ("arrow-tz-minus-2^62", TABLE,
     _arrow("tz", pa.array([0, -(2**62)], pa.int64()).view(_US)), ARROW, 400,
     ["'tz'", "out of range", "row 2"]),
    ("arrow-tz-one-past", TABLE,
     _arrow("tz", pa.array([_LAST_US + 1], pa.int64()).view(_US)), ARROW, 400,
     ["'tz'", "out of range"]),
    # Text in an Arrow body becomes a time only in the cast: it was never range-checked.
    ("arrow-text-ts-year-0", TABLE, _arrow("ts", pa.array(["0000-12-31T23:59:59"])), ARROW, 400,
     ["'ts'", "out of range", "0001-01-01"]),
    ("arrow-text-date-year-0", TABLE, _arrow("d", pa.array(["0000-12-31"])), ARROW, 400,
     ["'d'", "out of range"]),
    ("arrow-date-one-before", TABLE, _arrow("d", pa.array([_FIRST_DAY - 1], pa.date32())),
     ARROW, 400, ["'d'", "out of range"]),
    # pyarrow's own full validation of the stream refuses a time of day past 24 h.
    ("arrow-time-24h", TABLE, _arrow("t", pa.array([_DAY_US], pa.time64("us"))), ARROW, 400,
     ["not within the acceptable range"]),
    ("arrow-decimal-39-digits", TABLE,
     _arrow("big", pa.array([decimal.Decimal("1" + "0" * 38)], pa.decimal256(39, 0))),
     ARROW, 400, ["'big'"]),
    # The reader stopped at the first end-of-stream marker and acked the rest unread.
    ("arrow-two-streams", TABLE, _arrow("s", pa.array(["a"])) + _arrow("s", pa.array(["b"])),
     ARROW, 400, ["bytes follow the end of the Arrow stream"]),
    ("non-object-array", TABLE, _body(b"[1,2]"), NDJSON, 400, ["line 1", "JSON object"]),
    ("non-object-string", TABLE, _body(_line(), b'"text"'), NDJSON, 400,
     ["line 2", "JSON object"]),
    ("non-object-null", TABLE, _body(_line(), b"null"), NDJSON, 400, ["line 2"]),
    ("empty", TABLE, b"", NDJSON, 400, ["empty"]),
    ("blank-lines", TABLE, b"\n \n", NDJSON, 400, ["no records"]),
]  # fmt: skip

_D38 = "9" * 28 + "." + "9" * 10

# (case, body, content type) that must be accepted: the edges themselves.
EDGES: list[tuple[str, bytes, str]] = [
    ("deep-10", _body(b'{"id":%d,"n":' % next(_ids) + b"[" * 9 + b"]" * 9 + b"}"), NDJSON),
    ("temporal-first", _body(_line(tz="0001-01-01T00:00:00Z", ts="0001-01-01T00:00:00",
                                   d="0001-01-01", t="00:00:00")), NDJSON),
    ("temporal-last", _body(_line(tz="9999-12-31T23:59:59.999999Z",
                                  ts="9999-12-31T23:59:59.999999", d="9999-12-31",
                                  t="23:59:59.999999", st={"d": "9999-12-31"})), NDJSON),
    ("decimal-edges", _body(_line(dec="99999999.99", big="9" * 38, d38=_D38),
                            _line(dec="-99999999.99", big="-" + "9" * 38, d38="-" + _D38)),
     NDJSON),
    # One record longer than two of pyarrow's read blocks (it refused: "straddling
    # object straddles two block boundaries").
    ("huge-record", _body(_line(), _line(s="h" * 700_000), _line()), NDJSON),
    # A table with decimals still takes text that merely contains a 5-digit exponent.
    ("exponent-like-text", _body(_line(s="a3e12345b", l=["x1e-99999"])), NDJSON),
    ("utf8-everywhere", _body(_line(s="é😀", l=["ü"], st={"f": "ß"},
                                    m=[{"key": "ключ", "value": "值"}])), NDJSON),
    ("arrow-edges", _arrow("tz", pa.array([_FIRST_US, _LAST_US], pa.int64()).view(_US)), ARROW),
    ("arrow-text-edges", _arrow("ts", pa.array(["0001-01-01T00:00:00",
                                                "9999-12-31T23:59:59.999999"])), ARROW),
]  # fmt: skip


@pytest.fixture(scope="module")
def child(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One real daemon for the corpus: poison must not cost it its life."""
    home = DaemonDir(tmp_path_factory.mktemp("poison-http"))
    home.write_config(extra=_EXTRA)
    daemon = Daemon(home)
    daemon.start()
    try:
        asyncio.run(daemon.wait_ready())
        yield daemon
    finally:
        daemon.cleanup()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def _post(
    http: aiohttp.ClientSession, child: Daemon, table: str, body: bytes, kind: str
) -> tuple[int, str]:
    async with http.post(
        child.records_url(table), data=body, headers={"Content-Type": kind}
    ) as reply:
        return reply.status, await reply.text()


@pytest.mark.parametrize(
    ("table", "body", "kind", "status", "fragments"),
    [pytest.param(*case[1:], id=case[0]) for case in POISON],
)
async def test_poison_gets_its_4xx_naming_the_problem(
    child: Daemon,
    http: aiohttp.ClientSession,
    table: str,
    body: bytes,
    kind: str,
    status: int,
    fragments: list[str],
) -> None:
    answered, text = await _post(http, child, table, body, kind)
    assert answered == status, text
    message = json.loads(text)["error"]
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    assert child.running, child.tail()


async def test_edges_land_exactly_once_and_the_daemon_outlives_the_corpus(
    child: Daemon, http: aiohttp.ClientSession
) -> None:
    expected: list[int] = []
    for case, body, kind in EDGES:
        answered, text = await _post(http, child, TABLE, body, kind)
        assert answered == 200, (case, text)
        expected.extend(_ids_in(body, kind))
    # The poison corpus again, in between, then a good body: nothing of it is written.
    for _, table, body, kind, status, _ in POISON:
        assert (await _post(http, child, table, body, kind))[0] == status
    answered, text = await _post(http, child, TABLE, _body(_line(s="after")), NDJSON)
    assert answered == 200, text
    expected.append(next(_ids) - 1)
    async with http.post(child.flush_url(TABLE)) as reply:
        assert reply.status == 200, await reply.text()
    rows = await asyncio.to_thread(_rows, child.home)
    assert sorted(r["id"] for r in rows) == sorted(expected)  # each exactly once
    by_id = {r["id"]: r for r in rows}
    first, last = by_id[_ids_in(EDGES[1][1], NDJSON)[0]], by_id[_ids_in(EDGES[2][1], NDJSON)[0]]
    assert first["tz"] == datetime.datetime(1, 1, 1, tzinfo=datetime.UTC)
    assert last["ts"] == datetime.datetime(9999, 12, 31, 23, 59, 59, 999999)
    assert last["d"] == datetime.date(9999, 12, 31) and last["t"] == datetime.time.max
    decimals = [r["big"] for r in rows if r["big"] is not None]
    assert sorted(decimals) == [decimal.Decimal("-" + "9" * 38), decimal.Decimal("9" * 38)]
    d38 = sorted(r["d38"] for r in rows if r["d38"] is not None)
    assert d38 == [decimal.Decimal("-" + _D38), decimal.Decimal(_D38)]
    assert {r["s"] for r in rows} >= {"a3e12345b", "h" * 700_000}
    assert child.running, child.tail()
    async with http.get(f"{child.url}/healthz") as reply:
        assert reply.status == 200
    # The infer = true table was never created from poison.
    assert not await asyncio.to_thread(_exists, child.home, INFERRED)


def _ids_in(body: bytes, kind: str) -> list[int]:
    if kind == ARROW:
        return ipc.open_stream(body).read_all().column("id").to_pylist()
    return [json.loads(line)["id"] for line in body.splitlines() if line.strip()]


def _rows(home: DaemonDir) -> list[dict[str, Any]]:
    catalog = load_catalog(CATALOG_NAME, **home.catalog_properties)
    try:
        rows: list[dict[str, Any]] = catalog.load_table(TABLE).scan().to_arrow().to_pylist()
        return rows
    finally:
        catalog.engine.dispose()


def _exists(home: DaemonDir, name: str) -> bool:
    catalog = load_catalog(CATALOG_NAME, **home.catalog_properties)
    try:
        return bool(catalog.table_exists(name))
    finally:
        catalog.engine.dispose()


# ------------------------------------------------------------------ the guard itself


@pytest.mark.parametrize(
    ("line", "levels"),
    [
        (b'{"a":1}', 1),
        (b'{"a":"[[[{{{"}', 1),  # brackets inside strings do not nest
        (b'{"a":"\\"[[[","b":[[]]}', 3),  # an escaped quote does not end the string
        (b'{"a":"\\\\","b":[[]]}', 3),  # an escaped backslash does not escape the quote
        (b"[" * 64 + b"]" * 64, 64),
        (b"[" * 65, 65),  # unclosed: still measured
    ],
)
def test_depth_counts_brackets_outside_strings_only(line: bytes, levels: int) -> None:
    assert depth(line) == levels


def _reference_depth(line: bytes) -> int:
    """Byte by byte: a quote after an odd run of backslashes is escaped."""
    level = deepest = run = 0
    inside = False
    for byte in line:
        if byte == ord("\\"):
            run += 1
            continue
        escaped, run = run % 2 == 1, 0
        if byte == ord('"') and not escaped:
            inside = not inside
        elif not inside and byte in b"[{":
            level += 1
            deepest = max(deepest, level)
        elif not inside and byte in b"]}":
            level -= 1
    return deepest


def test_the_guard_agrees_with_a_byte_by_byte_reference() -> None:
    """The exact path drops everything but brackets, unescaped quotes and newlines
    before its numpy pass; random lines over the bytes that matter must measure
    exactly as a byte-by-byte reader does."""
    rng = random.Random(11)
    lines = [bytes(rng.choices(b'[]{}"\\ab', k=rng.randint(0, 120))) for _ in range(3_000)]
    for line in lines[:500]:
        assert depth(line) == _reference_depth(line), line
    body = b"\n".join(lines)
    for limit in (3, 8, 20):
        expected = [k for k, line in enumerate(lines) if _reference_depth(line) > limit]
        assert too_deep_lines(body, limit) == expected


def test_max_nesting_depth_is_the_limit_and_configurable() -> None:
    schema = pa.schema([("id", pa.int64()), ("x", pa.string())])
    at_limit = b'{"id":1,"x":' + b"[" * 63 + b"]" * 63 + b"}"
    # 64 levels pass the guard (then fail as a schema mismatch, not as "too deep").
    with pytest.raises(BadInputError) as mismatch:
        decode_ndjson(at_limit, schema)
    assert mismatch.value.reason == "invalid"
    with pytest.raises(BadInputError) as deep:
        decode_ndjson(at_limit, schema, JsonOptions(max_depth=63))
    assert deep.value.reason == "too_deep" and "deeper than 63 levels" in str(deep.value)
    assert too_deep_lines(b'{"a":1}\n' + at_limit + b"\n" + at_limit, 63) == [1, 2]
    with pytest.raises(ConfigError, match="max_nesting_depth"):
        validate_config({"defaults": {"max_nesting_depth": 5000}})


@pytest.mark.parametrize(
    ("headers", "status", "fragment"),
    [
        pytest.param(b"Content-Type: \xff/\xfe\r\n", 415, "unsupported Content-Type",
                     id="ct-bytes"),
        pytest.param(b"Content-Type: application/x-ndjson\r\nNo colon here\r\n", 400, "",
                     id="header-line-without-colon"),
        pytest.param(b"Content-Type: application/x-ndjson\r\nContent-Length: nine\r\n", 400, "",
                     id="content-length-not-a-number"),
        pytest.param(b"Content-Type: application/x-ndjson\r\nX-Note: \xff\xfe\r\n", 200, "",
                     id="header-value-not-utf8"),
    ],
)  # fmt: skip
async def test_unparseable_request_headers_get_a_4xx_and_the_daemon_goes_on(
    child: Daemon, http: aiohttp.ClientSession, headers: bytes, status: int, fragment: str
) -> None:
    body = _body(_line())  # into the harness's own table: the corpus table's ids stay exact
    length = b"" if b"Content-Length" in headers else b"Content-Length: %d\r\n" % len(body)
    request = (
        b"POST /v1/tables/%s/records HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        % HARNESS_TABLE.encode()
        + headers
        + length
        + b"\r\n"
        + body
    )
    assert child.port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", child.port)
    try:
        writer.write(request)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line.split()[1] == str(status).encode(), answer
    assert fragment.encode() in rest
    async with http.get(f"{child.url}/healthz") as reply:
        assert reply.status == 200
