"""Shared fixtures: a config in a temp dir, and a real daemon (service + HTTP) on a free port."""

from __future__ import annotations

import copy
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from support.apache_kafka import KafkaBroker
from support.apicurio import ApicurioRegistry
from support.debezium import DebeziumPostgres
from support.fixture_types import MakeConfig, RunDaemon
from support.gcs import FakeGcs
from support.hive_metastore import HiveMetastore
from support.iceberg_rest import IcebergRest
from support.object_store import SeaweedFS
from support.postgres import scratch_database, sqlalchemy_uri
from support.proxy import TcpProxy

from icespool.config import Config, embedded_default, validate_config
from icespool.http import start_http
from icespool.lifecycle.service import Icespool

# A suite started as a background job of a non-interactive shell inherits SIGINT ignored,
# and every child would too: the CLI tests that end `--watch` or a daemon with Ctrl-C
# would wait for a process that never hears it. A handled signal is back to its default
# in a child after exec.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# No per-example deadline (hypothesis's default is 200 ms): the suite runs on two xdist
# workers beside daemons, brokers and JVMs, where an example's wall time says nothing about
# the code under test. What a property proves does not depend on it.
settings.register_profile("icespool", deadline=None)
settings.load_profile("icespool")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` groups the Spark tests onto one worker (support/xdist_groups.py
    says why the xdist_group mark cannot); other modes keep xdist's own scheduler."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from support.xdist_groups import DirectoryGroupScheduling

    return DirectoryGroupScheduling(config, log)


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


@pytest.fixture
def make_config(tmp_path: Path) -> MakeConfig:
    """``make_config(tables=[...], defaults={...}, ...)``: the embedded default under
    ``tmp_path`` with sections merged in (lists such as ``tables`` are replaced)."""

    def build(**sections: Any) -> Config:
        raw = embedded_default(tmp_path / "icespool-data")
        raw["encode"] = {"workers": 2}  # the default (2 x cores) only adds idle tasks here
        raw["http"] = {"listen": "127.0.0.1:0"}
        return validate_config(_merge(raw, sections))

    return build


@pytest.fixture
def run_daemon(make_config: MakeConfig) -> RunDaemon:
    """``async with run_daemon(config=None, auth_token=None, max_body_bytes=None) as
    (service, base_url)``: a started `Icespool` behind `start_http` on a free port."""

    @asynccontextmanager
    async def run(
        config: Config | None = None,
        *,
        auth_token: str | None = None,
        max_body_bytes: int | None = None,
        **http_options: Any,
    ) -> AsyncIterator[tuple[Icespool, str]]:
        config = config or make_config()
        service = Icespool(config)
        await service.start()
        try:
            http = await start_http(
                service,
                "127.0.0.1",
                0,
                auth_token=auth_token,
                max_body_bytes=max_body_bytes or config.http.max_body_bytes,
                **http_options,
            )
            try:
                yield service, f"http://127.0.0.1:{http.port}"
            finally:
                await http.stop()
        finally:
            await service.stop()

    return run


@pytest.fixture
async def daemon(run_daemon: RunDaemon) -> AsyncIterator[tuple[Icespool, str]]:
    """The embedded default config (table ``demo.events``), no auth."""
    async with run_daemon() as running:
        yield running


@pytest.fixture(scope="session")
def apache_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """A real Apache Kafka broker (KRaft, one JVM) once per session, i.e. per xdist worker:
    listeners for PLAINTEXT, SASL (SCRAM, PLAIN), TLS and mutual TLS (support/apache_kafka.py).
    Tests share it, so each uses topics and consumer groups of its own."""
    running = KafkaBroker.start(tmp_path_factory.mktemp("apache-kafka"))
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="session")
def broker(apache_kafka: KafkaBroker) -> KafkaBroker:
    """The tests' Kafka broker: `apache_kafka` (its PLAINTEXT listener is ``.bootstrap``).
    It outlives each test: name topics and groups with `support.kafka_harness.unique_name`."""
    return apache_kafka


@pytest.fixture(scope="session")
def schema_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApicurioRegistry]:
    """Apicurio Registry (support/apicurio.py): a real Confluent-compatible schema registry,
    one JVM per session, i.e. per xdist worker, basic auth on. Tests share it, so each
    registers under subjects of its own and uses the ids ``register`` returns."""
    running = ApicurioRegistry.start(tmp_path_factory.mktemp("apicurio"))
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="session")
def object_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    """SeaweedFS (S3 API + Iceberg REST catalog) on loopback, once per session; each test
    takes its own warehouse with ``object_store.warehouse()``."""
    store = SeaweedFS.start(tmp_path_factory.mktemp("seaweedfs"))
    try:
        yield store
    finally:
        store.stop()


@pytest.fixture(scope="session")
def iceberg_rest(
    object_store: SeaweedFS, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[IcebergRest]:
    """Apache Iceberg's reference REST catalog server (one JVM per session: a JDBC catalog
    in SQLite, its tables in a bucket of their own on `object_store`); each test empties
    it with ``iceberg_rest.warehouse()``."""
    server = IcebergRest.start(tmp_path_factory.mktemp("iceberg-rest"), object_store)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def hive_metastore(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HiveMetastore]:
    """Apache Hive's standalone metastore (one JVM per session, started by the first test
    that asks: its database on the suite's PostgreSQL, tables in a local directory); each
    test empties it with ``hive_metastore.warehouse()``."""
    server = HiveMetastore.start(tmp_path_factory.mktemp("hive-metastore"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def fake_gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeGcs]:
    """fake-gcs-server (the GCS JSON API) on loopback, in memory, once per session; each
    test creates its own bucket with ``fake_gcs.create_bucket``."""
    server = FakeGcs.start(tmp_path_factory.mktemp("fake-gcs"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_uri() -> Iterator[str]:
    """A fresh PostgreSQL database (SQLAlchemy URI) on 127.0.0.1:5432, dropped afterwards.

    One per test, never a shared one: tests on several xdist workers would otherwise race
    in it (pyiceberg creates its catalog tables in a database that lacks them, and two
    processes doing that at once collide)."""
    with scratch_database("icespool_test") as database:
        yield sqlalchemy_uri(database)


@pytest.fixture
def pg_proxy(postgres_uri: str) -> Iterator[tuple[TcpProxy, str]]:
    """`postgres_uri`'s database behind a loopback TCP proxy that refuses, goes silent or
    forwards on demand (support/proxy.py); yields (proxy, SQLAlchemy URI through it)."""
    with TcpProxy(("127.0.0.1", 5432)) as proxy:
        yield proxy, postgres_uri.replace("@127.0.0.1:5432/", f"@127.0.0.1:{proxy.port}/")


@pytest.fixture
def debezium(broker: KafkaBroker, tmp_path: Path) -> Iterator[DebeziumPostgres]:
    """A source database of this test's own in the test PostgreSQL; the test creates its
    tables there, then ``debezium.start(tables)`` runs Kafka Connect standalone with
    Debezium's PostgreSQL connector on `broker` (support/debezium.py). Afterwards the JVM
    is killed and the replication slot and database dropped."""
    source = DebeziumPostgres.create(tmp_path / "debezium", broker.bootstrap)
    try:
        yield source
    finally:
        source.stop()
