"""A new field whose JSON type differs between the records of one input.

Over HTTP (a real daemon's HTTP API, all or nothing): numbers whole and not evolve a
double column; a mix no column type holds (a number and a string, a boolean and a
number, objects disagreeing inside) refuses the body whole as ``schema_change``,
naming the field, both types and their lines, and changes nothing. From Kafka (a real
broker): the table evolves with the type seen first (long and double make double), and
only the records that do not fit it are dead letters ``schema_change``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from support.fixture_types import MakeConfig, RunDaemon
from support.kafka_harness import SESSION_TIMEOUT, Broker, create_topic, produce_values, unique_name
from support.service_helpers import wait_rows

from icespool.lifecycle.service import Icespool

TABLE = "demo.mixed"
NDJSON = {"Content-Type": "application/x-ndjson"}
JSON = {"Content-Type": "application/json"}
_NO_TYPE = (
    "no column type holds both (whole numbers and fractions make double, dates and other "
    "text make string), so nothing of the body was taken: send one type for the field"
)


def _config(make_config: MakeConfig, **extra: Any) -> Any:
    return make_config(
        tables=[
            {
                "name": TABLE,
                "create": True,
                "evolve": "add-and-widen",
                "schema": [{"name": "id", "type": "long", "required": True}],
            }
        ],
        **extra,
    )


def _ndjson(records: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def _table(service: Icespool, name: str = TABLE) -> tuple[list[dict[str, Any]], list[str]]:
    assert service._catalog is not None
    loaded = service._catalog.load_table(name)
    rows = sorted(loaded.scan().to_arrow().to_pylist(), key=lambda r: r["id"])
    return rows, [f"{f.name}:{f.field_type}" for f in loaded.schema().fields]


def _rejected(metrics: str) -> dict[str, float]:
    prefix = "icespool_records_rejected_total{"
    out = {}
    for line in metrics.splitlines():
        if line.startswith(prefix) and f'table="{TABLE}"' in line:
            labels, value = line.rsplit(" ", 1)
            out[labels.split('reason="')[1].split('"')[0]] = float(value)
    return out


@pytest.mark.parametrize(
    ("records", "error"),
    [
        (
            [{"id": 1, "x": 1}, {"id": 2, "x": "a"}],
            f"column 'x': line 2 has a string where line 1 has a number; {_NO_TYPE}",
        ),
        (
            [{"id": 1, "x": None}, {"id": 2, "x": True}, {"id": 3, "x": 2}],
            f"column 'x': line 3 has a number where line 2 has a boolean; {_NO_TYPE}",
        ),
        (
            [{"id": 1, "w": {"a": 1, "b": "k"}}, {"id": 2, "w": {"b": "l"}}, {"id": 3, "w": 4}],
            f"column 'w': line 3 has a number where line 1 has an object; {_NO_TYPE}",
        ),
        (
            [{"id": 1, "w": {"a": [1]}}, {"id": 2, "w": {"a": ["q"]}}],
            f"column 'w.a.element': line 2 has a string where line 1 has a number; {_NO_TYPE}",
        ),
    ],
)
async def test_http_body_mixing_types_no_column_holds_is_refused_whole(
    make_config: MakeConfig, run_daemon: RunDaemon, records: list[dict[str, Any]], error: str
) -> None:
    async with (
        run_daemon(_config(make_config)) as (service, url),
        aiohttp.ClientSession() as http,
    ):
        post = f"{url}/v1/tables/{TABLE}/records"
        async with http.post(post, data=_ndjson(records), headers=NDJSON) as r:
            assert (r.status, await r.json()) == (400, {"error": error})
        async with http.get(f"{url}/metrics") as r:
            assert _rejected(await r.text()) == {"schema_change": len(records)}
        # Nothing changed and nothing was taken.
        async with http.post(post, data=_ndjson([{"id": 9}]), headers=NDJSON) as r:
            assert r.status == 200, await r.text()
        await service.flush(TABLE)
        rows, columns = await asyncio.to_thread(_table, service)
    assert (rows, columns) == ([{"id": 9}], ["id:long"])


async def test_http_json_array_names_the_indexes(
    make_config: MakeConfig, run_daemon: RunDaemon
) -> None:
    async with (
        run_daemon(_config(make_config)) as (_, url),
        aiohttp.ClientSession() as http,
    ):
        body = json.dumps([{"id": 1, "x": 1}, {"id": 2, "x": "a"}])
        async with http.post(f"{url}/v1/tables/{TABLE}/records", data=body, headers=JSON) as r:
            assert (r.status, await r.json()) == (
                400,
                {
                    "error": "column 'x': record at index 1 has a string where record at index "
                    f"0 has a number; {_NO_TYPE}"
                },
            )


async def test_http_body_with_types_one_column_holds_evolves_to_it(
    make_config: MakeConfig, run_daemon: RunDaemon
) -> None:
    records = [
        {"id": 1, "x": 1, "t": "2026-11-21T10:00:00"},
        {"id": 2, "x": 2.5, "t": "soon"},
        {"id": 3, "x": None, "t": None},
    ]
    async with (
        run_daemon(_config(make_config)) as (service, url),
        aiohttp.ClientSession() as http,
    ):
        post = f"{url}/v1/tables/{TABLE}/records"
        async with http.post(post, data=_ndjson(records), headers=NDJSON) as r:
            assert (r.status, await r.json()) == (200, {"accepted": 3})
        await service.flush(TABLE)
        rows, columns = await asyncio.to_thread(_table, service)
    assert columns == ["id:long", "x:double", "t:string"]
    assert rows == [
        {"id": 1, "x": 1.0, "t": "2026-11-21T10:00:00"},
        {"id": 2, "x": 2.5, "t": "soon"},
        {"id": 3, "x": None, "t": None},
    ]


async def test_http_inferred_table_is_not_created_from_a_mixed_body(
    make_config: MakeConfig, run_daemon: RunDaemon
) -> None:
    name = "demo.inferred"
    config = make_config(tables=[{"name": name, "create": True, "infer": True}])
    async with (
        run_daemon(config) as (service, url),
        aiohttp.ClientSession() as http,
    ):
        post = f"{url}/v1/tables/{name}/records"
        body = _ndjson([{"id": 1, "x": "a"}, {"id": 2, "x": 1}])
        async with http.post(post, data=body, headers=NDJSON) as r:
            assert (r.status, await r.json()) == (
                400,
                {"error": f"column 'x': line 2 has a number where line 1 has a string; {_NO_TYPE}"},
            )
        assert service.awaiting_schema(name)
        async with http.post(post, data=_ndjson([{"id": 1, "x": "a"}]), headers=NDJSON) as r:
            assert r.status == 200, await r.text()
        await service.flush(name)
        rows, columns = await asyncio.to_thread(_table, service, name)
    assert (rows, columns) == ([{"id": 1, "x": "a"}], ["id:long", "x:string"])


async def test_kafka_fetch_mixing_types_evolves_and_dead_letters_only_the_misfits(
    make_config: MakeConfig, broker: Broker
) -> None:
    topic = unique_name("mixed-types")
    await create_topic(broker.bootstrap, topic, 1)
    values = [
        {"id": 1, "x": 1, "y": {"a": 1}},
        {"id": 2, "x": "a"},
        {"id": 3, "x": 2.5, "y": {"a": "b"}},
        {"id": 4, "x": 3, "y": {"a": 2, "c": True}},
        {"id": 5, "z": True},
        {"id": 6, "z": 7},
    ]
    await produce_values(broker.bootstrap, topic, [json.dumps(v).encode() for v in values])
    config = _config(
        make_config,
        defaults={"batch_timeout": "1s"},
        kafka=[
            {
                "bootstrap_servers": broker.bootstrap,
                "topics": [topic],
                "group_id": f"g-{topic}",
                "session_timeout": SESSION_TIMEOUT,
                "table": TABLE,
            }
        ],
    )
    async with Icespool(config) as service:
        dead = await wait_rows(service, f"{TABLE}_dead_letter", 3)
        await wait_rows(service, TABLE, 3)
        rows, columns = await asyncio.to_thread(_table, service)
    # y comes last: the first round evolves the columns the decode named first (x, z).
    assert columns == [
        "id:long",
        "x:double",
        "z:boolean",
        "y:struct<5: a: optional long, 6: c: optional boolean>",
    ]
    assert rows == [
        {"id": 1, "x": 1.0, "z": None, "y": {"a": 1, "c": None}},
        {"id": 4, "x": 3.0, "z": None, "y": {"a": 2, "c": True}},
        {"id": 5, "x": None, "z": True, "y": None},
    ]
    promotion = "which is not a legal Iceberg promotion"
    assert [(d["offset"], d["reason"], d["error"]) for d in sorted(dead, key=_offset)] == [
        (
            1,
            "schema_change",
            f"column 'x': values are string but the column is double, {promotion}",
        ),
        (
            2,
            "schema_change",
            f"column 'y.a': values are string but the column is long, {promotion}",
        ),
        (5, "schema_change", f"column 'z': values are long but the column is boolean, {promotion}"),
    ]


def _offset(row: dict[str, Any]) -> int:
    return int(row["offset"])
