"""Upsert tables attacked as a hostile client and a bad day would, through a real
`icespool run` child (HTTP Arrow change batches, NDJSON, flush): every acked change
is applied exactly once (the merged state equals a reference computed here, key by
key), a bad request is refused alone naming the problem, and the daemon stays up."""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import signal
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from aiokafka import AIOKafkaProducer
from pyiceberg.catalog import load_catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType
from support.daemon_harness import CATALOG_NAME, NDJSON, Daemon, DaemonDir
from support.kafka_harness import SESSION_TIMEOUT, Broker, create_topic, unique_name
from support.service_helpers import table_rows

from icespool.cdc import DELETE, OP_COLUMN, UPSERT, read_merged
from icespool.config import validate_config
from icespool.errors import ConfigError
from icespool.iceberg import SEGMENTS_SUMMARY_KEY, commit_files, encode_equality_deletes
from icespool.lifecycle.service import Icespool

_ARROW = {"Content-Type": "application/vnd.apache.arrow.stream"}
_TIMEOUT = aiohttp.ClientTimeout(total=60)

# t.events (the harness's table: id long required, v string) is the upsert table;
# h.plain an append table and h.keyed an upsert table, both evolving for new columns.
_EXTRA = """\
key = ["id"]

[[tables]]
name = "h.plain"
create = true
evolve = "add-columns"
schema = [
  { name = "id", type = "long", required = true },
  { name = "v", type = "string" },
]

[[tables]]
name = "h.keyed"
create = true
evolve = "add-columns"
key = ["id"]
schema = [
  { name = "id", type = "long", required = true },
  { name = "v", type = "string" },
]

[[tables]]
name = "h.renamed"
create = true
key = ["id"]
schema = [
  { name = "id", type = "long", required = true },
  { name = "v", type = "string" },
]
"""


def _arrow(columns: dict[str, pa.Array]) -> bytes:
    batch = pa.RecordBatch.from_pydict(columns)
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _changes(ids: Any, values: list[str | None], ops: Any) -> bytes:
    return _arrow(
        {
            "id": pa.array(ids, pa.int64()),
            "v": pa.array(values, pa.string()),
            OP_COLUMN: pa.array(ops, pa.int8()),
        }
    )


async def _post(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str]
) -> tuple[int, str]:
    # A stream, not bytes: aiohttp warns (an error here) about large byte bodies.
    async with session.post(url, data=io.BytesIO(body), headers=headers) as resp:
        return resp.status, await resp.text()


async def _flush(session: aiohttp.ClientSession, daemon: Daemon, name: str, status: int) -> str:
    async with session.post(daemon.flush_url(name)) as resp:
        text = await resp.text()
        assert resp.status == status, text
        return text


def _rename(home: DaemonDir, name: str, old: str, new: str) -> None:
    catalog = load_catalog(CATALOG_NAME, **home.catalog_properties)
    try:
        with catalog.load_table(name).update_schema() as update:
            update.rename_column(old, new)
    finally:
        catalog.engine.dispose()


def _table(home: DaemonDir, name: str) -> Any:
    catalog = load_catalog(CATALOG_NAME, **home.catalog_properties)
    try:
        return catalog.load_table(name)
    finally:
        catalog.engine.dispose()


async def test_hostile_changes_through_a_real_daemon(tmp_path: Path) -> None:
    home = DaemonDir(tmp_path / "d")
    home.write_config(extra=_EXTRA)
    daemon = Daemon(home)
    expected: dict[int, str] = {}
    try:
        daemon.start()
        await daemon.wait_ready()
        async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
            # 1. The op column is a change batch's, never a table column: an append table
            # that evolves for new columns refuses it (it would keep deletes as rows),
            # naming the problem, and its schema stays as it was.
            body = _changes([1, 2], ["a", None], [UPSERT, DELETE])
            status, text = await _post(session, daemon.records_url("h.plain"), body, _ARROW)
            assert status == 400, text
            assert OP_COLUMN in text and "no key" in text, text
            # An upsert table that evolves for new columns does not take it as a column
            # from NDJSON either (a column named like the op would shadow every op).
            ndjson = b'{"id": 5, "v": "x"}\n{"id": 5, "_icespool_op": 1}\n'
            status, text = await _post(
                session, daemon.records_url("h.keyed"), ndjson, {"Content-Type": NDJSON}
            )
            assert status == 400 and OP_COLUMN in text, text
            for name in ("h.plain", "h.keyed"):
                assert _table(home, name).schema().column_names == ["id", "v"], name

            # 2. Bad change batches are refused whole (400 naming the column), nothing
            # of them is applied.
            url = daemon.records_url()
            bad = {
                "op 2": _changes([1, 2], ["a", "b"], [UPSERT, 2]),
                "op -1": _changes([1], ["a"], [-1]),
                "null op": _arrow(
                    {
                        "id": pa.array([1, 2], pa.int64()),
                        "v": pa.array(["a", "b"]),
                        OP_COLUMN: pa.array([0, None], pa.int8()),
                    }
                ),
                "string op": _arrow(
                    {"id": pa.array([1], pa.int64()), OP_COLUMN: pa.array(["delete"])}
                ),
                "no key": _arrow({"v": pa.array(["a"]), OP_COLUMN: pa.array([1], pa.int8())}),
                "null key": _changes([1, None], ["a", None], [UPSERT, DELETE]),
            }
            for what, body in bad.items():
                status, text = await _post(session, url, body, _ARROW)
                assert status == 400, (what, text)
                column = "'id'" if "key" in what else OP_COLUMN
                assert column in text, (what, text)

            # 3. Deletes of keys never inserted, a delete-only request, an upsert table
            # fed deletes before anything else: nothing to delete, nothing appears.
            never = list(range(-50, 0))
            status, text = await _post(
                session, url, _changes(never, [None] * 50, [DELETE] * 50), _ARROW
            )
            assert status == 200, text
            assert (await daemon.flush(session))["records"] == 50

            # 4. 100,000 distinct keys in one body, then one key updated 100,000 times
            # with deletes between (the last change is an upsert), in one flush.
            count = 100_000
            ids = np.arange(count, dtype=np.int64)
            values = [f"v{i}" for i in range(count)]
            status, text = await _post(
                session, url, _changes(ids, values, [UPSERT] * count), _ARROW
            )
            assert status == 200, text
            expected.update(zip(ids.tolist(), values, strict=True))
            ops = np.where(np.arange(count) % 3 == 1, DELETE, UPSERT).astype(np.int8)
            ops[-1] = UPSERT
            same = [None if op == DELETE else f"same{i}" for i, op in enumerate(ops)]
            body = _changes(np.full(count, 7, np.int64), same, ops)
            status, text = await _post(session, url, body, _ARROW)
            assert status == 200, text
            expected[7] = f"same{count - 1}"
            # and deletes of every tenth key, some of them twice, one never inserted
            dead = np.concatenate([ids[::10], ids[::20], [count + 5]])
            status, text = await _post(
                session, url, _changes(dead, [None] * len(dead), [DELETE] * len(dead)), _ARROW
            )
            assert status == 200, text
            for key in dead.tolist():
                expected.pop(key, None)
            result = await daemon.flush(session)
            assert result["records"] == 2 * count + len(dead), result
            assert daemon.running
    finally:
        daemon.cleanup()
    rows = read_merged(_table(home, "t.events")).to_pylist()
    got = {r["id"]: r["v"] for r in rows}
    assert len(rows) == len(got), "a key appears twice in the merged state"
    assert got == expected


async def _key_indexes_ready(session: aiohttp.ClientSession, daemon: Daemon, *names: str) -> None:
    for _ in range(600):
        async with session.get(f"{daemon.url}/v1/status") as resp:
            tables = (await resp.json())["tables"]
        if all((tables[n]["key_index"] or {}).get("ready") for n in names):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"key indexes not ready: {[tables[n]['key_index'] for n in names]}")


def _repartition(home: DaemonDir) -> None:
    """Another writer's new partitioning: the key (identity) for t.events, a non-key
    column for h.keyed."""
    catalog = load_catalog(CATALOG_NAME, **home.catalog_properties)
    try:
        with catalog.load_table("t.events").update_spec() as spec:
            spec.add_field("id", IdentityTransform(), "id_p")
        with catalog.load_table("h.keyed").update_spec() as spec:
            spec.add_field("v", IdentityTransform(), "v")
    finally:
        catalog.engine.dispose()


async def test_another_writer_repartitioning_an_upsert_table_changes_nothing_by_position(
    tmp_path: Path,
) -> None:
    """Position deletes name their data files, in those files' own partition spec: after
    another writer repartitions an upsert table (by the key, or by a non-key column),
    upserts still delete exactly the older rows of their keys, whatever spec those rows
    were written in."""
    home = DaemonDir(tmp_path / "d")
    home.write_config(extra=_EXTRA)
    daemon = Daemon(home)
    keys = np.arange(30, dtype=np.int64)
    try:
        daemon.start()
        await daemon.wait_ready()
        async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
            await _key_indexes_ready(session, daemon, "t.events", "h.keyed")
            for name in ("t.events", "h.keyed"):
                body = _changes(keys, [f"a{i}" for i in keys], [UPSERT] * len(keys))
                status, text = await _post(session, daemon.records_url(name), body, _ARROW)
                assert status == 200, text
                await _flush(session, daemon, name, 200)
            _repartition(home)
            for round_ in ("b", "c"):
                for name in ("t.events", "h.keyed"):
                    values = [f"{round_}{i}" for i in keys]
                    body = _changes(keys, values, [UPSERT] * len(keys))
                    status, text = await _post(session, daemon.records_url(name), body, _ARROW)
                    assert status == 200, text
                    await _flush(session, daemon, name, 200)
            assert daemon.running and not home.quarantined()
    finally:
        daemon.cleanup()
    for name in ("t.events", "h.keyed"):
        merged = read_merged(_table(home, name)).sort_by("id")
        assert merged.column("id").to_pylist() == keys.tolist()  # each key once
        assert merged.column("v").to_pylist() == [f"c{i}" for i in keys]


async def test_deleting_by_key_a_repartitioned_upsert_table_is_held_back_naming_why(
    tmp_path: Path,
) -> None:
    """Without its key index (here its directory cannot be made), an upsert table's
    commits delete by key. Iceberg applies an equality delete only to data files of its
    own partition spec and partition (or everywhere from an unpartitioned spec): after
    another writer changes an upsert table's partitioning, such deletes (current spec)
    no longer reach the rows of the old spec, and Spark would show a key twice. The
    table is held back (flush 503 naming the fix, nothing quarantined) until those rows
    are rewritten into the current spec; a partition on a non-key column likewise."""
    home = DaemonDir(tmp_path / "d")
    home.write_config(extra=_EXTRA)
    home.spool_dir.mkdir(parents=True, exist_ok=True)
    (home.spool_dir / "key-index").write_text("not a directory")
    daemon = Daemon(home)
    keys = np.arange(30, dtype=np.int64)
    try:
        daemon.start()
        await daemon.wait_ready()
        async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
            for name in ("t.events", "h.keyed"):
                body = _changes(keys, [f"a{i}" for i in keys], [UPSERT] * len(keys))
                status, text = await _post(session, daemon.records_url(name), body, _ARROW)
                assert status == 200, text
                async with session.post(daemon.flush_url(name)) as resp:
                    assert resp.status == 200, await resp.text()
            _repartition(home)
            for name, needle in (("t.events", "rewrite_data_files"), ("h.keyed", "'v'")):
                body = _changes(keys, [f"b{i}" for i in keys], [UPSERT] * len(keys))
                status, text = await _post(session, daemon.records_url(name), body, _ARROW)
                assert status == 200, text
                async with session.post(daemon.flush_url(name)) as resp:
                    text = await resp.text()
                    assert resp.status == 503, text
                    assert needle in text and "partition" in text, text
                # Nothing of it committed: every key once, with its first value.
                table = _table(home, name)
                assert read_merged(table).sort_by("id").column("v").to_pylist() == [
                    f"a{i}" for i in keys
                ]
            # Another writer renames the key column while a change is spooled: the
            # table is held back naming the key column, its segments are not quarantined
            # (3 attempts and more), and renaming it back lets the change through.
            url = daemon.records_url("h.renamed")
            for ids, tag in ((keys, "a"), (np.array([100]), "spooled")):
                body = _changes(ids, [f"{tag}{i}" for i in ids], [UPSERT] * len(ids))
                status, text = await _post(session, url, body, _ARROW)
                assert status == 200, text
                if tag == "a":
                    await _flush(session, daemon, "h.renamed", 200)
            _rename(home, "h.renamed", "id", "user_id")
            for _ in range(4):
                text = await _flush(session, daemon, "h.renamed", 503)
                assert "no column 'id' of its key" in text, text
            # Changes sent meanwhile: 503 naming the key column (was a 500).
            body = _changes([1], [None], [DELETE])
            status, text = await _post(session, url, body, _ARROW)
            assert status == 503 and "no column 'id' of its key" in text, text
            _rename(home, "h.renamed", "user_id", "id")
            await _flush(session, daemon, "h.renamed", 200)
            renamed = read_merged(_table(home, "h.renamed")).to_pylist()
            assert {r["id"]: r["v"] for r in renamed} == {
                **{i: f"a{i}" for i in keys},
                100: "spooled100",
            }

            # The fix for the first: the rows rewritten into the current spec (what
            # Spark's rewrite_data_files does; pyiceberg here). Then the held-back
            # changes commit, once.
            catalog = load_catalog(CATALOG_NAME, **home.catalog_properties)
            try:
                table = catalog.load_table("t.events")
                table.overwrite(read_merged(table))
            finally:
                catalog.engine.dispose()
            flushed = await daemon.flush(session)
            assert flushed["records"] == len(keys) and not flushed["quarantined"], flushed
            assert not home.quarantined()
            assert daemon.running
    finally:
        daemon.cleanup()
    merged = read_merged(_table(home, "t.events")).sort_by("id")
    assert merged.column("v").to_pylist() == [f"b{i}" for i in keys]


def test_read_merged_applies_equality_deletes_within_their_spec_and_partition(
    tmp_path: Path,
) -> None:
    """The checks above lean on `read_merged`: it must see what Spark sees. An equality
    delete of a partitioned spec misses data files of another spec or partition (the
    rows Spark keeps); one of an unpartitioned spec reaches every data file."""
    catalog = load_catalog(
        "probe", type="sql", uri=f"sqlite:///{tmp_path}/c.db", warehouse=tmp_path.as_uri()
    )
    try:
        catalog.create_namespace("p")
        schema = Schema(
            NestedField(1, "id", LongType(), required=True),
            NestedField(2, "v", StringType(), required=False),
            identifier_field_ids=[1],
        )
        table = catalog.create_table("p.t", schema, properties={"format-version": "2"})
        rows = pa.table(
            {"id": pa.array([1, 2, 3], pa.int64()), "v": ["a", "b", "c"]},
            schema=pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.string())]),
        )
        table.append(rows)  # spec 0, unpartitioned

        def delete(ids: list[int], prefix: str) -> None:
            keys = pa.RecordBatch.from_arrays([pa.array(ids, pa.int64())], ["id"])
            files = encode_equality_deletes(
                table,
                [keys],
                ["id"],
                target_file_size=1 << 20,
                row_group_records=1000,
                compression="zstd",
                file_prefix=prefix,
            )
            commit_files(table, files, segment_ids=[prefix], summary={})

        delete([1], "s0")  # spec 0 is unpartitioned: global, reaches id 1
        assert read_merged(table).column("id").to_pylist() == [2, 3]
        with table.update_spec() as spec:
            spec.add_field("id", IdentityTransform(), "id_p")
        table.append(rows.slice(2))  # id 3 again, in spec 1, partition id=3
        delete([2, 3], "s1")  # spec 1: reaches only spec 1's partition id=3
        got = read_merged(table).sort_by("id").to_pylist()
        assert got == [{"id": 2, "v": "b"}, {"id": 3, "v": "c"}]
    finally:
        catalog.engine.dispose()


async def test_kill_9_between_commit_and_spool_delete_twice_commits_each_change_once(
    tmp_path: Path,
) -> None:
    """SIGKILL right after the commit of spooled changes (before their spool
    files go), then again right after recovery found them committed: neither is
    committed again, and changes acked afterwards apply after them."""
    home = DaemonDir(tmp_path / "d")
    home.write_config(batch_timeout="3600s", extra='key = ["id"]\n')
    daemon = Daemon(home)
    expected: dict[int, str] = {}

    async def send(session: aiohttp.ClientSession, ids: Any, ops: Any, tag: str) -> None:
        values = [None if op == DELETE else f"{tag}{i}" for i, op in zip(ids, ops, strict=True)]
        status, text = await _post(
            session, daemon.records_url(), _changes(ids, values, ops), _ARROW
        )
        assert status == 200, text
        for key, op, value in zip(ids, ops, values, strict=True):
            if op == DELETE:
                expected.pop(key, None)
            else:
                expected[key] = value

    try:
        daemon.start(crash=["unlink:*.arrow:1"])
        await daemon.wait_ready()
        async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
            await send(session, list(range(200)), [UPSERT] * 200, "a")
            await send(session, list(range(100)), [DELETE] * 50 + [UPSERT] * 50, "b")
            with pytest.raises(aiohttp.ClientError):
                await daemon.flush(session)  # the daemon dies inside it
        assert await daemon.wait_exit(30) == -signal.SIGKILL, daemon.tail()
        assert home.spool_files(), "the kill came before the commit"
        # Recovery finds both committed and dies deleting the first spool file.
        daemon.start(crash=["unlink:*.arrow:1"])
        assert await daemon.wait_exit(60) == -signal.SIGKILL, daemon.tail()
        daemon.start()
        await daemon.wait_ready()
        async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
            await send(session, list(range(20)), [UPSERT] * 10 + [DELETE] * 10, "c")
            await send(session, list(range(150, 160)), [DELETE] * 10, "d")
            result = await daemon.flush(session)
            assert result["records"] == 30, result
        assert home.spool_files() == []
    finally:
        daemon.cleanup()
    table = _table(home, "t.events")
    segments = [
        s.summary[SEGMENTS_SUMMARY_KEY].split(",")
        for s in table.metadata.snapshots
        if s.summary is not None and SEGMENTS_SUMMARY_KEY in s.summary
    ]
    flat = [segment for ids in segments for segment in ids]
    assert len(flat) == len(set(flat)) and len(segments) == 2, segments
    rows = read_merged(table).to_pylist()
    assert len(rows) == len({r["id"] for r in rows})
    assert {r["id"]: r["v"] for r in rows} == expected


@pytest.mark.parametrize("key", [[], ["id"]])
def test_a_declared_column_named_like_the_op_column_is_a_config_error(key: list[str]) -> None:
    """Spooled rows holding the op column are taken for keyed changes: a table column
    of that name (on any table) would be read as ops, so check-config refuses it."""
    schema = [
        {"name": "id", "type": "long", "required": True},
        {"name": OP_COLUMN.upper(), "type": "int"},
    ]
    raw = {"tables": [{"name": "h.t", "create": True, "schema": schema, "key": key}]}
    with pytest.raises(ConfigError) as caught:
        validate_config(raw)
    assert caught.value.key == "tables[0].schema[1].name"
    assert "reserved for the op column" in caught.value.problem


async def test_a_kafka_value_holding_the_op_column_is_a_dead_letter_not_a_column(
    make_config: Any, broker: Broker
) -> None:
    """Keyed Kafka records evolve an upsert table for new fields (`evolve`): a value
    holding ``_icespool_op`` made it a table column and the fetch's changes vanished.
    The record is a dead letter naming the column; its neighbours apply; key values
    of the wrong type (1.5, "1", true, 2^63) are `bad_key` and delete nothing."""
    topic = unique_name("hostile-keyed")
    await create_topic(broker.bootstrap, topic, 1)
    records = [
        (b'{"id": 1}', b'{"id": 1, "v": "a"}', None),
        (b'{"id": 5}', b'{"id": 5, "v": "x", "_icespool_op": 1}', "invalid"),
        (b'{"id": 1.5}', None, "bad_key"),
        (b'{"id": "1"}', None, "bad_key"),
        (b'{"id": true}', None, "bad_key"),
        (b'{"id": 9223372036854775808}', None, "bad_key"),
        (b"-9223372036854775808", b'{"v": "min"}', None),
        (b'{"id": 2}', b'{"v": "b"}', None),
        (b'{"id": 2}', None, None),
    ]
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
    await producer.start()
    try:
        for key, value, _ in records:
            await (await producer.send(topic, key=key, value=value, partition=0))
    finally:
        await producer.stop()
    schema = [{"name": "id", "type": "long", "required": True}, {"name": "v", "type": "string"}]
    source = {
        "bootstrap_servers": broker.bootstrap,
        "topics": [topic],
        "group_id": f"g-{topic}",
        "session_timeout": SESSION_TIMEOUT,
        "table": "k.t",
        "changes": "keyed",
    }
    config = make_config(
        tables=[
            {
                "name": "k.t",
                "create": True,
                "schema": schema,
                "key": ["id"],
                "evolve": "add-columns",
            }
        ],
        defaults={"batch_timeout": "0.5s"},
        kafka=[source],
    )
    expected_dead = {i: reason for i, (_, _, reason) in enumerate(records) if reason}
    async with Icespool(config) as service:
        deadline = asyncio.get_running_loop().time() + 30
        while True:
            writer = service.writer("k.t")
            await writer.flush()
            assert service._catalog is not None
            try:
                dead = await asyncio.to_thread(table_rows, service, "k.t_dead_letter")
            except NoSuchTableError:
                dead = []
            table = await asyncio.to_thread(service._catalog.load_table, "k.t")
            merged = await asyncio.to_thread(read_merged, table)
            if len(dead) >= len(expected_dead) and merged.num_rows >= 2:
                break
            assert asyncio.get_running_loop().time() < deadline, (dead, merged.to_pylist())
            await asyncio.sleep(0.3)
    assert table.schema().column_names == ["id", "v"]
    assert {d["offset"]: d["reason"] for d in dead} == expected_dead
    assert len(dead) == len(expected_dead)
    assert OP_COLUMN in next(d["error"] for d in dead if d["offset"] == 1)
    got = sorted((r["id"], r["v"]) for r in merged.to_pylist())
    assert got == [(-(2**63), "min"), (1, "a")]


_EDGE_KEYS: dict[str, list[Any]] = {
    "long": [-(2**63), 2**63 - 1, 0],
    "string": ["", "\U0010ffff" * 40, "e\u0301", "\u00e9", "a\x00b"],
    "binary": [b"", b"\xff" * 40, b"\x00"],
    "uuid": [uuid.UUID(int=0), uuid.UUID(int=2**128 - 1), uuid.UUID(int=7)],
    "decimal(38,0)": [Decimal("9" * 38), Decimal("-" + "9" * 38), Decimal(0)],
    "date": [dt.date(1, 1, 1), dt.date(9999, 12, 31), dt.date(1970, 1, 1)],
    "timestamptz": [
        dt.datetime(1, 1, 1, tzinfo=dt.UTC),
        dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC),
        dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC),
    ],
}


async def test_keys_at_their_type_edges_update_and_delete_exactly(
    make_config: Any, run_daemon: Any
) -> None:
    """Keys at the edges of their types (and NFC/NFD spellings, which differ): each
    update and delete hits its key and no other, over three commits."""
    tables = [
        {
            "name": f"edge.t{i}",
            "create": True,
            "key": ["k"],
            "schema": [
                {"name": "k", "type": type_, "required": True},
                {"name": "v", "type": "long"},
            ],
        }
        for i, type_ in enumerate(_EDGE_KEYS)
    ]
    async with run_daemon(make_config(tables=tables)) as (service, _):
        for i, (type_, keys) in enumerate(_EDGE_KEYS.items()):
            table = service.writer(f"edge.t{i}")
            await table.upsert([{"k": k, "v": 1} for k in keys])
            await table.flush()
            await table.upsert([{"k": k, "v": 2} for k in keys[:-1]])
            await table.delete([{"k": keys[-1]}])
            await table.flush()
            await table.upsert([{"k": keys[0], "v": 3}])
            await table.delete([{"k": keys[1]}, {"k": keys[-1]}])
            await table.flush()
            iceberg = service.tables.require_catalog().load_table(f"edge.t{i}")
            rows = read_merged(iceberg).to_pylist()
            got = sorted(((r["k"], r["v"]) for r in rows), key=repr)
            want = sorted([(keys[0], 3), *((k, 2) for k in keys[2:-1])], key=repr)
            assert got == want, type_
