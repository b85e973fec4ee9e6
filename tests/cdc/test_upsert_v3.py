"""Upsert tables of format version 3 through a real daemon (in-process service, SQLite
catalog): each flush deletes the older rows of its keys by deletion vectors (one per
data file, merged with that file's earlier one, in one Puffin file per commit), the
table's metadata carries the row lineage v3 requires (next-row-id, each snapshot's
first-row-id and added-rows, each manifest's and data file's first_row_id), copied rows
keep their row ids, and the merged state equals the state computed here key by key.

The merged state is read twice: by the daemon's reader (`read_merged`) and by the
test's own (support.cdc_tables.merged_rows: manifests read with pyiceberg's v3 schema,
vectors with pyiceberg's Puffin reader); at the end also by pyiceberg's own `scan()`.
Spark reads the same tables in tests/spark/test_spark_upserts_v3.py.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.manifest import DataFileContent, FileFormat
from pyiceberg.table import Table
from support.cdc_tables import assert_index_exact, delete_files, merged_rows, v3_field
from support.maintenance_helpers import local_path
from support.service_helpers import key_index_ready, metric

from icespool.cdc import KeyIndex, live_files, read_merged, read_positions
from icespool.iceberg import ROW_LINEAGE_FIELDS, load_catalog
from icespool.maintenance import is_daemon_file
from icespool.spool import table_file_stem
from icespool.write import KEY_INDEX_DIR

TABLE = "cdc.users3"
SCHEMA = [
    {"name": "id", "type": "long", "required": True},
    {"name": "region", "type": "string", "required": True},
    {"name": "name", "type": "string", "required": True},
    {"name": "score", "type": "long"},
]
KEY = ("id", "region")
State = dict[tuple[int, str], tuple[str, int | None]]


def upsert_table(**extra: Any) -> dict[str, Any]:
    properties = {"format-version": "3", **extra.pop("properties", {})}
    return {
        "name": TABLE,
        "create": True,
        "schema": SCHEMA,
        "key": list(KEY),
        "properties": properties,
        **extra,
    }


def iceberg_table(service: Any) -> Table:
    return service.tables.require_catalog().load_table(TABLE)


def state_of(table: Table) -> State:
    daemon = {
        (r["id"], r["region"]): (r["name"], r["score"]) for r in read_merged(table).to_pylist()
    }
    independent = {k: (r["name"], r["score"]) for k, r in merged_rows(table, KEY).items()}
    assert daemon == independent
    return daemon


def row_ids(table: Table) -> dict[tuple[int, str], tuple[int, int]]:
    """Each live key's (_row_id, _last_updated_sequence_number): stored in its data file,
    or inherited (the file's first_row_id + position; its data sequence number)."""
    snapshot = table.metadata.current_snapshot()
    assert snapshot is not None
    live = live_files(table.io, table.metadata, snapshot)
    alive = set(merged_rows(table, KEY))
    found: dict[tuple[int, str], tuple[int, int]] = {}
    every_id: list[int] = []
    for path, data in live.data.items():
        assert data.first_row_id is not None, f"{path} has no first_row_id"
        read = pq.read_table(local_path(path))
        count = read.num_rows
        ids = np.arange(count, dtype=np.int64) + data.first_row_id
        seqs = np.full(count, data.sequence_number, dtype=np.int64)
        names = read.column_names
        for field, values in zip(ROW_LINEAGE_FIELDS, (ids, seqs), strict=True):
            if field.name in names:
                stored = read.column(field.name).to_pylist()
                values[:] = [
                    v if s is None else s for v, s in zip(values.tolist(), stored, strict=True)
                ]
        every_id += ids.tolist()
        for pos, row in enumerate(read.select(list(KEY)).to_pylist()):
            key = (row["id"], row["region"])
            if key in alive and pos not in _dead(table, live, path):
                found[key] = (int(ids[pos]), int(seqs[pos]))
    # Row ids are unique over every row of the live files, deleted ones included.
    assert len(every_id) == len(set(every_id))
    assert max(every_id, default=-1) < table.metadata.next_row_id  # type: ignore[union-attr]
    return found


def _dead(table: Table, live: Any, path: str) -> set[int]:
    dead: set[int] = set()
    for delete in live.deletes_for(live.data[path]):
        dead |= set(read_positions(table.io, delete.file, [path]).get(path, []).tolist())
    return dead


def check_lineage_metadata(table: Table) -> None:
    """Every snapshot has a first-row-id and added-rows, consecutive: each starts where
    the one before ended, and the table's next-row-id is where the last ends."""
    metadata = table.metadata
    assert metadata.format_version == 3
    expected = 0
    for snapshot in sorted(metadata.snapshots, key=lambda s: s.sequence_number or 0):
        assert snapshot.first_row_id == expected, snapshot
        assert snapshot.added_rows is not None
        expected += snapshot.added_rows
    assert metadata.next_row_id == expected  # type: ignore[union-attr]


async def test_flushes_delete_by_one_vector_per_file_and_keep_row_lineage(
    make_config: Any, run_daemon: Any
) -> None:
    config = make_config(
        tables=[
            upsert_table(
                partition_by=["bucket(4, id)", "region"],
                # Manifests merge every commit: merged entries must keep their row ids and
                # vectors their blob offsets.
                properties={"commit.manifest.min-count-to-merge": "2"},
            )
        ],
        defaults={"max_batch_records": 10_000_000},
    )
    rng = random.Random(11)
    expected: State = {}
    lineage: dict[tuple[int, str], tuple[int, int]] = {}
    async with run_daemon(config) as (service, _):
        table = service.writer(TABLE)
        await key_index_ready(service, TABLE)
        assert iceberg_table(service).metadata.format_version == 3
        vectors = 0
        for flush_no in range(6):
            changed: set[tuple[int, str]] = set()
            for _ in range(3):
                ups, dels = [], []
                # The first flush writes every key; later ones change a tenth of them:
                # tails are extended (their vectors moving with them), not compacted.
                for _ in range(400 if flush_no == 0 else 40):
                    key = (rng.randrange(400), rng.choice(["eu", "us"]))
                    changed.add(key)
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
            iceberg = iceberg_table(service)
            snapshot = iceberg.metadata.snapshot_by_id(result.snapshot_id)
            assert snapshot is not None
            live = live_files(iceberg.io, iceberg.metadata, snapshot)
            # Deletes are vectors only: PUFFIN entries naming one live data file each,
            # at most one per data file, all of this commit's in one Puffin file.
            assert all(d.is_vector and len(d.paths) == 1 for d in live.deletes)
            per_file = Counter(next(iter(d.paths)) for d in live.deletes)
            assert set(per_file) <= set(live.data) and set(per_file.values()) <= {1}
            added = [d for d in live.deletes if d.sequence_number == snapshot.sequence_number]
            assert len({d.path for d in added}) <= 1
            vectors += len(added)
            assert all(is_daemon_file(d.path) and d.path.endswith(".puffin") for d in added)
            assert state_of(iceberg) == expected, f"after flush {flush_no}"
            check_lineage_metadata(iceberg)
            # A key this flush did not change keeps its row id and sequence number (its
            # row may have been copied into a tail); a changed one has a new row.
            now = row_ids(iceberg)
            assert set(now) == set(expected)
            for key, before in lineage.items():
                if key in now and key not in changed:
                    assert now[key] == before, key
            lineage = now
        assert metric(service, "icespool_upsert_commits_total", table=TABLE, deletes="position")
        assert vectors > 20
        # Tails were copied: some live file stores the row ids of rows it copied.
        live = live_files(iceberg.io, iceberg.metadata, snapshot)
        stored = [path for path in live.data if "_row_id" in pq.read_schema(local_path(path)).names]
        assert stored
    iceberg = load_catalog(config.catalog.name, config.catalog.properties()).load_table(TABLE)
    # pyiceberg's own scan (its Puffin reader) reads the same merged state.
    scanned = iceberg.scan().to_arrow().to_pylist()
    assert len(scanned) == len(expected)
    assert {(r["id"], r["region"]): (r["name"], r["score"]) for r in scanned} == expected
    index_file = config.spool.dir / KEY_INDEX_DIR / f"{table_file_stem(TABLE)}.sqlite3"
    index = KeyIndex(index_file, [1, 2], cache_bytes=1 << 20)
    try:
        assert index.snapshot_id == iceberg.metadata.current_snapshot_id
        assert_index_exact(index, iceberg, KEY)
    finally:
        index.close()


async def test_a_delete_only_flush_writes_one_vector(make_config: Any, run_daemon: Any) -> None:
    config = make_config(tables=[upsert_table()])
    async with run_daemon(config) as (service, _):
        table = service.writer(TABLE)
        await key_index_ready(service, TABLE)
        await table.upsert(
            [{"id": i, "region": "eu", "name": f"n{i}", "score": i} for i in range(10)]
        )
        await table.flush()
        await table.delete([{"id": 3, "region": "eu"}, {"id": 42, "region": "eu"}])
        result = await table.flush()
        iceberg = iceberg_table(service)
        snapshot = iceberg.metadata.snapshot_by_id(result.snapshot_id)
        assert snapshot is not None and snapshot.summary.operation.value == "delete"
        (vector,) = delete_files(iceberg)
        assert vector.content == DataFileContent.POSITION_DELETES
        assert vector.file_format == FileFormat.PUFFIN and vector.record_count == 1
        assert v3_field(vector, "content_offset") == 4  # the first blob, after the magic
        await table.delete([{"id": 5, "region": "eu"}])
        await table.flush()
        # The same data file's second delete: its vector merged with the first, which
        # the snapshot removed (one vector per data file).
        (merged,) = delete_files(iceberg_table(service))
        assert merged.record_count == 2 and merged.file_path != vector.file_path
        assert state_of(iceberg_table(service)) == {
            (i, "eu"): (f"n{i}", i) for i in range(10) if i not in (3, 5)
        }


async def test_without_a_key_index_maintenance_turns_equality_deletes_into_vectors(
    make_config: Any, run_daemon: Any
) -> None:
    """Equality deletes (the key index cannot open) are turned into deletion vectors
    merged with the vectors the data files already have (the index comes back between
    rounds and deletes by vector meanwhile)."""
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
        for _ in range(300):
            files = delete_files(iceberg_table(service))
            if files and all(f.file_format == FileFormat.PUFFIN for f in files):
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"equality deletes not converted: {files}")
        iceberg = iceberg_table(service)
        named = Counter(v3_field(f, "referenced_data_file") for f in delete_files(iceberg))
        assert set(named.values()) == {1}
        assert state_of(iceberg) == expected
        check_lineage_metadata(iceberg)


async def test_a_v3_append_table_takes_appends_with_row_ids(
    make_config: Any, run_daemon: Any
) -> None:
    config = make_config(
        tables=[
            {
                "name": "plain.v3",
                "create": True,
                "schema": SCHEMA,
                "properties": {"format-version": "3", "commit.manifest.min-count-to-merge": "2"},
            }
        ]
    )
    async with run_daemon(config) as (service, _):
        writer = service.writer("plain.v3")
        for n in range(4):
            ids = list(range(n * 10, n * 10 + 10))
            await writer.append(
                pa.table({"id": ids, "region": ["eu"] * 10, "name": [f"n{n}"] * 10})
            )
            await writer.flush()
        iceberg = service.tables.require_catalog().load_table("plain.v3")
        check_lineage_metadata(iceberg)
        snapshot = iceberg.metadata.current_snapshot()
        assert snapshot is not None
        live = live_files(iceberg.io, iceberg.metadata, snapshot)
        # Each merge gives the merged manifest new ids for its added and existing rows
        # (the spec's simple assignment); the existing files keep theirs.
        starts = sorted(d.first_row_id or 0 for d in live.data.values())
        assert starts == [0, 10, 30, 60]
        assert iceberg.metadata.next_row_id == 100  # type: ignore[union-attr]


@pytest.mark.parametrize("version", ["1", "4"])
def test_other_format_versions_are_refused_for_upsert_tables(
    make_config: Any, version: str
) -> None:
    from icespool.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        make_config(tables=[upsert_table(properties={"format-version": version})])
    assert caught.value.key == "tables[0].properties.format-version"
    assert 'set format-version = "2" or "3"' in str(caught.value)
