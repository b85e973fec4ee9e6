"""Upsert tables through a real daemon (in-process service, SQLite catalog): each flush
commits ONE snapshot of data files plus the deletes of the older rows of its keys (by
position once the key index is ready, by equality while it cannot answer), and the
merged state equals the state computed here key by key."""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.manifest import DataFileContent
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType
from support.cdc_tables import assert_index_exact, delete_files
from support.service_helpers import key_index_ready, metric

from icespool.cdc import KeyIndex, live_files, read_merged
from icespool.errors import BadInputError, SchemaError
from icespool.iceberg import SEGMENTS_SUMMARY_KEY, load_catalog
from icespool.maintenance import daemon_file_id, is_daemon_file
from icespool.spool import table_file_stem
from icespool.write import KEY_INDEX_DIR

TABLE = "cdc.users"
SCHEMA = [
    {"name": "id", "type": "long", "required": True},
    {"name": "region", "type": "string", "required": True},
    {"name": "name", "type": "string", "required": True},
    {"name": "score", "type": "long"},
]
State = dict[tuple[int, str], tuple[str, int | None]]


def upsert_table(**extra: Any) -> dict[str, Any]:
    return {"name": TABLE, "create": True, "schema": SCHEMA, "key": ["id", "region"], **extra}


def merged(table: Any) -> State:
    return {(r["id"], r["region"]): (r["name"], r["score"]) for r in read_merged(table).to_pylist()}


def iceberg_table(service: Any) -> Any:
    """The table as the service's catalog has it now."""
    return service.tables.require_catalog().load_table(TABLE)


def files_of(table: Any, snapshot_id: int) -> list[Any]:
    snapshot = table.metadata.snapshot_by_id(snapshot_id)
    return [
        entry.data_file
        for manifest in snapshot.manifests(table.io)
        if manifest.added_snapshot_id == snapshot_id
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
        if entry.snapshot_id == snapshot_id
    ]


async def test_several_flushes_leave_the_merged_state_key_by_key(
    make_config: Any, run_daemon: Any
) -> None:
    config = make_config(
        tables=[
            upsert_table(
                partition_by=["bucket(4, id)", "region"],
                # Data manifests merge every commit: merged entries keep their sequence
                # numbers, or older rows would escape (or newer rows fall to) the deletes.
                properties={"commit.manifest.min-count-to-merge": "2"},
            )
        ],
        defaults={"max_batch_records": 10_000_000},
    )
    rng = random.Random(7)
    expected: State = {}
    async with run_daemon(config) as (service, _):
        table = service.writer(TABLE)
        await key_index_ready(service, TABLE)
        created = iceberg_table(service)
        assert created.metadata.format_version == 2
        assert created.schema().identifier_field_names() == {"id", "region"}
        assert table.key == ("id", "region")
        assert table.change_schema.names == ["id", "region", "name", "score", "_icespool_op"]
        for flush_no in range(5):
            for _ in range(4):
                ups, dels = [], []
                for _ in range(150):
                    key = (rng.randrange(200), rng.choice(["eu", "us", "ap"]))
                    if rng.random() < 0.3:
                        dels.append({"id": key[0], "region": key[1]})
                    else:
                        ups.append(
                            {
                                "id": key[0],
                                "region": key[1],
                                "name": f"f{flush_no}-{rng.randrange(10**6)}",
                                "score": rng.choice([None, rng.randrange(1000)]),
                            }
                        )
                await table.upsert(ups)
                for row in ups:
                    expected[(row["id"], row["region"])] = (row["name"], row["score"])
                await table.delete(dels)
                for row in dels:
                    expected.pop((row["id"], row["region"]), None)
            result = await table.flush()
            assert result.records == 600  # every change of the flush, counted once
            iceberg = iceberg_table(service)
            snapshot = iceberg.metadata.snapshot_by_id(result.snapshot_id)
            # Nothing to delete in the first flush (every key new): a plain append.
            assert snapshot.summary.operation.value == ("overwrite" if flush_no else "append")
            assert snapshot.summary[SEGMENTS_SUMMARY_KEY] == ",".join(result.segments)
            added = files_of(iceberg, result.snapshot_id)
            # The orphan sweep knows every file, and each names the flush's first segment.
            assert all(is_daemon_file(f.file_path) for f in added)
            assert {daemon_file_id(f.file_path) for f in added} == {result.segments[0]}
            # Every new row went at the end of the writer's last file of its partition
            # (copied with them), older rows were deleted by position: one small data
            # file per partition, with at most one delete file naming it alone.
            live = live_files(iceberg.io, iceberg.metadata, snapshot)
            per_partition = Counter(d.file.partition for d in live.data.values())
            assert set(per_partition.values()) == {1}
            assert all(not d.is_equality and len(d.paths) == 1 for d in live.deletes)
            per_file = Counter(next(iter(d.paths)) for d in live.deletes)
            assert set(per_file) <= set(live.data) and set(per_file.values()) <= {1}
            assert merged(iceberg) == expected, f"after flush {flush_no}"
            # A tail more than half dead is copied with its live rows only (every flush
            # here changes about as many keys as the table holds).
            assert sum(d.file.record_count for d in live.data.values()) <= 2 * len(expected)
        manifests = iceberg.current_snapshot().manifests(iceberg.io)
        assert len(manifests) < 5, "a manifest more per commit"
    assert len(expected) > 100
    # The daemon's own key index took every commit without reading it back: at the last
    # snapshot, naming exactly the live row of each key.
    iceberg = load_catalog(config.catalog.name, config.catalog.properties()).load_table(TABLE)
    index_file = config.spool.dir / KEY_INDEX_DIR / f"{table_file_stem(TABLE)}.sqlite3"
    index = KeyIndex(index_file, [1, 2], cache_bytes=1 << 20)
    try:
        assert index.snapshot_id == iceberg.metadata.current_snapshot_id
        assert_index_exact(index, iceberg, ("id", "region"))
    finally:
        index.close()


async def test_a_delete_only_chunk_writes_only_delete_files(
    make_config: Any, run_daemon: Any
) -> None:
    config = make_config(tables=[upsert_table()])
    async with run_daemon(config) as (service, _):
        table = service.writer(TABLE)
        await key_index_ready(service, TABLE)
        await table.upsert(
            [{"id": i, "region": "eu", "name": f"n{i}", "score": i} for i in range(10)]
        )
        await table.flush()
        await table.delete([{"id": 3, "region": "eu"}, {"id": 42, "region": "eu"}])
        await table.delete(pa.table({"id": [5], "region": ["eu"], "name": ["ignored"]}))
        result = await table.flush()
        iceberg = iceberg_table(service)
        snapshot = iceberg.metadata.snapshot_by_id(result.snapshot_id)
        assert snapshot.summary.operation.value == "delete"
        added = files_of(iceberg, result.snapshot_id)
        # The two rows that existed, by position; the key never written needs nothing.
        assert [f.content for f in added] == [DataFileContent.POSITION_DELETES]
        assert added[0].record_count == 2
        assert merged(iceberg) == {(i, "eu"): (f"n{i}", i) for i in range(10) if i not in (3, 5)}


async def test_bad_changes_are_refused_whole_and_nothing_is_spooled(
    make_config: Any, run_daemon: Any
) -> None:
    config = make_config(
        tables=[
            upsert_table(),
            {"name": "cdc.plain", "create": True, "schema": SCHEMA[:3]},
        ]
    )
    async with run_daemon(config) as (service, _):
        table = service.writer(TABLE)
        with pytest.raises(BadInputError, match="key column 'region' is null"):
            await table.upsert([{"id": 1, "region": None, "name": "x"}])
        with pytest.raises(BadInputError, match="key column 'id' is null"):
            await table.delete([{"id": None, "region": "eu"}])
        with pytest.raises(BadInputError, match=r"delete needs .* missing \['region'\]"):
            await table.delete([{"id": 1}])
        with pytest.raises(BadInputError, match=r"upsert needs .* missing \['region'\]"):
            await table.upsert([{"id": 1, "name": "x"}])
        with pytest.raises(SchemaError, match="'name'"):
            await table.upsert([{"id": 1, "region": "eu", "name": None, "score": 1}])
        assert table.pending_records == 0
        plain = service.writer("cdc.plain")
        with pytest.raises(BadInputError, match="has no key, so it cannot delete"):
            await plain.delete([{"id": 1, "region": "eu"}])
        # Appends to an upsert table are upserts.
        await table.append(pa.table({"id": [1, 1], "region": ["eu", "eu"], "name": ["a", "b"]}))
        await table.flush()
        assert merged(iceberg_table(service)) == {(1, "eu"): ("b", None)}


async def test_an_existing_table_without_identifier_fields_gets_the_key(
    make_config: Any, run_daemon: Any
) -> None:
    config = make_config(tables=[{"name": TABLE, "create": True, "schema": SCHEMA}])
    async with run_daemon(config) as (service, _):
        plain = service.writer(TABLE)
        await plain.append(
            [{"id": 1, "region": "eu", "name": "a"}]
            and pa.table({"id": [1], "region": ["eu"], "name": ["a"]})
        )
        await plain.flush()
    keyed = make_config(tables=[upsert_table()])
    async with run_daemon(keyed) as (service, _):
        table = service.writer(TABLE)
        assert iceberg_table(service).schema().identifier_field_names() == {"id", "region"}
        await table.upsert([{"id": 1, "region": "eu", "name": "b"}])
        await table.flush()
        assert merged(iceberg_table(service)) == {(1, "eu"): ("b", None)}


async def test_a_table_whose_identifier_fields_differ_or_v1_is_degraded_by_name(
    make_config: Any, run_daemon: Any
) -> None:
    config = make_config(
        tables=[
            {"name": "cdc.other", "schema": SCHEMA, "key": ["id", "region"]},
            {"name": "cdc.old", "schema": SCHEMA, "key": ["id", "region"]},
            upsert_table(),
        ]
    )
    service_catalog = load_catalog(config.catalog.name, config.catalog.properties())
    fields = [
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "region", StringType(), required=True),
        NestedField(3, "name", StringType(), required=True),
        NestedField(4, "score", LongType(), required=False),
    ]
    service_catalog.create_namespace("cdc")
    service_catalog.create_table("cdc.other", Schema(*fields, identifier_field_ids=[1]))
    service_catalog.create_table("cdc.old", Schema(*fields), properties={"format-version": "1"})
    async with run_daemon(config) as (service, _):
        degraded = service.degraded()
        assert "identifier fields ['id']" in degraded["cdc.other"]
        assert "key is ['id', 'region']" in degraded["cdc.other"]
        assert "'cdc.old' is format v1" in degraded["cdc.old"]
        assert TABLE not in degraded  # the others serve
        await service.writer(TABLE).upsert([{"id": 1, "region": "eu", "name": "x"}])


async def test_two_replicas_committing_one_upsert_table_at_once_keep_every_change(
    make_config: Any, run_daemon: Any, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Commit conflicts between replicas are retried on the refreshed table: every
    retried row delta gets a fresh sequence number, its deletes still cover only
    older rows, and nothing of either replica is lost."""
    first = make_config(tables=[upsert_table(partition_by=["region"])])
    second = first.model_copy(
        update={"spool": first.spool.model_copy(update={"dir": str(tmp_path / "spool-b")})}
    )
    expected: State = {}
    caplog.set_level(logging.INFO, logger="icespool.commit")
    async with run_daemon(first) as (a, _), run_daemon(second) as (b, _):
        writers = [a.writer(TABLE), b.writer(TABLE)]
        rng = random.Random(2)
        for round_no in range(6):
            for replica, writer in enumerate(writers):
                region = ("eu", "us")[replica]  # each replica owns its keys
                ups = [
                    {"id": i, "region": region, "name": f"r{round_no}-{i}", "score": replica}
                    for i in rng.sample(range(50), 20)
                ]
                dels = [{"id": i, "region": region} for i in rng.sample(range(50), 8)]
                await writer.upsert(ups)
                await writer.delete(dels)
                for row in ups:
                    expected[(row["id"], region)] = (row["name"], replica)
                for row in dels:
                    expected.pop((row["id"], region), None)
            results = await asyncio.gather(*(w.flush() for w in writers))
            assert all(r.snapshot_id is not None for r in results)
        iceberg = iceberg_table(a)
        assert merged(iceberg) == expected
        assert len(iceberg.metadata.snapshots) == 12
    # The flushes raced: some row deltas were retried after a conflict.
    assert any("commit conflict" in r.getMessage() for r in caplog.records)


async def test_without_a_key_index_commits_delete_by_key_and_maintenance_converts_them(
    make_config: Any, run_daemon: Any
) -> None:
    """The key index cannot be opened (a file stands where its directory goes): every
    commit deletes by key (equality deletes, counted), /v1/status says so, and
    maintenance turns those deletes into position deletes within seconds, out of its
    hour-long turn, with the merged state exactly the same."""
    config = make_config(tables=[upsert_table()], maintenance={"interval": "1h"})
    config.spool.dir.mkdir(parents=True, exist_ok=True)
    (config.spool.dir / "key-index").write_text("not a directory")
    async with run_daemon(config) as (service, _):
        table = service.writer(TABLE)
        for n in range(3):
            rows = [{"id": i, "region": "eu", "name": f"v{n}", "score": n} for i in range(20)]
            await table.upsert(rows)
            await table.delete([{"id": n, "region": "eu"}])
            await table.flush()
        expected = {(i, "eu"): ("v2", 2) for i in range(20) if i != 2}
        assert service.status()["tables"][TABLE]["key_index"] == {
            "ready": False,
            "snapshot_id": None,
        }
        assert (
            metric(service, "icespool_upsert_commits_total", table=TABLE, deletes="equality") == 3
        )
        for _ in range(300):
            kinds = {f.content for f in delete_files(iceberg_table(service))}
            if kinds == {DataFileContent.POSITION_DELETES}:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"equality deletes not converted: {kinds}")
        assert merged(iceberg_table(service)) == expected
