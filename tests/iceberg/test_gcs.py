"""Google Cloud Storage for real: ``gs://`` warehouses in fake-gcs-server (the GCS JSON API,
``support/gcs.py``) through pyiceberg's pyarrow FileIO, with a SQL catalog.

- ``check-config --connect`` writes, lists and deletes its probe object in the bucket, and
  fails naming the bucket's problem (missing, store unreachable) and the ``gcs.*`` keys.
- A store outage: ingest keeps acking, flushes answer 503 naming the object store within
  ``timeouts.storage_request`` (pyarrow's own retry limit is 15 minutes), and the records
  land once it is back, every id once.

The kill -9 rounds on a gs:// warehouse are ``tests/faults/test_daemon.py``'s (``sql-gcs``).
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from pyiceberg.catalog import load_catalog
from support.daemon_harness import CATALOG_NAME, TABLE, DaemonDir
from support.fixture_types import MakeConfig, RunDaemon
from support.gcs import FakeGcs
from support.store_config import write_store_config

from icespool.cli import main
from icespool.config import load_config
from icespool.errors import CatalogError
from icespool.iceberg import check_catalog
from icespool.iceberg._timeouts import GcsBoundedFileIO

_NDJSON = {"Content-Type": "application/x-ndjson"}
_TOKEN = "fake-gcs-accepts-any-token"
_GCS_KEYS = "Google Cloud Storage: the bucket, gcs.service.host, gcs.oauth2.token"
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


def _bucket(fake_gcs: FakeGcs) -> str:
    name = f"lake-{uuid.uuid4().hex[:12]}"
    fake_gcs.create_bucket(name)
    return name


def _sql_catalog(tmp_path: Path, gcs: dict[str, str]) -> dict[str, str]:
    return {"type": "sql", "uri": f"sqlite:///{tmp_path / 'catalog.db'}", **gcs}


def _config_file(tmp_path: Path, catalog: dict[str, str], timeouts: str = "") -> Path:
    home = DaemonDir(tmp_path / "home")
    path = write_store_config(home, catalog)
    if timeouts:
        path.write_text(path.read_text() + f"\n[timeouts]\n{timeouts}\n")
    return path


def test_check_config_connect_probes_the_gs_warehouse(
    fake_gcs: FakeGcs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bucket = _bucket(fake_gcs)
    warehouse = f"gs://{bucket}/warehouse"
    path = _config_file(tmp_path, _sql_catalog(tmp_path, fake_gcs.catalog_properties(warehouse)))

    assert main(["check-config", "--connect", "--config", str(path)]) == 0
    printed = capsys.readouterr()
    assert printed.err.splitlines()[-3:] == [
        f"catalog 'lake' (sql): the SQLite database {tmp_path / 'catalog.db'} does not exist "
        "yet; `icespool run` creates it at start",
        f"table {TABLE}: missing, created at start (create = true)",
        f"storage (warehouse): wrote, listed and deleted a probe object under {warehouse}",
    ]
    assert _TOKEN not in printed.out + printed.err
    # The probe went through the emulator (the bucket saw it) and is gone again.
    assert fake_gcs.object_names(bucket) == []


def test_check_config_connect_names_a_missing_bucket(
    fake_gcs: FakeGcs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    warehouse = f"gs://no-such-bucket-{uuid.uuid4().hex[:8]}/warehouse"
    path = _config_file(tmp_path, _sql_catalog(tmp_path, fake_gcs.catalog_properties(warehouse)))

    with pytest.raises(CatalogError) as failed:
        check_catalog(load_config(path))
    message = str(failed.value)
    assert message.startswith(f"cannot write the probe object {warehouse}/icespool-probe-")
    assert "FileNotFoundError: [Errno 2] google::cloud::Status(NOT_FOUND: " in message
    assert message.endswith(
        f"check the storage settings ({_GCS_KEYS}, or the catalog's vended credentials) "
        "and the permissions on that location"
    ), message

    assert main(["check-config", "--connect", "--config", str(path)]) == 2
    printed = capsys.readouterr()
    assert f"cannot write the probe object {warehouse}/icespool-probe-" in printed.err
    assert _TOKEN not in printed.out + printed.err


def test_check_config_connect_fails_within_storage_request_when_gcs_is_down(
    tmp_path: Path,
) -> None:
    """A stopped store is given up on after timeouts.storage_request (2 s here), not after
    pyarrow's default 15 minutes of retries."""
    server = FakeGcs.start(tmp_path / "gcs")
    server.stop()
    warehouse = "gs://lake/warehouse"
    catalog = _sql_catalog(tmp_path, server.catalog_properties(warehouse))
    path = _config_file(tmp_path, catalog, timeouts='storage_request = "2s"')

    started = time.monotonic()
    with pytest.raises(CatalogError) as failed:
        check_catalog(load_config(path))
    elapsed = time.monotonic() - started
    message = str(failed.value)
    assert message.startswith(f"cannot write the probe object {warehouse}/icespool-probe-")
    assert "OSError: google::cloud::Status(UNAVAILABLE: Retry policy exhausted" in message
    assert "Could not connect to server" in message
    assert f"check the storage settings ({_GCS_KEYS}," in message
    assert elapsed < 15, f"took {elapsed:.1f} s"


def test_gs_warehouse_gets_the_bounded_file_io_unless_one_is_set(
    fake_gcs: FakeGcs, tmp_path: Path
) -> None:
    from icespool.iceberg import load_catalog as icespool_load_catalog

    warehouse = f"gs://{_bucket(fake_gcs)}/warehouse"
    catalog = icespool_load_catalog("lake", _sql_catalog(tmp_path, {"warehouse": warehouse}))
    assert catalog.properties["py-io-impl"] == "icespool.iceberg._timeouts.GcsBoundedFileIO"
    assert isinstance(catalog._load_file_io(location=warehouse), GcsBoundedFileIO)
    chosen = "pyiceberg.io.pyarrow.PyArrowFileIO"
    own = icespool_load_catalog(
        "lake", _sql_catalog(tmp_path, {"warehouse": warehouse, "py-io-impl": chosen})
    )
    assert own.properties["py-io-impl"] == chosen
    s3 = icespool_load_catalog("lake", _sql_catalog(tmp_path, {"warehouse": "s3://lake/w"}))
    assert "py-io-impl" not in s3.properties


def _metric(text: str, name: str, **labels: str) -> float:
    wanted = {f'{k}="{v}"' for k, v in labels.items()}
    for line in text.splitlines():
        head, _, value = line.rpartition(" ")
        metric, _, rest = head.partition("{")
        if metric == name and set(rest.rstrip("}").split(",")) == wanted:
            return float(value)
    return 0.0


async def _post(http: aiohttp.ClientSession, base: str, ids: range) -> None:
    body = "".join(json.dumps({"id": i, "v": f"v{i}"}) + "\n" for i in ids).encode()
    async with http.post(f"{base}/v1/tables/{TABLE}/records", data=body, headers=_NDJSON) as r:
        assert r.status == 200, await r.text()
        assert (await r.json())["accepted"] == len(ids)


async def _flush(http: aiohttp.ClientSession, base: str) -> tuple[int, dict[str, Any]]:
    async with http.post(f"{base}/v1/tables/{TABLE}/flush") as r:
        return r.status, json.loads(await r.text())


async def test_gcs_outage_keeps_acking_and_commits_every_id_once_when_back(
    tmp_path: Path, postgres_uri: str, make_config: MakeConfig, run_daemon: RunDaemon
) -> None:
    """The store's process stops (connections refused) and comes back with its objects
    (the filesystem backend) on the same port."""
    server = FakeGcs.start(tmp_path / "gcs-logs", root=tmp_path / "gcs-data")
    try:
        bucket = _bucket(server)
        gcs = server.catalog_properties(f"gs://{bucket}/warehouse")
        config = make_config(
            catalog={"name": CATALOG_NAME, "type": "sql", "uri": postgres_uri, **gcs},
            tables=_TABLES,
            timeouts={"storage_request": "2s"},
        )
        async with run_daemon(config) as (_, base), aiohttp.ClientSession() as http:
            await _post(http, base, range(100))
            status, answer = await _flush(http, base)
            assert (status, answer["records"]) == (200, 100), answer

            server.stop()
            for start in range(100, 700, 200):  # acks go on: they only need the spool
                await _post(http, base, range(start, start + 200))
            started = time.monotonic()
            status, answer = await _flush(http, base)
            waited = time.monotonic() - started
            assert status == 503, answer
            assert answer["error"].startswith(
                "flush of t.events failed: the object store is unavailable: CatalogError: "
                "cannot write data files for table t.events: google::cloud::Status(UNAVAILABLE: "
            ), answer
            assert "Could not connect to server" in answer["error"], answer
            # Bounded by timeouts.storage_request (2 s a call): pyarrow's default would
            # retry for 15 minutes.
            assert waited < 20, f"the failing flush took {waited:.1f} s"

            server.restart()
            status, answer = await _flush(http, base)
            assert (status, answer["records"]) == (200, 600), answer
            async with http.get(f"{base}/metrics") as r:
                metrics = await r.text()

        errors = _metric(metrics, "icespool_flush_errors_total", table=TABLE, cause="object_store")
        assert errors == 1
        assert _metric(metrics, "icespool_quarantined_segments_total") == 0
        catalog = load_catalog(CATALOG_NAME, **{"type": "sql", "uri": postgres_uri, **gcs})
        try:
            table = catalog.load_table(TABLE)
            rows = table.scan().to_arrow().to_pylist()
            files = [task.file.file_path for task in table.scan().plan_files()]
        finally:
            catalog.engine.dispose()  # type: ignore[attr-defined]
        objects = server.object_names(bucket)
    finally:
        server.stop()
    counts = Counter(row["id"] for row in rows)
    assert sorted(counts) == list(range(700))
    assert [i for i, n in counts.items() if n > 1] == []
    assert all(row["v"] == f"v{row['id']}" for row in rows)
    # Every data file is an object in the bucket.
    assert len(files) == 2
    assert all(f.removeprefix(f"gs://{bucket}/") in objects for f in files), (files, objects)
