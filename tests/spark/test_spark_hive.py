"""Spark reads a Hive Metastore table a real ``icespool run`` writes: Iceberg's HiveCatalog
(through Spark's own Hive client) on the same metastore (tests/support/hive_metastore.py),
registered on the shared session exactly as ``icespool spark-conf`` maps the daemon's
``[catalog]`` (``type = hive``, ``uri = thrift://...``)."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import aiohttp
from support.daemon_harness import TABLE, Daemon, DaemonDir
from support.hive_metastore import HiveMetastore
from support.spark_helpers import rows, unique_catalog_name

from icespool.config import load_config
from icespool.spark.session import register_catalog

_TIMEOUT = aiohttp.ClientTimeout(total=30)


async def test_spark_reads_the_daemons_hive_table_after_each_commit(
    spark: Any, hive_metastore: HiveMetastore, tmp_path: Path
) -> None:
    home = DaemonDir(
        tmp_path / "d", catalog=hive_metastore.catalog_properties(hive_metastore.warehouse())
    )
    home.write_config(extra='[maintenance]\nlease = "none"\n')
    daemon = Daemon(home)
    try:
        daemon.start()
        await daemon.wait_ready()
        name = register_catalog(spark, load_config(home.config_path), unique_catalog_name())
        async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
            for batch in range(3):
                ids = range(batch * 1000, (batch + 1) * 1000)
                await daemon.ingest(session, [{"id": i, "v": f"v{i}"} for i in ids])
                await daemon.flush(session)
                seen = rows(
                    spark.sql(
                        f"SELECT count(*), count(DISTINCT id), min(id), max(id) "
                        f"FROM {name}.{TABLE} WHERE v = concat('v', CAST(id AS STRING))"
                    )
                )
                assert seen == [(ids.stop, ids.stop, 0, ids.stop - 1)], (batch, seen)
        snapshots = rows(spark.sql(f"SELECT count(*) FROM {name}.{TABLE}.snapshots"))
        assert snapshots == [(3,)]
        daemon.signal(signal.SIGTERM)
        assert await daemon.wait_exit(35) == 0, daemon.tail()
    finally:
        daemon.cleanup()
