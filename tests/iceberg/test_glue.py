"""AWS Glue as the catalog, for real: moto in server mode (PyPI ``moto[server]``) serves the
Glue and S3 APIs on 127.0.0.1; a real ``icespool run`` child configured with
``[catalog] type = "glue"`` (endpoint, region, keys; the secret keys from ``ICESPOOL__``
variables) writes the data files to moto's S3, commits through Glue, and pyiceberg's own
Glue catalog reads every id back exactly once. ``icespool check-config --connect`` is
run against the same server.
"""

from __future__ import annotations

import signal
import socket
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from pyiceberg.catalog import load_catalog
from support.daemon_harness import CATALOG_NAME, TABLE, Daemon, DaemonDir
from support.emulators import MotoServer
from support.store_config import write_store_config

from icespool.cli import main
from icespool.config import TimeoutsConfig, load_config, validate_config
from icespool.errors import ConfigError
from icespool.iceberg import check_catalog, unavailable
from icespool.iceberg import load_catalog as icespool_load_catalog

_TIMEOUT = aiohttp.ClientTimeout(total=60)
_BUCKET = "lake"


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    server = MotoServer.start(tmp_path_factory.mktemp("moto"))
    try:
        server.client("s3").create_bucket(Bucket=_BUCKET)  # type: ignore[attr-defined]
        yield server
    finally:
        server.stop()


def _catalog(moto: MotoServer) -> dict[str, str | int]:
    """The [catalog] a user writes for Glue + S3, secrets left to the environment."""
    return {
        "type": "glue",
        "warehouse": f"s3://{_BUCKET}/warehouse",
        "glue.endpoint": moto.endpoint,
        "glue.region": moto.region,
        "glue.access-key-id": moto.access_key,
        "glue.max-retries": 2,
        "s3.endpoint": moto.endpoint,
        "s3.region": moto.region,
        "s3.access-key-id": moto.access_key,
    }


def _secrets(moto: MotoServer) -> dict[str, str]:
    return {
        "ICESPOOL__CATALOG__GLUE__SECRET-ACCESS-KEY": moto.secret_key,
        "ICESPOOL__CATALOG__S3__SECRET-ACCESS-KEY": moto.secret_key,
    }


async def test_daemon_commits_through_glue_to_s3_and_reads_back(
    moto: MotoServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    home = DaemonDir(tmp_path)
    catalog = _catalog(moto)
    write_store_config(home, catalog)

    # check-config --connect (in this process; the secrets from the environment).
    for name, value in _secrets(moto).items():
        monkeypatch.setenv(name, value)
    assert main(["check-config", "--connect", "--config", str(home.config_path)]) == 0
    printed = capsys.readouterr()
    output = printed.out + printed.err
    assert "catalog 'lake' (glue) is reachable" in output
    assert "table t.events: missing, created at start (create = true)" in output
    assert moto.secret_key not in output

    daemon = Daemon(home)
    daemon.start(env=_secrets(moto))
    try:
        await daemon.wait_ready()
        async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
            for start in range(0, 1200, 400):
                records = [{"id": i, "v": f"glue-{i}"} for i in range(start, start + 400)]
                await daemon.ingest(session, records)
                await daemon.flush(session)
        daemon.signal(signal.SIGTERM)
        assert await daemon.wait_exit(30) == 0, daemon.tail()
    finally:
        daemon.cleanup()
    assert moto.secret_key not in daemon.all_logs()

    # What check-config --connect runs, in this process (a second CLI start costs 3 s).
    config = load_config(home.config_path, env=_secrets(moto))
    assert check_catalog(config) == [
        "catalog 'lake' (glue) is reachable: 1 namespaces",
        "table t.events: exists",
        "storage (table events): wrote, listed and deleted a probe object under "
        "s3://lake/warehouse/t.db/events/data",
    ]

    # Read back with pyiceberg's Glue catalog alone (not the daemon's loading code).
    reader = load_catalog(
        CATALOG_NAME,
        **catalog,  # type: ignore[arg-type]  # glue.max-retries stays an int here
        **{"glue.secret-access-key": moto.secret_key, "s3.secret-access-key": moto.secret_key},
    )
    table = reader.load_table(TABLE)
    rows: list[dict[str, Any]] = table.scan().to_arrow().to_pylist()
    counts = Counter(row["id"] for row in rows)
    assert sorted(counts) == list(range(1200))
    assert [i for i, n in counts.items() if n > 1] == []
    assert all(row["v"] == f"glue-{row['id']}" for row in rows)
    assert len(table.history()) == 3

    # Glue holds the pointer to the current metadata file; S3 holds every file.
    glue_table = moto.client("glue").get_table(DatabaseName="t", Name="events")  # type: ignore[attr-defined]
    pointer = glue_table["Table"]["Parameters"]["metadata_location"]
    assert pointer == table.metadata_location
    assert pointer.startswith(f"s3://{_BUCKET}/warehouse/t.db/events/metadata/")
    listed = moto.client("s3").list_objects_v2(Bucket=_BUCKET, Prefix="warehouse/t.db/events/")  # type: ignore[attr-defined]
    keys = {item["Key"] for item in listed["Contents"]}
    data_files = [task.file.file_path for task in table.scan().plan_files()]
    assert len(data_files) == 3
    assert {path.removeprefix(f"s3://{_BUCKET}/") for path in data_files} <= keys


def test_glue_client_gets_the_configured_timeouts_and_an_integer_retry_count() -> None:
    """pyiceberg hands glue.max-retries to botocore as it gets it; from TOML that is text,
    which botocore compares with an int at the first call. And no call waits longer than
    [timeouts] (botocore's own defaults are 60 s)."""
    timeouts = TimeoutsConfig.model_validate({"catalog_connect": "3s", "catalog_request": "7s"})
    props = {
        "type": "glue",
        "glue.region": "us-east-1",
        "glue.endpoint": "http://127.0.0.1:9",
        "glue.max-retries": "4",
        "glue.access-key-id": "k",
        "glue.secret-access-key": "s",
    }
    catalog = icespool_load_catalog("lake", props, timeouts)
    client_config = catalog.glue.meta.config  # type: ignore[attr-defined]
    assert client_config.connect_timeout == 3
    assert client_config.read_timeout == 7
    assert client_config.retries["total_max_attempts"] == 5  # 4 retries + the first call


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("glue.max-retries", "many", "glue.max-retries must be a whole number >= 0, got 'many'"),
        ("glue.retry-mode", "eager", "glue.retry-mode must be one of legacy, standard, adaptive"),
    ],
)
def test_bad_glue_values_are_config_errors_naming_the_key(
    key: str, value: str, expected: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        validate_config({"catalog": {"type": "glue", key: value}})
    assert refused.value.key == f"catalog.{key}"
    assert expected in str(refused.value)


def test_an_unreachable_glue_endpoint_is_a_catalog_outage() -> None:
    """What /readyz and the HTTP 503s call it: the catalog, not a bug (botocore's own
    exception types are not the builtin ConnectionError)."""
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    props = {
        "type": "glue",
        "glue.region": "us-east-1",
        "glue.endpoint": f"http://127.0.0.1:{port}",
        "glue.max-retries": "0",
        "glue.access-key-id": "k",
        "glue.secret-access-key": "s",
    }
    catalog = icespool_load_catalog("lake", props)
    with pytest.raises(Exception) as failed:  # noqa: PT011 - botocore's type, checked below
        catalog.list_namespaces()
    assert type(failed.value).__name__ == "EndpointConnectionError"
    assert unavailable(failed.value) == "the catalog"
