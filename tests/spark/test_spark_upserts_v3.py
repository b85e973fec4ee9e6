"""Spark 4.1 (Iceberg 1.11) reads upsert tables of format version 3 the daemon writes,
and writes beside it.

1. A real daemon commits changes over several flushes: Spark reads the exact merged
   state (every key, none twice), sees deletion vectors only (``delete_files``: PUFFIN,
   one per data file), and row lineage that holds (``_row_id`` unique; a key no flush
   changed keeps its ``_row_id`` and ``_last_updated_sequence_number``, a changed one
   gets the sequence number of the commit that changed it).
2. Spark's merge-on-read ``DELETE`` and ``MERGE INTO`` (deletion vectors of Spark's, in
   Puffin files that hold several data files' vectors) between the daemon's commits:
   the daemon's key index follows them, its next vectors merge Spark's and replace
   them, and Spark, the daemon's reader and the test agree key by key.
3. Vectors written by Spark: the key index follows them exactly, and the daemon's writer
   encodes their positions to the very bytes Iceberg Java wrote.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from typing import Any

import pyarrow as pa
from pyiceberg.manifest import FileFormat
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from support.cdc_tables import assert_index_exact, delete_files, merged_rows, v3_field
from support.maintenance_helpers import ENCODE
from support.service_helpers import key_index_ready, metric

from icespool.cdc import KeyIndex, read_merged
from icespool.iceberg import (
    commit_files,
    encode_data_files,
    load_catalog,
    read_deletion_vector,
    serialize_vector,
)
from icespool.iceberg._catalog import ensure_table
from icespool.schema import parse_schema
from icespool.spool import table_file_stem
from icespool.write import KEY_INDEX_DIR

TABLE = "v3.users"
SCHEMA = [
    {"name": "id", "type": "long", "required": True},
    {"name": "region", "type": "string", "required": True},
    {"name": "name", "type": "string", "required": True},
    {"name": "score", "type": "long"},
]
KEY = ("id", "region")
State = dict[tuple[int, str], tuple[str, int | None]]
# Spark's commits retry on the daemon's (4 retries may run out beside commits every second).
SPARK_WRITES = {
    "write.delete.mode": "merge-on-read",
    "write.update.mode": "merge-on-read",
    "write.merge.mode": "merge-on-read",
    "commit.retry.num-retries": "30",
}


def _table(**properties: str) -> dict[str, Any]:
    return {
        "name": TABLE,
        "create": True,
        "schema": SCHEMA,
        "key": list(KEY),
        "partition_by": ["bucket(4, id)"],
        "properties": {"format-version": "3", **properties},
    }


def _spark_rows(spark: Any, name: str) -> dict[tuple[int, str], Any]:
    found: dict[tuple[int, str], Any] = {}
    query = f"SELECT id, region, name, score, _row_id, _last_updated_sequence_number FROM {name}"
    for row in spark.sql(query).collect():
        key = (row.id, row.region)
        assert key not in found, f"key {key} is live twice in Spark's view"
        found[key] = row
    row_ids = [row._row_id for row in found.values()]
    assert None not in row_ids and len(set(row_ids)) == len(row_ids), "a _row_id twice"
    return found


def _spark_state(rows: dict[tuple[int, str], Any]) -> State:
    return {key: (row.name, row.score) for key, row in rows.items()}


def _vectors_only(spark: Any, name: str) -> None:
    """Spark sees deletion vectors only, one per live data file it names."""
    deletes = spark.sql(
        f"SELECT content, file_format, referenced_data_file FROM {name}.delete_files"
    ).collect()
    assert {(d.content, d.file_format) for d in deletes} <= {(1, "PUFFIN")}
    named = Counter(d.referenced_data_file for d in deletes)
    assert set(named.values()) <= {1}, named
    data = {r.file_path for r in spark.sql(f"SELECT file_path FROM {name}.data_files").collect()}
    assert set(named) <= data


def _changes(rng: random.Random, keys: int, count: int, tag: str) -> tuple[list[Any], list[Any]]:
    ups: list[dict[str, Any]] = []
    dels: list[dict[str, Any]] = []
    for _ in range(count):
        key = (rng.randrange(keys), rng.choice(["eu", "us"]))
        if rng.random() < 0.3:
            dels.append({"id": key[0], "region": key[1]})
        else:
            ups.append(
                {
                    "id": key[0],
                    "region": key[1],
                    "name": f"{tag}-{rng.randrange(10**6)}",
                    "score": rng.choice([None, rng.randrange(1000)]),
                }
            )
    return ups, dels


async def _flush(
    table: Any, ups: list[Any], dels: list[Any], expected: State, changed: set[Any]
) -> Any:
    await table.upsert(ups)
    for row in ups:
        expected[(row["id"], row["region"])] = (row["name"], row["score"])
        changed.add((row["id"], row["region"]))
    await table.delete(dels)
    for row in dels:
        expected.pop((row["id"], row["region"]), None)
        changed.add((row["id"], row["region"]))
    return await table.flush()


async def test_spark_reads_the_merged_state_vectors_and_row_lineage(
    make_config: Any, run_daemon: Any, spark: Any, register: Any, catalog_name: str
) -> None:
    config = make_config(
        catalog={"name": catalog_name},
        tables=[_table(**{"commit.manifest.min-count-to-merge": "2"})],
        defaults={"max_batch_records": 10_000_000},
    )
    name = f"{register(config)}.{TABLE}"
    rng = random.Random(23)
    expected: State = {}
    before: dict[tuple[int, str], Any] = {}
    async with run_daemon(config) as (service, _):
        table = service.writer(TABLE)
        await key_index_ready(service, TABLE)
        for flush_no in range(4):
            changed: set[tuple[int, str]] = set()
            ups, dels = _changes(rng, 300, 600 if flush_no == 0 else 60, f"f{flush_no}")
            result = await _flush(table, ups, dels, expected, changed)
            iceberg = service.tables.require_catalog().load_table(TABLE)
            sequence = iceberg.metadata.snapshot_by_id(result.snapshot_id).sequence_number
            await asyncio.to_thread(spark.sql, f"REFRESH TABLE {name}")
            now = await asyncio.to_thread(_spark_rows, spark, name)
            assert _spark_state(now) == expected, f"after flush {flush_no}"
            await asyncio.to_thread(_vectors_only, spark, name)
            for key, row in now.items():
                if key in changed:
                    assert row._last_updated_sequence_number == sequence, key
                elif key in before:
                    old = before[key]
                    assert (row._row_id, row._last_updated_sequence_number) == (
                        old._row_id,
                        old._last_updated_sequence_number,
                    ), key
            before = now
        assert (
            metric(service, "icespool_upsert_commits_total", table=TABLE, deletes="equality") == 0
        )
    # Spark's count answers from metadata where it can: it must agree too.
    count = await asyncio.to_thread(lambda: spark.sql(f"SELECT count(*) FROM {name}").first()[0])
    assert count == len(expected)
    vectors = await asyncio.to_thread(
        lambda: spark.sql(f"SELECT count(*) FROM {name}.delete_files").first()[0]
    )
    assert vectors > 0


async def test_spark_merge_on_read_delete_and_merge_beside_the_daemon(
    make_config: Any, run_daemon: Any, spark: Any, register: Any, catalog_name: str
) -> None:
    config = make_config(
        catalog={"name": catalog_name},
        tables=[_table(**SPARK_WRITES)],
        maintenance={"interval": "1h"},
    )
    name = f"{register(config)}.{TABLE}"
    rng = random.Random(29)
    expected: State = {}
    async with run_daemon(config) as (service, _):
        table = service.writer(TABLE)
        await key_index_ready(service, TABLE)
        for round_no in range(4):
            for flush_no in range(2):
                ups, dels = _changes(rng, 200, 400 if round_no == flush_no == 0 else 50, "d")
                await _flush(table, ups, dels, expected, set())
            # Spark between the daemon's commits: a delete by predicate, then a MERGE
            # updating some keys and inserting others (merge-on-read: vectors of Spark's).
            await asyncio.to_thread(
                spark.sql, f"DELETE FROM {name} WHERE id % 7 = {round_no} AND region = 'eu'"
            )
            for key in [k for k in expected if k[0] % 7 == round_no and k[1] == "eu"]:
                expected.pop(key)
            source = [(i, "us", f"spark-{round_no}-{i}", i) for i in range(round_no, 260, 9)]
            values = ", ".join(f"({i}, '{r}', '{n}', {s})" for i, r, n, s in source)
            await asyncio.to_thread(
                spark.sql,
                f"MERGE INTO {name} t USING (SELECT * FROM VALUES {values} "
                "AS s(id, region, name, score)) s ON t.id = s.id AND t.region = s.region "
                "WHEN MATCHED THEN UPDATE SET t.name = s.name, t.score = s.score "
                "WHEN NOT MATCHED THEN INSERT *",
            )
            for i, r, n, s in source:
                expected[(i, r)] = (n, s)
        # The daemon's last commits touch keys Spark deleted and updated.
        ups, dels = _changes(rng, 260, 200, "last")
        await _flush(table, ups, dels, expected, set())
        # The key index followed Spark's vectors: no commit fell back to equality deletes.
        assert (
            metric(service, "icespool_upsert_commits_total", table=TABLE, deletes="equality") == 0
        )
    await asyncio.to_thread(spark.sql, f"REFRESH TABLE {name}")
    assert _spark_state(await asyncio.to_thread(_spark_rows, spark, name)) == expected
    await asyncio.to_thread(_vectors_only, spark, name)
    iceberg = load_catalog(config.catalog.name, config.catalog.properties()).load_table(TABLE)
    daemon = {
        (r["id"], r["region"]): (r["name"], r["score"]) for r in read_merged(iceberg).to_pylist()
    }
    assert daemon == expected
    assert {k: (r["name"], r["score"]) for k, r in merged_rows(iceberg, KEY).items()} == expected
    index_file = config.spool.dir / KEY_INDEX_DIR / f"{table_file_stem(TABLE)}.sqlite3"
    index = KeyIndex(index_file, [1, 2], cache_bytes=1 << 20)
    try:
        assert_index_exact(index, iceberg, KEY)
    finally:
        index.close()


def test_the_key_index_follows_sparks_vectors_and_the_writer_matches_their_bytes(
    make_config: Any, spark: Any, register: Any, catalog_name: str
) -> None:
    config = make_config(catalog={"name": catalog_name})
    catalog = load_catalog(config.catalog.name, config.catalog.properties())
    schema = parse_schema(SCHEMA)
    table = ensure_table(
        catalog,
        TABLE,
        schema,
        UNPARTITIONED_PARTITION_SPEC,
        {"format-version": "3", **SPARK_WRITES},
        True,
    )
    for n in range(3):
        rows = pa.table(
            {
                "id": pa.array(range(n * 1000, n * 1000 + 1000), pa.int64()),
                "region": ["eu"] * 1000,
                "name": [f"n{n}"] * 1000,
                "score": pa.array(range(1000), pa.int64()),
            }
        )
        files = encode_data_files(table, rows.to_batches(), file_prefix=f"s{n}", **ENCODE)
        commit_files(table, files, segment_ids=[f"s{n}"], summary={})
    index = KeyIndex(config.spool.dir / "idx.sqlite3", [1, 2], cache_bytes=1 << 20)
    try:
        index.sync(table)
        name = f"{register(config)}.{TABLE}"
        # One Spark delete across every data file: its vectors share Puffin files.
        spark.sql(f"DELETE FROM {name} WHERE id % 3 = 0 OR id % 1000 > 990")
        table.refresh()
        vectors = delete_files(table)
        assert {f.file_format for f in vectors} == {FileFormat.PUFFIN} and len(vectors) == 3
        index.sync(table)  # follows Spark's snapshot: reads its vectors
        assert_index_exact(index, table, KEY)
        for vector in vectors:
            offset = v3_field(vector, "content_offset")
            size = v3_field(vector, "content_size_in_bytes")
            with table.io.new_input(vector.file_path).open() as stream:
                stream.seek(offset)
                java = stream.read(size)
            positions = read_deletion_vector(table.io, vector)
            assert len(positions) == vector.record_count
            assert serialize_vector(positions) == java  # byte for byte Iceberg Java's
        spark_ids = {r.id for r in spark.sql(f"SELECT id FROM {name}").collect()}
        assert spark_ids == {i for i, _ in merged_rows(table, KEY)}
        assert len(spark_ids) == 3000 - sum(1 for i in range(3000) if i % 3 == 0 or i % 1000 > 990)
    finally:
        index.close()
