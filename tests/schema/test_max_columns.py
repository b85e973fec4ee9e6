"""max_columns: a table grows by schema evolution or inference to at most its cap,
across any number of requests (nested fields, list elements and map keys and values
counted), and a change past it is refused whole: HTTP 400 naming the table, the cap
and the width it would reach, Kafka dead letters ``schema_change``, while everything
acked before stays in the table exactly once. Real daemon processes throughout."""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
import time
import tomllib
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pyarrow as pa
import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.schema import Schema, index_by_id
from pyiceberg.types import (
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
)
from support.daemon_harness import CATALOG_NAME, NDJSON, TABLE, Daemon, DaemonDir, ndjson
from support.kafka_harness import Broker, create_topic, produce_values, unique_name

from icespool.config import validate_config
from icespool.errors import ConfigError
from icespool.schema import count_columns, plan_evolution, render_type

ARROW = "application/vnd.apache.arrow.stream"
INFERRED = "t.inferred"


def _refusal(table: str, column: str, columns: int, cap: int) -> str:
    """The whole 400 text / dead-letter error of a change past ``cap``."""
    return (
        f"column {column!r}: table {table} would have {columns} columns (nested fields "
        f"counted), more than its max_columns = {cap}; raise max_columns for the table "
        "or send fewer distinct fields"
    )


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    started: list[Daemon] = []
    try:
        yield started
    finally:
        for daemon in started:
            daemon.cleanup()


async def _start(home: DaemonDir, daemons: list[Daemon], env: Mapping[str, str] = {}) -> Daemon:
    daemon = Daemon(home)
    daemons.append(daemon)
    daemon.start(env=env)
    await daemon.wait_ready()
    return daemon


def _load(home: DaemonDir, name: str) -> tuple[list[dict[str, Any]], Schema]:
    """Every row of ``name`` and its current schema, as the catalog holds them."""
    catalog = load_catalog(CATALOG_NAME, **home.catalog_properties)
    try:
        table = catalog.load_table(name)
        return table.scan().to_arrow().to_pylist(), table.schema()
    finally:
        catalog.engine.dispose()  # type: ignore[attr-defined]


def _exists(home: DaemonDir, name: str) -> bool:
    catalog = load_catalog(CATALOG_NAME, **home.catalog_properties)
    try:
        catalog.load_table(name)
        return True
    except NoSuchTableError:
        return False
    finally:
        catalog.engine.dispose()  # type: ignore[attr-defined]


def _assert_once(rows: Sequence[Mapping[str, Any]], ids: Sequence[int]) -> None:
    counts = Counter(r["id"] for r in rows)
    assert sorted(counts) == sorted(ids), sorted(set(counts) ^ set(ids))
    assert [i for i, n in counts.items() if n > 1] == []


def _metric(text: str, line_start: str) -> float:
    values = [
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_start)
    ]
    assert len(values) == 1, (line_start, values)
    return values[0]


# ------------------------------------------------------------------ counting


def test_columns_count_every_field_with_an_id() -> None:
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(
            2,
            "s",
            StructType(NestedField(5, "a", StringType()), NestedField(6, "b", IntegerType())),
        ),
        NestedField(3, "tags", ListType(7, LongType())),
        NestedField(4, "attrs", MapType(8, StringType(), 9, ListType(10, StringType()))),
    )
    assert count_columns(schema.fields) == len(index_by_id(schema)) == 10
    incoming = pa.schema(
        [
            ("s", pa.struct([("a", pa.string()), ("c", pa.struct([("x", pa.int64())]))])),
            ("m", pa.map_(pa.string(), pa.int64())),
        ]
    )
    plan = plan_evolution(schema, incoming, "add-columns")
    assert [(".".join(p), render_type(t)) for p, t in plan.adds] == [
        ("s.c", "struct<x: long>"),
        ("m", "map<string, long>"),
    ]
    assert plan.added_columns == 2 + 3


# ------------------------------------------------------------------ config


def _raw(tmp_path: Path, **table: Any) -> dict[str, Any]:
    return {
        "catalog": {
            "name": "lake",
            "type": "sql",
            "uri": f"sqlite:///{tmp_path}/c.db",
            "warehouse": tmp_path.as_uri(),
        },
        "spool": {"dir": str(tmp_path / "spool")},
        "tables": [
            {
                "name": "demo.wide",
                "create": True,
                "evolve": "add-columns",
                "schema": [
                    {"name": "id", "type": "long", "required": True},
                    {"name": "s", "type": "struct<a: int, b: list<string>>"},
                ],
                **table,
            },
            {"name": "demo.plain"},
        ],
    }


def test_max_columns_defaults_to_1000_and_is_set_per_table_or_in_defaults(tmp_path: Path) -> None:
    config = validate_config(_raw(tmp_path, max_columns=5))
    assert config.defaults.max_columns == 1000
    assert config.table_settings("demo.wide").max_columns == 5
    assert config.table_settings("demo.plain").max_columns == 1000
    raw = _raw(tmp_path)
    raw["defaults"] = {"max_columns": 40}
    config = validate_config(raw)
    assert [config.table_settings(n).max_columns for n in ("demo.wide", "demo.plain")] == [40, 40]


@pytest.mark.parametrize(
    ("defaults", "table", "line"),
    [
        (
            {},
            {"max_columns": 4},
            "config key 'tables[0].max_columns' (table 'demo.wide'): 4 is less than the 5 "
            "columns of the declared schema (nested fields counted); raise it to at least that",
        ),
        (
            {},
            {"max_columns": 0},
            "config key 'tables[0].max_columns' (table 'demo.wide'): Input should be greater "
            "than or equal to 1; got 0",
        ),
        (
            {"max_columns": 100_001},
            {},
            "config key 'defaults.max_columns': Input should be less than or equal to 100000; "
            "got 100001",
        ),
    ],
)
def test_bad_max_columns_is_a_config_error_naming_the_key(
    tmp_path: Path, defaults: dict[str, Any], table: dict[str, Any], line: str
) -> None:
    raw = _raw(tmp_path, **table)
    raw["defaults"] = defaults
    with pytest.raises(ConfigError) as caught:
        validate_config(raw)
    assert [p.line() for p in caught.value.problems] == [line]


def test_check_config_validates_max_columns(tmp_path: Path) -> None:
    text = f"""
[catalog]
name = "lake"
type = "sql"
uri = "sqlite:///{tmp_path}/c.db"
warehouse = "{tmp_path.as_uri()}"

[defaults]
max_columns = 300

[[tables]]
name = "demo.wide"
create = true
evolve = "add-columns"
schema = [
  {{ name = "id", type = "long", required = true }},
  {{ name = "m", type = "map<string, long>" }},
]
max_columns = 3
"""
    path = tmp_path / "icespool.toml"
    script = Path(sys.executable).parent / "icespool"

    def check(config: str) -> subprocess.CompletedProcess[str]:
        path.write_text(config)
        return subprocess.run(
            [str(script), "check-config", "--config", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={k: v for k, v in os.environ.items() if not k.startswith("ICESPOOL")},
        )

    refused = check(text)
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr == (
        "error: config key 'tables[0].max_columns' (table 'demo.wide'): 3 is less than the 4 "
        "columns of the declared schema (nested fields counted); raise it to at least that\n"
    )
    accepted = check(text.replace("max_columns = 3\n", "max_columns = 4\n"))
    assert accepted.returncode == 0, accepted.stderr
    effective = tomllib.loads(accepted.stdout)
    assert effective["defaults"]["max_columns"] == 300
    assert effective["tables"][0]["max_columns"] == 4


# ------------------------------------------------------------------ HTTP


async def test_http_growth_across_requests_stops_at_max_columns(
    tmp_path: Path, daemons: list[Daemon]
) -> None:
    home = DaemonDir(tmp_path / "d")
    home.write_config(
        extra=(
            'evolve = "add-columns"\nmax_columns = 20\n'
            f'\n[[tables]]\nname = "{INFERRED}"\ncreate = true\ninfer = true\n'
        )
    )
    daemon = await _start(home, daemons)
    acked: list[int] = []
    async with aiohttp.ClientSession() as http:

        async def post(records: list[dict[str, Any]], table: str = TABLE) -> tuple[int, Any]:
            async with http.post(
                daemon.records_url(table), data=ndjson(records), headers={"Content-Type": NDJSON}
            ) as resp:
                answer = await resp.json()
            if resp.status == 200:
                acked.extend(r["id"] for r in records if table == TABLE)
            return resp.status, answer

        # id, v + 18 more columns over seven requests: the last one reaches the cap.
        growth: list[tuple[list[dict[str, Any]], int]] = [
            ([{"id": 0, "v": "a", "k0": 1, "k1": 2, "k2": 3}, {"id": 1}], 5),
            ([{"id": 2, "s": {"a": 1, "b": "x"}}], 8),  # a struct and its two fields
            ([{"id": 3, "tags": [1, 2]}], 10),  # a list and its element
            ([{"id": 4, "k3": 1, "k4": 1}, {"id": 5, "k5": 1}], 13),
            ([{"id": 6, "k6": 1, "k7": 1, "k8": 1}], 16),
            ([{"id": 7, "k9": 1, "k10": 1, "k11": 1}], 19),
            ([{"id": 8, "k12": 1, "v": "at the cap"}], 20),
        ]
        for records, width in growth:
            assert await post(records) == (200, {"accepted": len(records)})
            _, schema = await asyncio.to_thread(_load, home, TABLE)
            assert count_columns(schema.fields) == width

        def refused(column: str, columns: int) -> tuple[int, Any]:
            return 400, {"error": _refusal(TABLE, column, columns, 20)}

        # One column over, in a body whose other records need no change: none is acked.
        assert await post([{"id": 100, "v": "known"}, {"id": 101, "k13": 1}]) == refused("k13", 21)
        # 5,000 new keys in one record: refused whole, not 5,000 columns.
        wide = {"id": 103, **{f"w{i}": i for i in range(5000)}}
        assert await post([wide]) == refused("w0", 5020)

        async def post_arrow(table: pa.Table) -> tuple[int, Any]:
            sink = io.BytesIO()
            with pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table)
            async with http.post(
                daemon.records_url(), data=sink.getvalue(), headers={"Content-Type": ARROW}
            ) as resp:
                return resp.status, await resp.json()

        # Arrow bodies take the same way; a new field of an existing struct counts too.
        ids = pa.array([104], pa.int64())
        assert await post_arrow(pa.table({"id": ids, "arrow_new": ids})) == refused("arrow_new", 21)
        nested = pa.array(
            [{"a": 1, "b": "x", "c": 2}],
            pa.struct({"a": pa.int64(), "b": pa.string(), "c": pa.int64()}),
        )
        assert await post_arrow(pa.table({"id": ids, "s": nested})) == refused("s.c", 21)
        # The table still takes records of the columns it has.
        known = [{"id": 9, "k0": 5, "s": {"a": 2, "b": "y"}, "tags": [3]}]
        assert await post(known) == (200, {"accepted": 1})

        # An inferred table is created only within the default cap (1,000).
        over = [{"id": 0, **{f"c{i}": i for i in range(1000)}}]
        assert await post(over, INFERRED) == (400, {"error": _refusal(INFERRED, "?", 1001, 1000)})
        assert not await asyncio.to_thread(_exists, home, INFERRED)
        at_cap = [{"id": 1, **{f"c{i}": i for i in range(999)}}]
        assert await post(at_cap, INFERRED) == (200, {"accepted": 1})

        for table in (TABLE, INFERRED):
            async with http.post(daemon.flush_url(table)) as resp:
                assert resp.status == 200, await resp.text()
        metrics = await daemon.metrics(http)
    assert (
        _metric(metrics, 'icespool_records_rejected_total{reason="schema_change",table="t.events"}')
        == 5
    )
    rows, schema = await asyncio.to_thread(_load, home, TABLE)
    assert count_columns(schema.fields) == len(index_by_id(schema)) == 20
    assert [f.name for f in schema.fields] == [
        "id",
        "v",
        "k0",
        "k1",
        "k2",
        "s",
        "tags",
        *(f"k{i}" for i in range(3, 13)),
    ]
    _assert_once(rows, acked)
    assert acked == list(range(10))
    assert {r["id"]: r["k12"] for r in rows}[8] == 1
    inferred, inferred_schema = await asyncio.to_thread(_load, home, INFERRED)
    assert count_columns(inferred_schema.fields) == 1000
    assert [(r["id"], r["c998"]) for r in inferred] == [(1, 998)]


# ------------------------------------------------------------------ Kafka


def _kafka(broker: Broker, topic: str, extra: str) -> str:
    return f"""
[[kafka]]
bootstrap_servers = "{broker.bootstrap}"
group_id = "g-{topic}"
topics = ["{topic}"]
offset_commit_interval = "1s"
session_timeout = "4s"
{extra}
"""


async def _wait(
    home: DaemonDir, daemon: Daemon, name: str, count: int, within: float = 60
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + within
    rows: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        if await asyncio.to_thread(_exists, home, name):
            rows, _ = await asyncio.to_thread(_load, home, name)
            if len(rows) >= count:
                return rows
        await asyncio.sleep(0.3)
    raise AssertionError(f"{name}: {len(rows)} rows, not {count}\n{daemon.tail()}")


async def test_kafka_records_past_max_columns_are_schema_change_dead_letters(
    tmp_path: Path, broker: Broker, daemons: list[Daemon]
) -> None:
    topic = unique_name("max-columns")
    await create_topic(broker.bootstrap, topic, 1)
    home = DaemonDir(tmp_path / "d")
    home.write_config(
        batch_timeout="1s",
        extra='evolve = "add-columns"\nmax_columns = 5\n'
        + _kafka(broker, topic, f'table = "{TABLE}"'),
    )
    daemon = await _start(home, daemons)

    def values(records: list[dict[str, Any]]) -> list[bytes]:
        return [json.dumps(r).encode() for r in records]

    # Up to the cap: id, v, a, b, c.
    await produce_values(
        broker.bootstrap, topic, values([{"id": 0, "v": "x"}, {"id": 1, "a": 1, "b": 2, "c": 3}])
    )
    await _wait(home, daemon, TABLE, 2)
    # Offsets 2 and 4 need column d (a sixth); 3 and 5 fit, as does a later fetch.
    await produce_values(
        broker.bootstrap,
        topic,
        values(
            [{"id": 2, "d": 1}, {"id": 3, "v": "ok", "a": 5}, {"id": 4, "d": 2}, {"id": 5, "c": 9}]
        ),
    )
    dead = await _wait(home, daemon, f"{TABLE}_dead_letter", 2)
    await produce_values(broker.bootstrap, topic, values([{"id": 6, "b": 7}]))
    rows = await _wait(home, daemon, TABLE, 5)
    await asyncio.sleep(2)  # nothing more arrives late
    rows, schema = await asyncio.to_thread(_load, home, TABLE)
    dead, _ = await asyncio.to_thread(_load, home, f"{TABLE}_dead_letter")
    _assert_once(rows, [0, 1, 3, 5, 6])
    assert {r["id"]: (r["a"], r["c"]) for r in rows}[3] == (5, None)
    assert [f.name for f in schema.fields] == ["id", "v", "a", "b", "c"]
    error = _refusal(TABLE, "d", 6, 5)
    assert sorted((d["offset"], d["target_table"], d["reason"], d["error"]) for d in dead) == [
        (2, TABLE, "schema_change", error),
        (4, TABLE, "schema_change", error),
    ]
    assert [json.loads(d["value"])["id"] for d in sorted(dead, key=lambda d: d["offset"])] == [2, 4]


async def test_kafka_auto_create_refuses_a_route_wider_than_max_columns(
    tmp_path: Path, broker: Broker, daemons: list[Daemon]
) -> None:
    topic = unique_name("max-columns-routes")
    await create_topic(broker.bootstrap, topic, 1)
    home = DaemonDir(tmp_path / "d")
    home.write_config(
        batch_timeout="1s",
        extra=_kafka(
            broker,
            topic,
            'route_field = "kind"\ntable_template = "routed.{value}"\nauto_create = true',
        ),
    )
    # [defaults] max_columns from the environment, as any key can be.
    daemon = await _start(home, daemons, env={"ICESPOOL__DEFAULTS__MAX_COLUMNS": "4"})
    records = [
        {"kind": "a", "id": 0},
        {"kind": "b", "id": 1, "x": 1, "y": 2, "z": 3},
        {"kind": "a", "id": 2, "n": 1},
    ]
    await produce_values(broker.bootstrap, topic, [json.dumps(r).encode() for r in records])
    dead = await _wait(home, daemon, "routed.kafka_dead_letter", 1)
    rows = await _wait(home, daemon, "routed.a", 2)
    await asyncio.sleep(2)
    rows, schema = await asyncio.to_thread(_load, home, "routed.a")
    dead, _ = await asyncio.to_thread(_load, home, "routed.kafka_dead_letter")
    _assert_once(rows, [0, 2])
    assert count_columns(schema.fields) == 3
    assert [(d["offset"], d["target_table"], d["reason"], d["error"]) for d in dead] == [
        (1, "routed.b", "schema_change", _refusal("routed.b", "?", 5, 4))
    ]
    assert not await asyncio.to_thread(_exists, home, "routed.b")
