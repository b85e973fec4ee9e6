"""Spark on Google Cloud Storage: the daemon writes a ``gs://`` table to fake-gcs-server
(support/gcs.py) through a SQL catalog, and the shared SparkSession reads it through
Iceberg's GCSFileIO and the GCP bundle, on exactly the settings ``icespool spark-conf``
prints (``gcs.service.host`` and the OAuth2 token are Iceberg Java's keys too)."""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

import pyarrow as pa
from support.gcs import FakeGcs
from support.spark_helpers import rows

TABLE = "t.events"
_TABLES = [
    {
        "name": TABLE,
        "create": True,
        "schema": [
            {"name": "id", "type": "long", "required": True},
            {"name": "v", "type": "string"},
        ],
    }
]


def _batch(ids: range) -> pa.RecordBatch:
    return pa.record_batch(
        {"id": pa.array(ids, pa.int64()), "v": pa.array([f"v{i}" for i in ids], pa.string())}
    )


async def test_spark_reads_every_id_of_a_gs_table_once(
    fake_gcs: FakeGcs, make_config: Any, run_daemon: Any, spark: Any, register: Any,
    catalog_name: str,
) -> None:  # fmt: skip
    bucket = f"lake-{uuid.uuid4().hex[:12]}"
    fake_gcs.create_bucket(bucket)
    warehouse = f"gs://{bucket}/warehouse"
    config = make_config(
        catalog={"name": catalog_name, **fake_gcs.catalog_properties(warehouse)}, tables=_TABLES
    )
    async with run_daemon(config) as (service, _):
        for ids in (range(400), range(400, 700), range(700, 1000)):
            await service.writer(TABLE).append(_batch(ids))
            result = await service.flush(TABLE)
            assert result.records == len(ids), result

    name = register(config)
    prefix = f"spark.sql.catalog.{name}"
    assert spark.conf.get(f"{prefix}.io-impl") == "org.apache.iceberg.gcp.gcs.GCSFileIO"
    assert spark.conf.get(f"{prefix}.gcs.service.host") == fake_gcs.endpoint

    got = rows(spark.sql(f"SELECT id, v FROM {name}.{TABLE}"))
    ids = Counter(i for i, _ in got)
    assert ids == Counter(range(1000)), sorted(i for i, n in ids.items() if n != 1)
    assert sorted(got) == [(i, f"v{i}") for i in range(1000)]
    # Spark read the data files from the bucket: those the table lists are the objects there.
    files = [path for (path,) in rows(spark.sql(f"SELECT file_path FROM {name}.{TABLE}.files"))]
    assert len(files) == 3, files
    objects = set(fake_gcs.object_names(bucket))
    assert {path.removeprefix(f"gs://{bucket}/") for path in files} <= objects
