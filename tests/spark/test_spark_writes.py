"""Spark writes to tables the daemon writes: INSERTs and rewrite_data_files while the daemon
commits (shared PostgreSQL catalog), and expire_snapshots between a crash and a restart."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
from pyiceberg.catalog import load_catalog
from support.daemon_harness import Daemon, DaemonDir
from support.spark_helpers import unique_catalog_name

from icespool.config import validate_config
from icespool.iceberg import commit_files, find_committed_segments

ROWS_PER_FLUSH = 40
DAEMON_FLUSHES = 12
SPARK_INSERTS = 4
SPARK_ROWS = 25
NDJSON = {"Content-Type": "application/x-ndjson"}


def _ndjson(ids: range, src: str) -> str:
    return "".join(json.dumps({"id": i, "v": src}) + "\n" for i in ids)


async def test_spark_insert_and_compaction_while_the_daemon_commits_lose_nothing(
    make_config: Any,
    run_daemon: Any,
    spark: Any,
    register: Any,
    catalog_name: str,
    postgres_uri: str,
    tmp_path: Path,
) -> None:
    config = make_config(
        catalog={
            "name": catalog_name,
            "uri": postgres_uri,
            "warehouse": (tmp_path / "warehouse").as_uri(),
        },
        tables=[
            {
                "name": "w.events",
                "create": True,
                "schema": [
                    {"name": "id", "type": "long", "required": True},
                    {"name": "v", "type": "string"},
                ],
            }
        ],
    )
    name = register(config)
    table = f"{name}.w.events"
    flushes: list[Any] = []
    spark_results: dict[str, Any] = {}

    async def daemon_side(service: Any, url: str) -> None:
        async with aiohttp.ClientSession() as session:
            for n in range(DAEMON_FLUSHES):
                ids = range(n * ROWS_PER_FLUSH, (n + 1) * ROWS_PER_FLUSH)
                async with session.post(
                    f"{url}/v1/tables/w.events/records", data=_ndjson(ids, "daemon"), headers=NDJSON
                ) as resp:
                    assert resp.status == 200, await resp.text()
                flushes.append(await service.flush("w.events"))
                await asyncio.sleep(0.05)

    def spark_side() -> None:
        for k in range(SPARK_INSERTS):
            start = 1_000_000 + k * SPARK_ROWS
            values = ", ".join(f"({i}, 'spark')" for i in range(start, start + SPARK_ROWS))
            spark.sql(f"INSERT INTO {table} VALUES {values}")
            if k == 1:
                spark_results["rewrite"] = spark.sql(
                    f"CALL {name}.system.rewrite_data_files(table => 'w.events', "
                    "options => map('min-input-files', '2'))"
                ).first()

    async with run_daemon(config) as (service, url):
        # The table exists once the daemon started; Spark then writes while the daemon does.
        await asyncio.gather(daemon_side(service, url), asyncio.to_thread(spark_side))
        # After the foreign snapshots the daemon still commits.
        async with aiohttp.ClientSession() as session:
            ids = range(DAEMON_FLUSHES * ROWS_PER_FLUSH, (DAEMON_FLUSHES + 1) * ROWS_PER_FLUSH)
            async with session.post(
                f"{url}/v1/tables/w.events/records", data=_ndjson(ids, "daemon"), headers=NDJSON
            ) as resp:
                assert resp.status == 200
        flushes.append(await service.flush("w.events"))

    assert [f.records for f in flushes] == [ROWS_PER_FLUSH] * (DAEMON_FLUSHES + 1)
    assert spark_results["rewrite"].rewritten_data_files_count >= 2

    # Final counts are exact and every id is there once.
    daemon_ids = list(range((DAEMON_FLUSHES + 1) * ROWS_PER_FLUSH))
    spark_ids = list(range(1_000_000, 1_000_000 + SPARK_INSERTS * SPARK_ROWS))
    got = sorted(row.id for row in spark.table(table).select("id").collect())
    assert got == daemon_ids + spark_ids
    by_source = dict(
        tuple(r) for r in spark.sql(f"SELECT v, count(*) FROM {table} GROUP BY v").collect()
    )
    assert by_source == {"daemon": len(daemon_ids), "spark": len(spark_ids)}

    # Every commit of both sides is in the table's history.
    snapshots = spark.sql(f"SELECT snapshot_id, operation, summary FROM {table}.snapshots")
    by_id = {s.snapshot_id: s for s in snapshots.collect()}
    assert {f.snapshot_id for f in flushes} <= set(by_id)
    operations = sorted(s.operation for s in by_id.values())
    assert operations == sorted(["append"] * (DAEMON_FLUSHES + 1 + SPARK_INSERTS) + ["replace"])
    spark_appends = [
        s
        for s in by_id.values()
        if s.operation == "append" and "icespool.segments" not in s.summary
    ]
    assert len(spark_appends) == SPARK_INSERTS

    # The daemon's exactly-once bookkeeping survived the foreign snapshots: every segment
    # is found in its snapshot, and committing one again is recognised, not repeated.
    catalog = load_catalog(catalog_name, **config.catalog.properties())
    try:
        iceberg_table = catalog.load_table("w.events")
        segments = [s for f in flushes for s in f.segments]
        found = find_committed_segments(iceberg_table, segments)
        assert found == {s: f.snapshot_id for f in flushes for s in f.segments}
        before = len(iceberg_table.metadata.snapshots)
        again = commit_files(
            iceberg_table,
            [next(iter(iceberg_table.scan().plan_files())).file],
            segment_ids=list(flushes[0].segments),
            summary={"icespool.reason": "recovery"},
        )
        assert (again.already_committed, again.snapshot_id) == (True, flushes[0].snapshot_id)
        iceberg_table.refresh()
        assert len(iceberg_table.metadata.snapshots) == before
        # pyiceberg reads Spark's rewritten files too: same rows as Spark sees.
        assert iceberg_table.scan().to_arrow().num_rows == len(daemon_ids) + len(spark_ids)
    finally:
        catalog.engine.dispose()


async def test_expire_snapshots_by_spark_does_not_break_recovery_after_a_crash(
    spark: Any, register: Any, tmp_path: Path
) -> None:
    catalog_name = unique_catalog_name()
    home = DaemonDir(tmp_path / "d")
    path = home.write_config(batch_timeout="600s")
    path.write_text(path.read_text().replace('name = "lake"', f'name = "{catalog_name}"', 1))
    config = validate_config(
        {
            "catalog": {"name": catalog_name, **home.catalog_properties},
            "spool": {"dir": str(home.spool_dir)},
        }
    )
    name = register(config)
    table = f"{name}.t.events"
    daemon = Daemon(home)
    try:
        daemon.start()
        await daemon.wait_ready()
        async with aiohttp.ClientSession() as session:
            for n in range(3):
                await daemon.ingest(
                    session, [{"id": i, "v": "daemon"} for i in range(n * 100, n * 100 + 100)]
                )
                await daemon.flush(session)
            spark.sql(f"INSERT INTO {table} VALUES (900001, 'spark'), (900002, 'spark')")
            # Acked, not committed: only the spool holds these when the daemon dies.
            await daemon.ingest(session, [{"id": i, "v": "daemon"} for i in range(300, 400)])
        assert daemon.kill() == -9
        assert len(home.spool_files()) == 1

        expired = spark.sql(
            f"CALL {name}.system.expire_snapshots(table => 't.events', "
            "older_than => TIMESTAMP '2999-01-01 00:00:00', retain_last => 1)"
        ).first()
        assert expired.deleted_manifest_lists_count == 3  # the daemon's three snapshots
        assert spark.sql(f"SELECT count(*) FROM {table}.snapshots").first()[0] == 1

        daemon.start()
        await daemon.wait_ready()
        await daemon.wait_log("reason=recovery", within=30)
        assert home.spool_files() == []
    finally:
        daemon.cleanup()

    ids = sorted(row.id for row in spark.table(table).select("id").collect())
    assert ids == [*range(400), 900001, 900002]
    summaries = spark.sql(
        f"SELECT summary['icespool.reason'] FROM {table}.snapshots ORDER BY committed_at"
    ).collect()
    assert [s[0] for s in summaries] == [None, "recovery"]
