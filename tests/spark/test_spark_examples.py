"""The example Spark jobs in deploy/spark/ on real Spark over tables the daemon wrote."""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[2]
NDJSON = {"Content-Type": "application/x-ndjson"}
SCHEMA = [{"name": "id", "type": "long", "required": True}, {"name": "v", "type": "string"}]


def _example(name: str) -> ModuleType:
    path = REPO / "deploy" / "spark" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"icespool_example_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through it
    spec.loader.exec_module(module)
    return module


async def _commit(service: Any, url: str, table: str, ids: range) -> Any:
    body = "".join(json.dumps({"id": i, "v": f"r{i}"}) + "\n" for i in ids)
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/v1/tables/{table}/records", data=body, headers=NDJSON) as resp,
    ):
        assert resp.status == 200, await resp.text()
    return await service.flush(table)


def _output_ids(output: Path) -> list[int]:
    ids: list[int] = []
    for part in sorted(output.glob("*-*")):
        ids += pq.read_table(part, columns=["id"]).column("id").to_pylist()
    return sorted(ids)


async def test_incremental_job_processes_only_new_snapshots(
    make_config: Any,
    run_daemon: Any,
    spark: Any,
    register: Any,
    catalog_name: str,
    tmp_path: Path,
) -> None:
    job = _example("incremental_job")
    config = make_config(
        catalog={"name": catalog_name},
        tables=[{"name": "inc.events", "create": True, "schema": SCHEMA}],
    )
    name = register(config)
    table = f"{name}.inc.events"
    state, output = tmp_path / "state.json", tmp_path / "out"
    process = job.write_parquet(output)

    async with run_daemon(config) as (service, url):
        first = await _commit(service, url, "inc.events", range(10))
        second = await _commit(service, url, "inc.events", range(10, 20))

        run1 = job.run_incremental(spark, table, state, process)
        assert (run1.start_snapshot_id, run1.end_snapshot_id, run1.rows) == (
            None,
            second.snapshot_id,
            20,
        )
        assert json.loads(state.read_text()) == {"table": table, "snapshot_id": second.snapshot_id}

        run2 = job.run_incremental(spark, table, state, process)
        assert (run2.start_snapshot_id, run2.end_snapshot_id, run2.rows) == (
            second.snapshot_id,
            second.snapshot_id,
            0,
        )

        third = await _commit(service, url, "inc.events", range(20, 30))
        # A compaction in between moves rows; the job must not process them again.
        spark.sql(
            f"CALL {name}.system.rewrite_data_files(table => 'inc.events', "
            "options => map('min-input-files', '2'))"
        ).collect()
        fourth = await _commit(service, url, "inc.events", range(30, 35))

        run3 = job.run_incremental(spark, table, state, process)
        assert (run3.start_snapshot_id, run3.end_snapshot_id, run3.rows) == (
            second.snapshot_id,
            fourth.snapshot_id,
            15,
        )
    assert first.records == 10 and third.records == 10
    assert _output_ids(output) == list(range(35))


def _data_files(spark: Any, table: str) -> int:
    return int(spark.sql(f"SELECT count(*) FROM {table}.files").first()[0])


async def test_maintenance_job_compacts_many_small_files_and_keeps_the_data(
    make_config: Any,
    run_daemon: Any,
    spark: Any,
    register: Any,
    catalog_name: str,
) -> None:
    job = _example("maintenance_job")
    config = make_config(
        catalog={"name": catalog_name},
        tables=[{"name": "m.events", "create": True, "schema": SCHEMA}],
    )
    name = register(config)
    table = f"{name}.m.events"
    async with run_daemon(config) as (service, url):
        flushes = [
            await _commit(service, url, "m.events", range(n * 20, n * 20 + 20)) for n in range(12)
        ]
        before = sorted(tuple(r) for r in spark.table(table).collect())
        assert len(before) == 240
        assert _data_files(spark, table) == 12

        # Two leftovers in the table's data directory that no snapshot references: one from
        # long ago, one as fresh as an in-flight flush (which must survive).
        data_dir = Path(config.catalog.warehouse.removeprefix("file://")) / "m" / "events" / "data"
        old_orphan, fresh_orphan = data_dir / "old-orphan.parquet", data_dir / "fresh.parquet"
        old_orphan.write_bytes(b"x")
        fresh_orphan.write_bytes(b"y")
        ten_days_ago = time.time() - 10 * 86400
        os.utime(old_orphan, (ten_days_ago, ten_days_ago))

        result = job.maintain(spark, name, "m.events")

        assert (result.rewritten_data_files, result.added_data_files) == (12, 1)
        # The daemon's 12 one-per-flush manifests and the compaction's new one become one.
        assert result.rewritten_manifests == 12 + 1
        assert spark.sql(f"SELECT count(*) FROM {table}.manifests").first()[0] == 1
        # Defaults keep every young snapshot: the daemon's segment bookkeeping is intact.
        assert (result.expired_data_files, result.expired_manifest_lists) == (0, 0)
        assert result.orphan_files == (old_orphan.as_uri().replace("file:///", "file:/"),)
        assert not old_orphan.exists() and fresh_orphan.exists()

        assert _data_files(spark, table) == 1
        assert sorted(tuple(r) for r in spark.table(table).collect()) == before
        segments = spark.sql(
            f"SELECT summary['icespool.segments'] FROM {table}.snapshots "
            "WHERE summary['icespool.segments'] IS NOT NULL"
        ).collect()
        assert sorted(s[0] for s in segments) == sorted(",".join(f.segments) for f in flushes)

        # The daemon keeps committing on top of the compacted table.
        after = await _commit(service, url, "m.events", range(240, 250))
        assert after.records == 10
    assert spark.table(table).count() == 250

    # With a short retention the old snapshots go, the rows stay.
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=30)
    policy = job.MaintenancePolicy(
        retain_last=1,
        orphan_older_than=dt.timedelta(days=32),  # orphans: now - 2 days
    )
    snapshots = int(spark.sql(f"SELECT count(*) FROM {table}.snapshots").first()[0])
    expired = job.maintain(spark, name, "m.events", policy, now=later)
    assert expired.orphan_files == ()
    # rewrite_manifests (the daemon's last flush added a second manifest) made a new current
    # snapshot; every one before it expired.
    assert (expired.rewritten_manifests, expired.expired_manifest_lists) == (2, snapshots)
    assert spark.sql(f"SELECT count(*) FROM {table}.snapshots").first()[0] == 1
    assert spark.table(table).count() == 250
