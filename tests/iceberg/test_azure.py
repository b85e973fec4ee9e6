"""Azure Blob storage for real: the daemon writes, commits and reads back a table kept in
Azurite (the Azure Blob emulator, npm ``azurite``, started on 127.0.0.1 by the fixture).

Two ways pyiceberg 0.12 reaches Azure, both through the table's own FileIO:

- adlfs (``icespool[azure]``, pyiceberg's default for ``abfs``/``wasb`` when installed): the
  canonical ``abfs[s]://container@account.dfs.core.windows.net/path`` locations, the form
  Spark and Iceberg Java write. A real ``icespool run`` child reads the account's
  connection string from ``ICESPOOL__CATALOG__ADLS__CONNECTION-STRING``, as a Kubernetes
  Secret supplies it.
- pyarrow's AzureFileSystem (``py-io-impl``): only the container form
  ``abfs://container/path``; ``adls.blob-storage-authority`` points it at the emulator.

The catalog is SQLite (metadata); every data, manifest and metadata file is in Azurite.
"""

from __future__ import annotations

import signal
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from pyiceberg.catalog import load_catalog
from support.daemon_harness import CATALOG_NAME, TABLE, Daemon, DaemonDir
from support.emulators import AZURITE_ACCOUNT, AZURITE_KEY, Azurite
from support.fixture_types import MakeConfig, RunDaemon
from support.service_helpers import metric
from support.store_config import write_store_config

from icespool.cli import main
from icespool.errors import CatalogError
from icespool.iceberg import load_catalog as icespool_load_catalog
from icespool.write.flush import SEGMENT_ATTEMPTS

_TIMEOUT = aiohttp.ClientTimeout(total=60)
_SCHEMA = [{"name": "id", "type": "long", "required": True}, {"name": "v", "type": "string"}]


@pytest.fixture(scope="module")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    server = Azurite.start(tmp_path_factory.mktemp("azurite"))
    try:
        yield server
    finally:
        server.stop()


def _records(ids: range) -> list[dict[str, Any]]:
    return [{"id": i, "v": f"azure-{i}"} for i in ids]


def _assert_every_id_once(rows: list[dict[str, Any]], expected: range) -> None:
    counts = Counter(row["id"] for row in rows)
    assert sorted(counts) == list(expected), "ids missing or unexpected"
    assert [i for i, n in counts.items() if n > 1] == [], "ids committed twice"
    assert all(row["v"] == f"azure-{row['id']}" for row in rows)


def _read_back(properties: dict[str, str]) -> tuple[list[dict[str, Any]], list[str]]:
    """Rows of the table and the paths of its data files, read through pyiceberg alone."""
    catalog = load_catalog(CATALOG_NAME, **properties)
    try:
        table = catalog.load_table(TABLE)
        rows = table.scan().to_arrow().to_pylist()
        files = [task.file.file_path for task in table.scan().plan_files()]
    finally:
        engine = getattr(catalog, "engine", None)
        if engine is not None:
            engine.dispose()
    return rows, files


async def test_daemon_commits_to_canonical_abfs_locations_through_adlfs(
    azurite: Azurite,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    container = "lake-adlfs"
    azurite.create_container(container)
    warehouse = f"abfs://{container}@{AZURITE_ACCOUNT}.dfs.core.windows.net/warehouse"
    home = DaemonDir(tmp_path)
    catalog = {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path / 'catalog.db'}",
        "warehouse": warehouse,
        "adls.account-name": AZURITE_ACCOUNT,
    }
    write_store_config(home, catalog)
    env = {"ICESPOOL__CATALOG__ADLS__CONNECTION-STRING": azurite.connection_string}

    # check-config --connect, in this process (the secret from the environment, as the
    # daemon gets it).
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["check-config", "--connect", "--config", str(home.config_path)]) == 0
    printed = capsys.readouterr()
    # The SQLite catalog does not exist before the daemon's first start: checked as the
    # empty catalog it would be, the check creating nothing.
    assert "catalog 'lake' (sql): the SQLite database" in printed.out + printed.err
    assert "does not exist yet" in printed.out + printed.err
    assert not (tmp_path / "catalog.db").exists()
    # The account key is part of the connection string: never printed.
    assert AZURITE_KEY not in printed.out + printed.err

    daemon = Daemon(home)
    daemon.start(env=env)
    try:
        await daemon.wait_ready()
        async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
            for start in range(0, 1500, 500):
                await daemon.ingest(session, _records(range(start, start + 500)))
                await daemon.flush(session)
        daemon.signal(signal.SIGTERM)
        assert await daemon.wait_exit(30) == 0, daemon.tail()
    finally:
        daemon.cleanup()
    assert AZURITE_KEY not in daemon.all_logs()

    rows, files = _read_back({**catalog, "adls.connection-string": azurite.connection_string})
    _assert_every_id_once(rows, range(1500))
    assert len(files) == 3
    assert all(path.startswith(f"{warehouse}/t/events/data/") for path in files), files
    blobs = azurite.blob_names(container)
    for path in files:
        assert path.removeprefix(f"abfs://{container}@{AZURITE_ACCOUNT}.dfs.core.windows.net/") in (
            blobs
        )
    assert sum(name.endswith(".metadata.json") for name in blobs) >= 4  # create + 3 commits


def _pyarrow_catalog(azurite: Azurite, container: str) -> dict[str, str]:
    return {
        "warehouse": f"abfs://{container}/warehouse",
        "py-io-impl": "pyiceberg.io.pyarrow.PyArrowFileIO",
        "adls.account-name": AZURITE_ACCOUNT,
        "adls.account-key": AZURITE_KEY,
        "adls.blob-storage-authority": f"127.0.0.1:{azurite.port}",
        "adls.blob-storage-scheme": "http",
        "adls.dfs-storage-authority": f"127.0.0.1:{azurite.port}",
        "adls.dfs-storage-scheme": "http",
    }


def _pyarrow_wasbs_catalog(azurite: Azurite, container: str) -> dict[str, str]:
    return {
        **_pyarrow_catalog(azurite, container),
        "warehouse": f"wasbs://{container}/warehouse",
    }


@pytest.mark.parametrize(
    ("container", "store", "prefix"),
    [
        ("lake-pyarrow", _pyarrow_catalog, "abfs://lake-pyarrow/"),
        ("lake-wasbs", _pyarrow_wasbs_catalog, "wasbs://lake-wasbs/"),
    ],
    ids=["pyarrow-abfs", "pyarrow-wasbs"],
)
async def test_daemon_commits_to_container_locations_through_pyarrow(
    azurite: Azurite,
    make_config: MakeConfig,
    run_daemon: RunDaemon,
    tmp_path: Path,
    container: str,
    store: Callable[[Azurite, str], dict[str, str]],
    prefix: str,
) -> None:
    azurite.create_container(container)
    catalog = {
        "name": CATALOG_NAME,
        "type": "sql",
        "uri": f"sqlite:///{tmp_path / 'catalog.db'}",
        **store(azurite, container),
    }
    config = make_config(
        catalog=catalog, tables=[{"name": TABLE, "create": True, "schema": _SCHEMA}]
    )
    async with (
        run_daemon(config) as (_, base_url),
        aiohttp.ClientSession(timeout=_TIMEOUT) as session,
    ):
        for start in (0, 700):
            async with session.post(
                f"{base_url}/v1/tables/{TABLE}/records",
                json=_records(range(start, start + 700)),
            ) as resp:
                assert resp.status == 200, await resp.text()
            async with session.post(f"{base_url}/v1/tables/{TABLE}/flush") as resp:
                assert resp.status == 200, await resp.text()

    properties = {k: v for k, v in catalog.items() if k != "name"}
    rows, files = _read_back(properties)
    _assert_every_id_once(rows, range(1400))
    assert len(files) == 2
    assert all(path.startswith(f"{prefix}warehouse/t/events/data/") for path in files), files
    blobs = azurite.blob_names(container)
    assert all(path.removeprefix(prefix) in blobs for path in files), files


def test_canonical_abfs_warehouse_without_adlfs_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A None entry makes the import system report adlfs as not installed.
    monkeypatch.setitem(sys.modules, "adlfs", None)
    props = {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path / 'catalog.db'}",
        "warehouse": "abfss://lake@account.dfs.core.windows.net/warehouse",
    }
    with pytest.raises(CatalogError) as refused:
        icespool_load_catalog("lake", props)
    message = str(refused.value)
    assert "abfss://lake@account.dfs.core.windows.net/warehouse" in message
    assert "pip install 'icespool[azure]'" in message
    assert "abfs://container/path" in message


async def test_a_failing_azure_store_keeps_the_records_and_commits_them_once_it_recovers(
    azurite: Azurite, make_config: MakeConfig, run_daemon: RunDaemon, tmp_path: Path
) -> None:
    """Data files go to a container that does not exist yet (``write.data.path``): every
    upload fails with Azure's 404 (adlfs wraps it in a RuntimeError). That is the store's
    fault, not the rows': more failed flushes than a segment's own faults are allowed
    quarantine nothing, and once the container exists the next flush commits every id once.
    """
    metadata, data = "lake-meta", "lake-data"
    azurite.create_container(metadata)
    account = f"{AZURITE_ACCOUNT}.dfs.core.windows.net"
    catalog = {
        "name": CATALOG_NAME,
        "type": "sql",
        "uri": f"sqlite:///{tmp_path / 'catalog.db'}",
        "warehouse": f"abfs://{metadata}@{account}/warehouse",
        "adls.account-name": AZURITE_ACCOUNT,
        "adls.connection-string": azurite.connection_string,
    }
    table = {
        "name": TABLE,
        "create": True,
        "schema": _SCHEMA,
        "properties": {"write.data.path": f"abfs://{data}@{account}/data"},
    }
    config = make_config(catalog=catalog, tables=[table])
    async with (
        run_daemon(config) as (service, base_url),
        aiohttp.ClientSession(timeout=_TIMEOUT) as session,
    ):
        async with session.post(
            f"{base_url}/v1/tables/{TABLE}/records", json=_records(range(600))
        ) as resp:
            assert resp.status == 200, await resp.text()
        for _ in range(SEGMENT_ATTEMPTS + 1):
            async with session.post(f"{base_url}/v1/tables/{TABLE}/flush") as resp:
                text = await resp.text()
                assert resp.status == 503, text
                assert "the spool keeps every record" in text
                assert "the object store is unavailable" in text, text
                assert "The specified container does not exist" in text
        assert metric(service, "icespool_quarantined_segments_total") == 0
        assert list(config.spool.dir.glob("quarantine/*")) == []

        azurite.create_container(data)
        async with session.post(f"{base_url}/v1/tables/{TABLE}/flush") as resp:
            assert resp.status == 200, await resp.text()

    properties = {k: v for k, v in catalog.items() if k != "name"}
    rows, files = _read_back(properties)
    _assert_every_id_once(rows, range(600))
    assert all(path.startswith(f"abfs://{data}@{account}/data/") for path in files), files


def test_canonical_wasbs_warehouse_is_refused_with_the_abfss_spelling(tmp_path: Path) -> None:
    props = {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path / 'catalog.db'}",
        "warehouse": "wasbs://lake@account.blob.core.windows.net/warehouse",
    }
    with pytest.raises(CatalogError) as refused:
        icespool_load_catalog("lake", props)
    assert str(refused.value) == (
        "catalog.warehouse 'wasbs://lake@account.blob.core.windows.net/warehouse': pyiceberg "
        "0.12 writes no wasbs://container@account location; use "
        "'abfss://lake@account.dfs.core.windows.net/warehouse' (the same storage account, "
        "through adlfs)"
    )
