"""Kafka security settings against a real broker: TLS (server-verified and mutual) and
SASL (SCRAM-SHA-256/512, PLAIN), through the daemon's own Kafka source.

The broker is Tansu, fronted by stunnel for TLS (tests/support/secure_broker.py
says why). Data is landed over SSL with and without a client certificate; a CA that
does not match and a missing client certificate are reported as "Kafka not
connected" while the daemon keeps serving, and fixing the config lands every record
exactly once. SASL can only be tried as a refusal here: the broker offers SCRAM but
no user can exist on it (see the support module), and it does not offer PLAIN.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from support.fixture_types import MakeConfig, RunDaemon
from support.kafka_harness import SESSION_TIMEOUT
from support.secure_broker import (
    SecureBroker,
    TlsFiles,
    client_options,
    create_topic,
    make_tls_files,
    produce_ids,
)
from support.service_helpers import table_rows, wait_rows

from daemon.config import Config
from daemon.service import Icespool

TABLE = "demo.secure"
SCHEMA = [
    {"name": "id", "type": "long", "required": True},
    {"name": "kind", "type": "string"},
]
PARTITIONS = 2
RECORDS = 3000
# A misconfigured source is watched through several failed attempts: the first and three
# reconnects after its backoff (0.5 s, 1 s, 2 s ceilings: about 2 to 4 s). Counted from its
# log, not assumed from a fixed 6 s sleep (which waited as long on an idle machine).
FAILED_ATTEMPTS = 4
WATCH_BAD_WITHIN = 60.0  # only a bound: a source that stops retrying fails the test
_UNAVAILABLE = "Kafka unavailable, retrying"


class _FailedAttempts(logging.Handler):
    """Counts the source's "Kafka unavailable, retrying" warnings: one per failed try."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if _UNAVAILABLE in record.getMessage():
            self.count += 1


@asynccontextmanager
async def _counting_failed_attempts() -> AsyncIterator[_FailedAttempts]:
    logger = logging.getLogger("icespool.kafka")
    handler = _FailedAttempts()
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory: pytest.TempPathFactory, tls: TlsFiles) -> Iterator[SecureBroker]:
    """Tansu behind stunnel: TLS with the test CA's server certificate."""
    broker = SecureBroker.start(tmp_path_factory.mktemp("tls-broker"), tls=tls)
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    """Tansu that requires SASL (it offers SCRAM-SHA-256/512; no user can exist)."""
    broker = SecureBroker.start(tmp_path_factory.mktemp("sasl-broker"), authentication=True)
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="module")
def sasl_ssl_broker(
    tmp_path_factory: pytest.TempPathFactory, tls: TlsFiles
) -> Iterator[SecureBroker]:
    """Tansu that requires SASL, behind stunnel (TLS with the test CA)."""
    broker = SecureBroker.start(
        tmp_path_factory.mktemp("sasl-ssl-broker"), tls=tls, authentication=True
    )
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="module")
def mtls_broker(tmp_path_factory: pytest.TempPathFactory, tls: TlsFiles) -> Iterator[SecureBroker]:
    """Tansu behind stunnel that requires a client certificate signed by the test CA."""
    broker = SecureBroker.start(
        tmp_path_factory.mktemp("mtls-broker"), tls=tls, require_client_cert=True
    )
    try:
        yield broker
    finally:
        broker.stop()


def _config(make_config: MakeConfig, broker: SecureBroker, topic: str, **security: Any) -> Config:
    return make_config(
        tables=[{"name": TABLE, "create": True, "schema": SCHEMA}],
        defaults={"batch_timeout": "1s"},
        kafka=[
            {
                "bootstrap_servers": broker.bootstrap,
                "topics": [topic],
                "group_id": f"g-{topic}",
                "session_timeout": SESSION_TIMEOUT,
                "table": TABLE,
                "offset_commit_interval": "1s",
                **security,
            }
        ],
    )


def _ssl(tls: TlsFiles, *, cafile: Path | None = None, client_cert: bool = False) -> dict[str, Any]:
    options: dict[str, Any] = {"security_protocol": "SSL", "ssl_cafile": str(cafile or tls.ca)}
    if client_cert:
        options |= {
            "ssl_certfile": str(tls.client_cert),
            "ssl_keyfile": str(tls.client_key),
            "ssl_password": tls.client_key_password,
        }
    return options


async def _produce(broker: SecureBroker, tls: TlsFiles, topic: str, *, mtls: bool) -> list[int]:
    options = client_options(tls, client_cert=mtls)
    await create_topic(broker.bootstrap, topic, PARTITIONS, **options)
    ids = list(range(RECORDS))
    assert await produce_ids(broker.bootstrap, topic, ids, PARTITIONS, **options) == RECORDS
    return ids


async def _landed_ids(service: Icespool, count: int) -> list[int]:
    """The table's ids once it has ``count`` rows and nothing more arrives."""
    await wait_rows(service, TABLE, count)
    await asyncio.sleep(2.0)  # batch_timeout 1s: a duplicate would have landed by now
    return sorted(r["id"] for r in await asyncio.to_thread(table_rows, service, TABLE))


async def _wait_connected(service: Icespool, within: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + within
    source = service.status()["kafka"]["sources"][0]
    while time.monotonic() < deadline and not source["connected"]:
        await asyncio.sleep(0.2)
        source = service.status()["kafka"]["sources"][0]
    assert source["connected"] is True, source
    return source


@asynccontextmanager
async def _refused(
    run_daemon: RunDaemon, config: Config, last_error: str
) -> AsyncIterator[tuple[Icespool, str]]:
    """Run the daemon with a source the broker (or its TLS endpoint) refuses, and
    check what it tells: not connected, ``last_error`` (a regular expression matching
    the whole reason), /readyz 503 naming Kafka, the HTTP API still serving, the
    source still retrying, nothing written."""
    async with (
        _counting_failed_attempts() as failed,
        run_daemon(config) as (service, url),
        aiohttp.ClientSession() as http,
    ):
        deadline = time.monotonic() + WATCH_BAD_WITHIN
        while failed.count < FAILED_ATTEMPTS:
            assert time.monotonic() < deadline, f"{failed.count} failed attempts"
            await asyncio.sleep(0.05)
        assert service._sources[0]._task is not None
        assert not service._sources[0]._task.done(), "the Kafka source task ended"
        async with http.get(f"{url}/v1/status") as response:
            assert response.status == 200
            source = (await response.json())["kafka"]["sources"][0]
        assert source["connected"] is False, source
        assert source["assignments"] == [], source
        assert re.fullmatch(last_error, source["last_error"] or ""), source
        assert service.not_ready_reason() == (
            "Kafka not connected (kafka[0]); retrying with backoff"
        ), service.not_ready_reason()
        async with http.get(f"{url}/readyz") as response:
            assert response.status == 503
            assert "Kafka not connected" in await response.text()
        async with http.get(f"{url}/healthz") as response:
            assert response.status == 200
        assert await asyncio.to_thread(table_rows, service, TABLE) == []
        yield service, url


# ------------------------------------------------------------------ TLS


async def test_ssl_with_the_brokers_ca_lands_every_record_exactly_once(
    make_config: MakeConfig, tls_broker: SecureBroker, tls: TlsFiles
) -> None:
    ids = await _produce(tls_broker, tls, "tls-ok", mtls=False)
    config = _config(make_config, tls_broker, "tls-ok", **_ssl(tls))
    async with Icespool(config) as service:
        assert await _landed_ids(service, RECORDS) == ids
        source = await _wait_connected(service)
        assert source["last_error"] is None
        assert sorted((a["partition"], a["position"]) for a in source["assignments"]) == [
            (0, RECORDS // PARTITIONS),
            (1, RECORDS // PARTITIONS),
        ]


async def test_mutual_tls_with_an_encrypted_client_key_lands_every_record_exactly_once(
    make_config: MakeConfig, mtls_broker: SecureBroker, tls: TlsFiles
) -> None:
    ids = await _produce(mtls_broker, tls, "mtls-ok", mtls=True)
    config = _config(make_config, mtls_broker, "mtls-ok", **_ssl(tls, client_cert=True))
    async with Icespool(config) as service:
        assert await _landed_ids(service, RECORDS) == ids
        assert (await _wait_connected(service))["last_error"] is None


async def test_a_ca_that_does_not_match_is_reported_and_the_fixed_config_loses_nothing(
    make_config: MakeConfig, run_daemon: RunDaemon, tls_broker: SecureBroker, tls: TlsFiles
) -> None:
    ids = await _produce(tls_broker, tls, "tls-bad-ca", mtls=False)
    bad = _config(make_config, tls_broker, "tls-bad-ca", **_ssl(tls, cafile=tls.other_ca))
    reason = re.escape(
        f"cannot connect to Kafka ({tls_broker.bootstrap}: SSLCertVerificationError: "
        "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: "
        "unable to get local issuer certificate"
    )
    async with _refused(run_daemon, bad, rf"{reason} \(_ssl\.c:\d+\)\)"):
        pass
    # Same spool, catalog and group: the fixed config picks up every record once.
    good = _config(make_config, tls_broker, "tls-bad-ca", **_ssl(tls))
    async with Icespool(good) as service:
        assert await _landed_ids(service, RECORDS) == ids


async def test_a_missing_client_certificate_is_reported_and_the_fixed_config_loses_nothing(
    make_config: MakeConfig, run_daemon: RunDaemon, mtls_broker: SecureBroker, tls: TlsFiles
) -> None:
    ids = await _produce(mtls_broker, tls, "mtls-no-cert", mtls=True)
    bad = _config(make_config, mtls_broker, "mtls-no-cert", **_ssl(tls))
    # TLS 1.3: the client's handshake completes before the server checks for its
    # certificate; the refusal comes as an alert, which aiokafka sees as a close.
    closed = f"KafkaConnectionError: Connection at {mtls_broker.bootstrap} closed"
    reason = f"cannot connect to Kafka ({mtls_broker.bootstrap}: KafkaConnectionError: {closed})"
    async with _refused(run_daemon, bad, re.escape(reason)):
        pass
    good = _config(make_config, mtls_broker, "mtls-no-cert", **_ssl(tls, client_cert=True))
    async with Icespool(good) as service:
        assert await _landed_ids(service, RECORDS) == ids


# ------------------------------------------------------------------ SASL


@pytest.mark.parametrize(
    ("protocol", "mechanism"),
    [
        ("SASL_PLAINTEXT", "SCRAM-SHA-256"),
        ("SASL_PLAINTEXT", "SCRAM-SHA-512"),
        ("SASL_PLAINTEXT", "PLAIN"),
        ("SASL_SSL", "SCRAM-SHA-512"),
    ],
)
async def test_a_refused_sasl_login_is_reported_and_the_daemon_stays_up(
    make_config: MakeConfig,
    run_daemon: RunDaemon,
    sasl_broker: SecureBroker,
    sasl_ssl_broker: SecureBroker,
    tls: TlsFiles,
    protocol: str,
    mechanism: str,
) -> None:
    broker = sasl_ssl_broker if protocol == "SASL_SSL" else sasl_broker
    security: dict[str, Any] = {
        "security_protocol": protocol,
        "sasl_mechanism": mechanism,
        "sasl_plain_username": "icespool",
        "sasl_plain_password": "wrong-password",
    }
    if protocol == "SASL_SSL":
        security["ssl_cafile"] = str(tls.ca)
    config = _config(make_config, broker, f"sasl-{mechanism.lower()}", **security)
    if mechanism == "PLAIN":
        # Tansu does not offer PLAIN: it closes the connection at the SASL handshake
        # instead of answering UNSUPPORTED_SASL_MECHANISM, so only the close is seen.
        closed = f"KafkaConnectionError: Connection at {broker.bootstrap} closed"
        reason = f"cannot connect to Kafka ({broker.bootstrap}: KafkaConnectionError: {closed})"
    else:
        # The broker answers the SCRAM exchange with RFC 5802's e=unknown-user.
        reason = (
            f"SASL {mechanism} login refused by the broker for user 'icespool' (e=unknown-user)"
        )
    async with _refused(run_daemon, config, re.escape(reason)):
        pass
