"""The catalog restored from a backup (or failed over to a lagging replica) under a
running daemon.

A real `icespool run` child commits to a table of a PostgreSQL catalog; then the
catalog's row for the table is set back to an older metadata file, as restoring a
backup of the catalog database does. The daemon stays up and goes on committing on
top of the restored table; a full scan succeeds. The rows of the commits the catalog
forgot were acked and their segments deleted: they are not in the table any more, but
their data files are kept (the orphan sweep would otherwise delete them as
never-committed) and the daemon says so at warning with a metric.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import aiohttp
import psycopg2
import pyarrow.parquet as pq
from support.daemon_harness import Daemon, DaemonDir


def _database(postgres_uri: str) -> str:
    return postgres_uri.rsplit("/", 1)[1]


def _set_location(postgres_uri: str, location: str) -> None:
    with (
        psycopg2.connect(
            host="127.0.0.1", port=5432, user="postgres", dbname=_database(postgres_uri)
        ) as conn,
        conn.cursor() as cursor,
    ):
        cursor.execute(
            "UPDATE iceberg_tables SET metadata_location = %s, previous_metadata_location = NULL"
            " WHERE table_namespace = 't' AND table_name = 'events'",
            (location,),
        )
        assert cursor.rowcount == 1


async def _commit(daemon: Daemon, ids: range) -> None:
    async with aiohttp.ClientSession() as session:
        await daemon.ingest(session, [{"id": i, "v": f"r{i}"} for i in ids])
        await daemon.flush(session)


async def test_a_catalog_restored_from_a_backup_under_a_running_daemon(
    tmp_path: Path, postgres_uri: str
) -> None:
    home = DaemonDir(tmp_path / "d", catalog_uri=postgres_uri)
    home.write_config(
        batch_timeout="1h",
        extra='\n[maintenance]\ninterval = "1s"\norphan_older_than = "1s"\n',
    )
    daemon = Daemon(home)
    try:
        daemon.start()
        await daemon.wait_ready()
        await _commit(daemon, range(1000))
        table, catalog = home.load_table()
        catalog.engine.dispose()
        backup = table.metadata_location
        await _commit(daemon, range(1000, 2000))
        await _commit(daemon, range(2000, 3000))
        table, catalog = home.load_table()
        catalog.engine.dispose()
        lost_files = {task.file.file_path for task in table.scan().plan_files()}
        _set_location(postgres_uri, backup)  # the restore
        await _commit(daemon, range(3000, 4000))
        await daemon.wait_log("this process committed are in no snapshot any more", within=30)
        async with aiohttp.ClientSession() as session:
            metrics = await daemon.metrics(session)
        assert 'icespool_maintenance_files_kept{table="t.events"} 2.0' in metrics, metrics
        assert "the table lost those commits (its catalog restored from a backup" in daemon.log()
        daemon.signal(15)
        assert await daemon.wait_exit(60) == 0, daemon.tail()
    finally:
        daemon.cleanup()
    rows, _ = home.read_rows()  # a full scan
    ids = Counter(int(r["id"]) for r in rows)
    assert set(ids) == set(range(1000)) | set(range(3000, 4000))
    assert max(ids.values()) == 1
    # The two forgotten commits' files are still there, holding exactly their rows.
    present = [p for p in lost_files if Path(p.removeprefix("file://")).exists()]
    assert len(present) == len(lost_files) == 3, present
    back = Counter(
        int(i)
        for p in present
        for i in pq.read_table(p.removeprefix("file://"), columns=["id"]).column("id").to_pylist()
    )
    assert set(back) == set(range(3000)) and max(back.values()) == 1
