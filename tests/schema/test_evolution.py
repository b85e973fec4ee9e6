"""Schema evolution: planning, HTTP and Arrow input, racing replicas, columns renamed
or dropped by another writer, and Kafka streams that grow fields."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pyarrow as pa
import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import IntegerType, LongType, NestedField, StringType, StructType
from support.fixture_types import MakeConfig, RunDaemon
from support.kafka_harness import (
    SESSION_TIMEOUT,
    Broker,
    create_topic,
    produce_values,
    unique_name,
)
from support.service_helpers import table_rows, wait_rows

from icespool.lifecycle.service import Icespool
from icespool.schema._evolution import SchemaChangeError, plan_evolution

TABLE = "demo.evolving"
NDJSON = {"Content-Type": "application/x-ndjson"}


def _existing() -> Schema:
    return Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "n", IntegerType()),
        NestedField(3, "st", StructType(NestedField(4, "a", StringType())), required=False),
    )


def test_plan_adds_new_fields_including_nested_ones() -> None:
    incoming = pa.schema(
        [
            ("id", pa.int64()),
            ("country", pa.string()),
            ("st", pa.struct([("a", pa.string()), ("b", pa.int64())])),
        ]
    )
    plan = plan_evolution(_existing(), incoming, "add-columns")
    assert [(p, str(t)) for p, t in plan.adds] == [(("country",), "string"), (("st", "b"), "long")]
    assert plan.widens == ()


def test_plan_widens_only_when_the_policy_allows() -> None:
    incoming = pa.schema([("n", pa.int64())])
    with pytest.raises(SchemaChangeError, match=r"'n'.*add-and-widen"):
        plan_evolution(_existing(), incoming, "add-columns")
    plan = plan_evolution(_existing(), incoming, "add-and-widen")
    assert [(p, str(t)) for p, t in plan.widens] == [(("n",), "long")]


@pytest.mark.parametrize(
    ("incoming", "column", "fragment"),
    [
        (pa.schema([("n", pa.string())]), "n", "not a legal Iceberg promotion"),
        (pa.schema([("id", pa.int32())]), None, None),  # narrower input fits: no change
        (pa.schema([("st", pa.string())]), "st", "not a legal Iceberg promotion"),
    ],
)
def test_plan_refuses_illegal_changes_naming_the_column(
    incoming: pa.Schema, column: str | None, fragment: str | None
) -> None:
    if column is None:
        assert not plan_evolution(_existing(), incoming, "add-and-widen")
        return
    with pytest.raises(SchemaChangeError) as caught:
        plan_evolution(_existing(), incoming, "add-and-widen")
    assert caught.value.column == column
    assert fragment is not None and fragment in str(caught.value)


def test_policy_none_names_the_setting() -> None:
    with pytest.raises(SchemaChangeError, match='evolve = "none"'):
        plan_evolution(_existing(), pa.schema([("new", pa.string())]), "none")


def _config(make_config: MakeConfig, evolve: str, **extra: Any) -> Any:
    return make_config(
        tables=[
            {
                "name": TABLE,
                "create": True,
                "evolve": evolve,
                "schema": [
                    {"name": "id", "type": "long", "required": True},
                    {"name": "n", "type": "int"},
                ],
            }
        ],
        **extra,
    )


def _rows(service: Icespool, table: str = TABLE) -> tuple[list[dict[str, Any]], list[str]]:
    assert service._catalog is not None
    loaded = service._catalog.load_table(table)
    arrow = loaded.scan().to_arrow()
    return sorted(arrow.to_pylist(), key=lambda r: r["id"]), [
        f"{f.name}:{f.field_type}" for f in loaded.schema().fields
    ]


def _ndjson(records: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


async def test_http_records_add_columns_and_widen_per_policy(
    make_config: MakeConfig, run_daemon: RunDaemon
) -> None:
    async with (
        run_daemon(_config(make_config, "add-and-widen")) as (service, url),
        aiohttp.ClientSession() as http,
    ):
        post = f"{url}/v1/tables/{TABLE}/records"
        async with http.post(post, data=_ndjson([{"id": 1, "n": 1}]), headers=NDJSON) as r:
            assert r.status == 200
        body = _ndjson(
            [
                {"id": 2, "n": 5_000_000_000, "country": "NO", "tags": {"x": 1}},
                {"id": 3, "country": "SE"},
            ]
        )
        async with http.post(post, data=body, headers=NDJSON) as r:
            assert r.status == 200, await r.text()
        # Illegal: text into the (now long) numeric column.
        async with http.post(post, data=_ndjson([{"id": 4, "n": "many"}]), headers=NDJSON) as r:
            assert r.status == 400
            assert "'n'" in (await r.json())["error"]
        await service.flush(TABLE)
        rows, columns = await asyncio.to_thread(_rows, service)
    assert columns == ["id:long", "n:long", "country:string", "tags:struct<5: x: optional long>"]
    assert rows == [
        {"id": 1, "n": 1, "country": None, "tags": None},
        {"id": 2, "n": 5_000_000_000, "country": "NO", "tags": {"x": 1}},
        {"id": 3, "n": None, "country": "SE", "tags": None},
    ]


async def test_add_columns_policy_refuses_widening_and_none_refuses_everything(
    make_config: MakeConfig, run_daemon: RunDaemon
) -> None:
    for evolve, body, fragment in [
        ("add-columns", [{"id": 1, "n": 5_000_000_000}], "add-and-widen"),
        ("none", [{"id": 1, "extra": True}], "not in the table schema"),
    ]:
        async with (
            run_daemon(_config(make_config, evolve)) as (service, url),
            aiohttp.ClientSession() as http,
        ):
            post = f"{url}/v1/tables/{TABLE}/records"
            async with http.post(post, data=_ndjson(body), headers=NDJSON) as r:
                assert r.status == 400
                assert fragment in (await r.json())["error"], evolve
            _, columns = await asyncio.to_thread(_rows, service)
            assert columns == ["id:long", "n:int"]


async def test_arrow_input_evolves_and_two_replicas_adding_one_column_converge(
    make_config: MakeConfig, tmp_path: Any
) -> None:
    config = _config(make_config, "add-and-widen")
    other = config.model_copy(
        update={"spool": config.spool.model_copy(update={"dir": tmp_path / "spool-b"})}
    )

    def batch(ids: range) -> pa.RecordBatch:
        return pa.RecordBatch.from_pydict(
            {
                "id": pa.array(list(ids), pa.int64()),
                "n": pa.array([i * 10**10 for i in ids], pa.int64()),
                "label": pa.array([f"l{i}" for i in ids]),
            }
        )

    async with Icespool(config) as a, Icespool(other) as b:
        await asyncio.gather(
            a.writer(TABLE).append(batch(range(50))),
            b.writer(TABLE).append(batch(range(50, 100))),
        )
        await a.flush(TABLE)
        await b.flush(TABLE)
        rows, columns = await asyncio.to_thread(_rows, a)
    assert columns == ["id:long", "n:long", "label:string"]
    assert [r["id"] for r in rows] == list(range(100))
    assert all(r["n"] == r["id"] * 10**10 and r["label"] == f"l{r['id']}" for r in rows)


async def test_columns_renamed_or_dropped_elsewhere_apply_without_a_restart(
    make_config: MakeConfig,
) -> None:
    config = make_config(
        tables=[
            {
                "name": TABLE,
                "create": True,
                "schema": [
                    {"name": "id", "type": "long", "required": True},
                    {"name": "old_name", "type": "string"},
                    {"name": "gone", "type": "string"},
                ],
            }
        ]
    )
    async with Icespool(config) as service:
        writer = service.writer(TABLE)
        await writer.queue_all([{"id": 1, "old_name": "a", "gone": "x"}])
        # Someone else (Spark ALTER TABLE, here pyiceberg) renames and drops columns
        # while a record spooled under the old schema waits for its commit.
        assert service._catalog is not None
        table = service._catalog.load_table(TABLE)
        with table.update_schema() as update:
            update.rename_column("old_name", "new_name")
            update.delete_column("gone")
        await service.flush(TABLE)
        assert writer.arrow_schema.names == ["id", "new_name"]
        await writer.queue_all([{"id": 2, "new_name": "b"}])
        await service.flush(TABLE)
        rows, columns = await asyncio.to_thread(_rows, service)
    assert columns == ["id:long", "new_name:string"]
    assert rows == [{"id": 1, "new_name": "a"}, {"id": 2, "new_name": "b"}]


async def test_kafka_stream_that_grows_fields_ends_with_every_column_and_value(
    make_config: MakeConfig, broker: Broker
) -> None:
    topic = unique_name("growing")
    await create_topic(broker.bootstrap, topic, 1)
    records: list[dict[str, Any]] = []
    for i in range(600):
        record: dict[str, Any] = {"id": i, "n": i}
        if i >= 200:
            record["country"] = f"c{i % 7}"
        if i >= 400:
            record["score"] = i / 2
        records.append(record)
    records[450]["n"] = "not a number"  # illegal: text into an int column
    await produce_values(broker.bootstrap, topic, [json.dumps(r).encode() for r in records])
    config = _config(
        make_config,
        "add-columns",
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
        for _ in range(120):
            await asyncio.sleep(0.5)
            rows, columns = await asyncio.to_thread(_rows, service)
            if len(rows) >= 599:
                break
        dead = sorted(
            await wait_rows(service, f"{TABLE}_dead_letter", 1), key=lambda r: r["offset"]
        )
    assert columns == ["id:long", "n:int", "country:string", "score:double"]
    expected = [
        {"id": r["id"], "n": r["n"], "country": r.get("country"), "score": r.get("score")}
        for r in records
        if r["id"] != 450
    ]
    assert rows == expected
    assert [(d["offset"], d["reason"]) for d in dead] == [(450, "schema_change")]
    assert "'n'" in dead[0]["error"] and "not a legal" in dead[0]["error"]


async def test_infer_creates_the_table_from_its_first_body_and_reuses_it_later(
    make_config: MakeConfig, run_daemon: RunDaemon
) -> None:
    config = make_config(
        tables=[{"name": "demo.inferred", "create": True, "infer": True, "evolve": "add-columns"}]
    )
    records = [{"id": 1, "name": "a", "score": 1.5, "tags": ["x"]}, {"id": 2, "name": "b"}]
    async with run_daemon(config) as (service, url), aiohttp.ClientSession() as http:
        flush = f"{url}/v1/tables/demo.inferred/flush"
        async with http.post(flush) as r:
            assert r.status == 404 and "infer = true" in (await r.json())["error"]
        post = f"{url}/v1/tables/demo.inferred/records"
        async with http.post(post, data=_ndjson(records), headers=NDJSON) as r:
            assert r.status == 200, await r.text()
        await service.flush("demo.inferred")
        rows, columns = await asyncio.to_thread(_rows, service, "demo.inferred")
    assert columns[:3] == ["id:long", "name:string", "score:double"]
    assert columns[3].startswith("tags:list<") and columns[3].endswith("string>")
    assert [(r["id"], r["name"], r["score"], r["tags"]) for r in rows] == [
        (1, "a", 1.5, ["x"]),
        (2, "b", None, None),
    ]
    # A restart finds the table in the catalog: no second creation, rows append.
    async with run_daemon(config) as (service, url), aiohttp.ClientSession() as http:
        assert not service.awaiting_schema("demo.inferred")
        post = f"{url}/v1/tables/demo.inferred/records"
        async with http.post(post, data=_ndjson([{"id": 3, "extra": True}]), headers=NDJSON) as r:
            assert r.status == 200, await r.text()
        await service.flush("demo.inferred")
        rows, columns = await asyncio.to_thread(_rows, service, "demo.inferred")
    assert [r["id"] for r in rows] == [1, 2, 3]
    assert columns[-1] == "extra:boolean"


async def test_kafka_auto_create_makes_a_table_per_new_route_exactly_once(
    make_config: MakeConfig, broker: Broker
) -> None:
    topic = unique_name("autoroutes")
    await create_topic(broker.bootstrap, topic, 2)
    kinds = ["red", "green", "blue"]

    def values(start: int, stop: int) -> list[bytes]:
        out = []
        for i in range(start, stop):
            kind = kinds[i % 3] if i % 50 else "../etc"  # not a name part: dead letter
            out.append(json.dumps({"id": i, "kind": kind, "v": i * 2}).encode())
        return out

    config = make_config(
        defaults={"batch_timeout": "1s"},
        tables=[],
        kafka=[
            {
                "bootstrap_servers": broker.bootstrap,
                "topics": [topic],
                "group_id": f"g-{topic}",
                "session_timeout": SESSION_TIMEOUT,
                "route_field": "kind",
                "table_template": "auto.{value}",
                "auto_create": True,
                "offset_commit_interval": "1s",
            }
        ],
    )
    await produce_values(broker.bootstrap, topic, values(0, 900), partition_of=lambda i: i % 2)
    async with Icespool(config) as service:
        for kind in kinds:
            await wait_rows(service, f"auto.{kind}", 294)
    await produce_values(broker.bootstrap, topic, values(900, 1200), partition_of=lambda i: i % 2)
    async with Icespool(config) as service:
        assert sorted(service.table_names) == [
            "auto.blue",
            "auto.green",
            "auto.kafka_dead_letter",
            "auto.red",
        ]
        expected = {
            kind: [i for i in range(1200) if i % 50 and kinds[i % 3] == kind] for kind in kinds
        }
        for kind in kinds:
            await wait_rows(service, f"auto.{kind}", len(expected[kind]))
        await asyncio.sleep(1.5)  # nothing more arrives
        for kind in kinds:
            rows = await asyncio.to_thread(table_rows, service, f"auto.{kind}")
            assert sorted(r["id"] for r in rows) == expected[kind], kind
            assert all(r["v"] == r["id"] * 2 and r["kind"] == kind for r in rows)
        dead = await wait_rows(service, "auto.kafka_dead_letter", 24)
        assert sorted(json.loads(d["value"])["id"] for d in dead) == list(range(0, 1200, 50))
        assert {d["reason"] for d in dead} == {"invalid"}


# ---------------------------------------------------------------- found by the differential
# test of the refactored way in against the code before it (issue 12)


async def test_one_body_with_many_new_columns_evolves_them_all_at_once(
    make_config: MakeConfig, run_daemon: RunDaemon
) -> None:
    wide = {"id": 1, **{f"c{i}": i for i in range(12)}}
    lines = [{"id": 2 + i, f"m{i}": i} for i in range(12)]  # one new column per line
    async with (
        run_daemon(_config(make_config, "add-columns")) as (service, url),
        aiohttp.ClientSession() as http,
    ):
        post = f"{url}/v1/tables/{TABLE}/records"
        for body in ([wide], lines):
            async with http.post(post, data=_ndjson(body), headers=NDJSON) as r:
                assert r.status == 200, await r.text()
        await service.flush(TABLE)
        rows, columns = await asyncio.to_thread(_rows, service)
    assert columns == [
        "id:long",
        "n:int",
        *(f"c{i}:long" for i in range(12)),
        *(f"m{i}:long" for i in range(12)),
    ]
    assert [r["id"] for r in rows] == list(range(1, 14))
    assert rows[0] | {} == {"id": 1, "n": None} | {f"c{i}": i for i in range(12)} | {
        f"m{i}": None for i in range(12)
    }


@pytest.mark.parametrize(
    ("evolve", "record", "error"),
    [
        # A nested widening the policy refuses names the nested field and the policy.
        (
            "add-columns",
            {"id": 1, "st": {"a": 3_000_000_000}},
            "column 'st.a': values need long but the column is int",
        ),
        # Why a key cannot become a column at all, not "not in the table schema".
        ("add-columns", {"id": 1, "": 1}, "a field name must not be empty"),
        ("add-columns", {"id": 1, "e": []}, "cannot infer an Iceberg type"),
        # The real problem of a body that also adds columns.
        (
            "add-and-widen",
            {"id": 1, "p1": 1, "p2": 2, "p3": 3, "p4": 4, "p5": 5, "n": "bad"},
            "column 'n': values are string but the column is int",
        ),
    ],
)
async def test_a_refused_change_says_why(
    make_config: MakeConfig, run_daemon: RunDaemon, evolve: str, record: Any, error: str
) -> None:
    config = make_config(
        tables=[
            {
                "name": TABLE,
                "create": True,
                "evolve": evolve,
                "schema": [
                    {"name": "id", "type": "long", "required": True},
                    {"name": "n", "type": "int"},
                    {"name": "st", "type": "struct<a: int>"},
                ],
            }
        ]
    )
    async with run_daemon(config) as (_, url), aiohttp.ClientSession() as http:
        post = f"{url}/v1/tables/{TABLE}/records"
        async with http.post(post, data=_ndjson([record]), headers=NDJSON) as r:
            assert r.status == 400
            assert error in (await r.json())["error"]


async def test_in_process_writer_keeps_the_table_writers_figures(
    make_config: MakeConfig,
) -> None:
    async with Icespool(_config(make_config, "add-columns")) as service:
        writer = service.writer(TABLE)
        await writer.queue_all([{"id": 1, "extra": "x"}])  # evolves: the way in
        assert writer.pending_records == 1 and writer.pending_bytes > 0
        assert writer.evolve_policy == "add-columns"
        assert writer.settings.max_batch_records == service.config.defaults.max_batch_records
        assert writer.arrow_schema.names == ["id", "n", "extra"]
        assert writer.has_capacity()
        result = await writer.flush()
        assert result.records == 1 and writer.last_commit == result


async def test_kafka_fetch_mixing_a_new_column_and_an_illegal_change_dead_letters_the_change(
    make_config: MakeConfig, broker: Broker
) -> None:
    # One fetch: the new column evolves; the record whose id is text is refused as a
    # schema change (the policy's words), not as an undecodable record.
    topic = unique_name("mixed-change")
    await create_topic(broker.bootstrap, topic, 1)
    values = [{"id": 1, "newc": "x"}, {"id": "x"}, {"id": 3, "newc": "z"}]
    await produce_values(broker.bootstrap, topic, [json.dumps(v).encode() for v in values])
    config = _config(
        make_config,
        "add-and-widen",
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
        dead = await wait_rows(service, f"{TABLE}_dead_letter", 1)
        rows = await wait_rows(service, TABLE, 2)
    assert [(d["offset"], d["reason"]) for d in dead] == [(1, "schema_change")]
    assert "column 'id': values are string but the column is long" in dead[0]["error"]
    assert sorted((r["id"], r["newc"]) for r in rows) == [(1, "x"), (3, "z")]


async def test_auto_created_route_tables_hold_the_sources_metadata_columns(
    make_config: MakeConfig, broker: Broker
) -> None:
    # The table created for a new route must take the metadata columns its rows carry
    # (it used to lack them, and every fetch of the route crashed the consumer loop).
    topic = unique_name("routed-meta")
    await create_topic(broker.bootstrap, topic, 1)
    values = [{"kind": "a" if i % 2 else "b", "id": i} for i in range(20)]
    await produce_values(broker.bootstrap, topic, [json.dumps(v).encode() for v in values])
    config = make_config(
        tables=[],
        defaults={"batch_timeout": "1s"},
        kafka=[
            {
                "bootstrap_servers": broker.bootstrap,
                "topics": [topic],
                "group_id": f"g-{topic}",
                "session_timeout": SESSION_TIMEOUT,
                "route_field": "kind",
                "table_template": "routed.t_{value}",
                "auto_create": True,
                "metadata_columns": ["_kafka_partition", "_kafka_offset"],
            }
        ],
    )
    async with Icespool(config) as service:
        a = await wait_rows(service, "routed.t_a", 10)
        b = await wait_rows(service, "routed.t_b", 10)
    assert sorted((r["id"], r["_kafka_offset"], r["_kafka_partition"]) for r in a + b) == [
        (i, i, 0) for i in range(20)
    ]
