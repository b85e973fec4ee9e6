"""``application/json`` bodies: a JSON array of objects, taken like NDJSON.

The conversion (`icespool.decode._json_array.ndjson_from_array`) is checked on its own first
(element boundaries inside strings, escapes, pretty-printing, every malformed shape),
then over real HTTP against a real service: the value rules, all-or-nothing, and
errors that name the array index and the column.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from pyiceberg.catalog import load_catalog
from support.fixture_types import MakeConfig, RunDaemon

from icespool.decode import ndjson_from_array
from icespool.errors import BadInputError
from icespool.lifecycle.service import Icespool

JSON = "application/json"
DEMO = "demo.events"
INFERRED = "lab.inferred"
TRICKY = ["a,b", "]}", "{[", 'q"uote', "back\\slash", '\\"', "\\", "tab\there", "ü€😀", ""]


# ------------------------------------------------------------------ the conversion alone


def _lines(converted: bytes) -> list[Any]:
    return [json.loads(line) for line in converted.split(b"\n")]


@pytest.mark.parametrize("indent", [None, 0, 2, "\t"])
def test_each_element_becomes_exactly_one_line_whatever_its_strings_hold(indent: Any) -> None:
    rng = random.Random(7)
    records = [
        {
            "id": i,
            "s": rng.choice(TRICKY) + rng.choice(TRICKY),
            "nested": {"l": [rng.choice(TRICKY), {"x": [1, [2, {"y": "]"}]]}]},
        }
        for i in range(500)
    ]
    body = json.dumps(records, indent=indent, ensure_ascii=rng.random() < 0.5).encode()
    assert _lines(ndjson_from_array(b" \r\n" + body + b"\n\t ")) == records


def test_a_big_array_converts_at_bulk_speed() -> None:
    records = [
        {"event_id": i, "ts": "2024-05-01T12:00:00Z", "kind": f"k,{i}]"} for i in range(200_000)
    ]
    body = json.dumps(records).encode()
    started = time.perf_counter()
    converted = ndjson_from_array(body)
    elapsed = time.perf_counter() - started
    assert converted.count(b"\n") == len(records) - 1
    assert _lines(converted)[-1] == records[-1]
    # ~10 MB: per-record Python would take far longer; whole-buffer passes take ~0.1 s.
    assert elapsed < 2.0, elapsed


POISON = [
    # (id, body, exact message)
    ("empty-body", b"", "no records: the body is empty; send a JSON array of objects"),
    ("blank-body", b" \n\t", "no records: the body is empty; send a JSON array of objects"),
    ("empty-array", b"[]", "no records: the JSON array is empty"),
    ("empty-array-spaced", b" [ \n ] ", "no records: the JSON array is empty"),
    ("top-level-object", b'{"event_id": 1}',
     "expected a JSON array of objects ([{...}, ...]), got an object; an application/json "
     "body is one array (send application/x-ndjson for one object per line)"),
    ("top-level-number", b"42",
     "expected a JSON array of objects ([{...}, ...]), got '42'; an application/json "
     "body is one array (send application/x-ndjson for one object per line)"),
    ("number-element", b'[{"event_id": 1}, 7]',
     "record at index 1: expected a JSON object, got a number"),
    ("null-element", b"[null]", "record at index 0: expected a JSON object, got null"),
    ("bool-element", b'[{"event_id": 1},{"event_id": 2}, true]',
     "record at index 2: expected a JSON object, got a boolean"),
    ("string-element", b'[{"event_id": 1}, "x"]',
     "record at index 1: expected a JSON object, got a string"),
    ("nested-array", b'[{"event_id": 1}, [{"event_id": 2}]]',
     "record at index 1: expected a JSON object, got an array"),
    ("trailing-comma", b'[{"event_id": 1},]',
     "record at index 1: empty element (two commas in a row or a trailing comma)"),
    ("double-comma", b'[{"event_id": 1},,{"event_id": 2}]',
     "record at index 1: empty element (two commas in a row or a trailing comma)"),
    ("leading-comma", b'[,{"event_id": 1}]',
     "record at index 0: empty element (two commas in a row or a trailing comma)"),
    ("trailing-garbage", b'[{"event_id": 1}] {"event_id": 2}',
     "trailing data after the JSON array at byte 17: ' {\"event_id\": 2}'; send one array "
     "per request"),
    ("two-arrays", b'[{"event_id": 1}][{"event_id": 2}]',
     "trailing data after the JSON array at byte 17: '[{\"event_id\": 2}]'; send one array "
     "per request"),
    ("unclosed", b'[{"event_id": 1}, {"event_id": 2}',
     "the JSON array is not closed (a truncated body?); send the whole array"),
    ("unclosed-string", b'[{"event_id": "1}]',
     "the JSON array is not closed (a truncated body?); send the whole array"),
    ("mismatched", b'[{"event_id": 1]}',
     "the JSON array is closed by '}' at byte 16; brackets do not match"),
    ("raw-newline-in-string", b'[{"event_id": 1}, {"kind": "a\nb"}]',
     "record at index 1: invalid JSON (a raw line break inside a string; write it as \\n)"),
    ("million-deep", b"[" * 1_000_000 + b"]" * 1_000_000,
     "record at index 0: expected a JSON object, got an array"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "message"), [c[1:] for c in POISON], ids=[c[0] for c in POISON])
def test_a_body_that_is_not_one_array_of_objects_is_refused_by_name(
    body: bytes, message: str
) -> None:
    with pytest.raises(BadInputError) as caught:
        ndjson_from_array(body)
    assert str(caught.value) == message


# ------------------------------------------------------------------ over HTTP


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client:
        yield client


@pytest.fixture
async def daemon(
    make_config: MakeConfig, run_daemon: RunDaemon
) -> AsyncIterator[tuple[Icespool, str]]:
    config = make_config(
        tables=[
            {
                "name": DEMO,
                "create": True,
                "schema": [
                    {"name": "event_id", "type": "long", "required": True},
                    {"name": "ts", "type": "timestamptz"},
                    {"name": "kind", "type": "string"},
                ],
            },
            {"name": INFERRED, "create": True, "infer": True},
        ],
        defaults={"max_nesting_depth": 8},
    )
    async with run_daemon(config) as running:
        yield running


async def _post(
    session: aiohttp.ClientSession, base: str, body: bytes, table: str = DEMO
) -> tuple[int, Any]:
    async with session.post(
        f"{base}/v1/tables/{table}/records", data=body, headers={"Content-Type": JSON}
    ) as reply:
        assert reply.headers["Content-Type"].startswith("application/json")
        return reply.status, await reply.json()


async def _committed(session: aiohttp.ClientSession, base: str, table: str = DEMO) -> int:
    async with session.post(f"{base}/v1/tables/{table}/flush") as reply:
        assert reply.status == 200
        records: int = (await reply.json())["records"]
        return records


async def test_an_array_is_acked_whole_and_committed_once(
    daemon: tuple[Icespool, str], session: aiohttp.ClientSession
) -> None:
    service, base = daemon
    records = [
        {"event_id": i, "ts": "2024-05-01T12:00:00+02:00", "kind": TRICKY[i % len(TRICKY)]}
        for i in range(1000)
    ]
    body = json.dumps(records, indent=1).encode()
    assert await _post(session, base, body) == (200, {"accepted": 1000})
    assert await _committed(session, base) == 1000
    config = service.config
    catalog = load_catalog(config.catalog.name, **config.catalog.properties())
    rows = catalog.load_table(DEMO).scan().to_arrow().sort_by("event_id").to_pylist()
    assert [r["event_id"] for r in rows] == list(range(1000))
    assert [r["kind"] for r in rows] == [r["kind"] for r in records]


async def test_a_table_created_from_its_first_array(
    daemon: tuple[Icespool, str], session: aiohttp.ClientSession
) -> None:
    _, base = daemon
    body = b'[{"id": 1, "name": "a"}, {"id": 2, "name": "b,]"}]'
    assert await _post(session, base, body, INFERRED) == (200, {"accepted": 2})
    assert await _committed(session, base, INFERRED) == 2


HTTP_POISON = [
    # (id, body, exact error) - the good first element must not be written either
    ("wrong-type", b'[{"event_id": 1}, {"event_id": 2, "kind": 5}]',
     "column 'kind': expected a string, got 5 (record at index 1)"),
    ("missing-required", b'[{"event_id": 1}, {"event_id": 2}, {"kind": "x"}]',
     "column 'event_id': required column is missing or null (record at index 2)"),
    ("unknown-column", b'[{"event_id": 1}, {"event_id": 2, "colour": "red"}]',
     "column 'colour': not in the table schema (record at index 1); the columns are "
     "event_id, ts, kind"),
    ("non-object", b'[{"event_id": 1}, 3]',
     "record at index 1: expected a JSON object, got a number"),
    ("nested-array", b'[{"event_id": 1}, [1, 2]]',
     "record at index 1: expected a JSON object, got an array"),
    ("object-not-array", b'{"event_id": 1}',
     "expected a JSON array of objects ([{...}, ...]), got an object; an application/json "
     "body is one array (send application/x-ndjson for one object per line)"),
    ("empty-array", b"[]", "no records: the JSON array is empty"),
    ("trailing-garbage", b'[{"event_id": 1}]x',
     "trailing data after the JSON array at byte 17: 'x'; send one array per request"),
    ("too-deep", b'[{"event_id": 1}, {"event_id": 2, "kind": ' + b"[" * 20 + b"]" * 20 + b"}]",
     "record at index 1: the JSON value nests deeper than 8 levels (max_nesting_depth); "
     "flatten the record or raise the limit"),
    ("invalid-json-in-element", b'[{"event_id": 1}, {"event_id": 2,, "kind": "x"}]',
     "record at index 1: invalid JSON (Expecting property name enclosed in double quotes "
     "at character 17)"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("body", "message"), [c[1:] for c in HTTP_POISON], ids=[c[0] for c in HTTP_POISON]
)
async def test_a_bad_array_is_refused_whole_naming_index_and_column(
    daemon: tuple[Icespool, str], session: aiohttp.ClientSession, body: bytes, message: str
) -> None:
    service, base = daemon
    assert await _post(session, base, body) == (400, {"error": message})
    assert service.writer(DEMO).pending_records == 0
    # The daemon goes on and takes the next good array; only it reaches the table.
    assert await _post(session, base, b'[{"event_id": 9}]') == (200, {"accepted": 1})
    assert await _committed(session, base) == 1


async def test_a_too_deep_array_cannot_create_an_inferred_table(
    daemon: tuple[Icespool, str], session: aiohttp.ClientSession
) -> None:
    service, base = daemon
    body = b'[{"id": 1, "v": ' + b"[" * 100_000 + b"]" * 100_000 + b"}]"
    status, reply = await _post(session, base, body, INFERRED)
    assert (status, reply) == (
        400,
        {
            "error": "record at index 0: the JSON value nests deeper than 8 levels "
            "(max_nesting_depth); flatten the record or raise the limit"
        },
    )
    assert service.awaiting_schema(INFERRED)
