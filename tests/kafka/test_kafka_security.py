"""Kafka security settings against a real broker: TLS (server-verified and mutual) and
SASL inside TLS, through the daemon's own Kafka source.

The broker is the worker's Apache Kafka (support/apache_kafka.py), whose SSL, mutual-TLS
and SASL_SSL listeners use the test CA. Data is landed over SSL with and without a
client certificate; a CA that does not match, a missing client certificate and a
refused SASL_SSL login are reported as "Kafka not connected" while the daemon keeps
serving, and fixing the config lands every record exactly once. SASL_PLAINTEXT with
each mechanism (a wrong password, then every record landed) is in test_apache_kafka.py.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from support.apache_kafka import SCRAM_USERS, KafkaBroker
from support.fixture_types import MakeConfig, RunDaemon
from support.kafka_harness import SESSION_TIMEOUT, create_topic, produce, unique_name
from support.kafka_tls import TlsFiles, client_options
from support.service_helpers import table_rows, wait_rows

from icespool.config import Config
from icespool.lifecycle.service import Icespool

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


@pytest.fixture
def tls(apache_kafka: KafkaBroker) -> TlsFiles:
    """The test CA and certificates the broker's TLS listeners use."""
    return apache_kafka.tls


def _config(make_config: MakeConfig, bootstrap: str, topic: str, **security: Any) -> Config:
    return make_config(
        tables=[{"name": TABLE, "create": True, "schema": SCHEMA}],
        defaults={"batch_timeout": "1s"},
        kafka=[
            {
                "bootstrap_servers": bootstrap,
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


async def _produce(bootstrap: str, tls: TlsFiles, topic: str, *, mtls: bool) -> list[int]:
    options = client_options(tls, client_cert=mtls)
    await create_topic(bootstrap, topic, PARTITIONS, **options)
    ids = list(range(RECORDS))
    records = [{"id": i, "kind": "secure"} for i in ids]
    assert await produce(bootstrap, topic, records, partitions=PARTITIONS, **options) == RECORDS
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
    make_config: MakeConfig, apache_kafka: KafkaBroker, tls: TlsFiles
) -> None:
    topic = unique_name("tls-ok")
    ids = await _produce(apache_kafka.ssl, tls, topic, mtls=False)
    config = _config(make_config, apache_kafka.ssl, topic, **_ssl(tls))
    async with Icespool(config) as service:
        assert await _landed_ids(service, RECORDS) == ids
        source = await _wait_connected(service)
        assert source["last_error"] is None
        assert sorted((a["partition"], a["position"]) for a in source["assignments"]) == [
            (0, RECORDS // PARTITIONS),
            (1, RECORDS // PARTITIONS),
        ]


async def test_mutual_tls_with_an_encrypted_client_key_lands_every_record_exactly_once(
    make_config: MakeConfig, apache_kafka: KafkaBroker, tls: TlsFiles
) -> None:
    topic = unique_name("mtls-ok")
    ids = await _produce(apache_kafka.mtls, tls, topic, mtls=True)
    config = _config(make_config, apache_kafka.mtls, topic, **_ssl(tls, client_cert=True))
    async with Icespool(config) as service:
        assert await _landed_ids(service, RECORDS) == ids
        assert (await _wait_connected(service))["last_error"] is None


async def test_a_ca_that_does_not_match_is_reported_and_the_fixed_config_loses_nothing(
    make_config: MakeConfig, run_daemon: RunDaemon, apache_kafka: KafkaBroker, tls: TlsFiles
) -> None:
    bootstrap, topic = apache_kafka.ssl, unique_name("tls-bad-ca")
    ids = await _produce(bootstrap, tls, topic, mtls=False)
    bad = _config(make_config, bootstrap, topic, **_ssl(tls, cafile=tls.other_ca))
    reason = re.escape(
        f"cannot connect to Kafka ({bootstrap}: SSLCertVerificationError: "
        "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: "
        "unable to get local issuer certificate"
    )
    async with _refused(run_daemon, bad, rf"{reason} \(_ssl\.c:\d+\)\)"):
        pass
    # Same spool, catalog and group: the fixed config picks up every record once.
    good = _config(make_config, bootstrap, topic, **_ssl(tls))
    async with Icespool(good) as service:
        assert await _landed_ids(service, RECORDS) == ids


async def test_a_missing_client_certificate_is_reported_and_the_fixed_config_loses_nothing(
    make_config: MakeConfig, run_daemon: RunDaemon, apache_kafka: KafkaBroker, tls: TlsFiles
) -> None:
    bootstrap, topic = apache_kafka.mtls, unique_name("mtls-no-cert")
    ids = await _produce(bootstrap, tls, topic, mtls=True)
    bad = _config(make_config, bootstrap, topic, **_ssl(tls))
    # TLS 1.3: the client's handshake completes before the server checks for its
    # certificate; the refusal comes as an alert, which aiokafka sees as a close.
    closed = f"KafkaConnectionError: Connection at {bootstrap} closed"
    reason = f"cannot connect to Kafka ({bootstrap}: KafkaConnectionError: {closed})"
    async with _refused(run_daemon, bad, re.escape(reason)):
        pass
    good = _config(make_config, bootstrap, topic, **_ssl(tls, client_cert=True))
    async with Icespool(good) as service:
        assert await _landed_ids(service, RECORDS) == ids


# ------------------------------------------------------------------ SASL inside TLS


async def test_a_refused_sasl_ssl_login_is_reported_and_the_right_one_loses_nothing(
    make_config: MakeConfig, run_daemon: RunDaemon, apache_kafka: KafkaBroker, tls: TlsFiles
) -> None:
    bootstrap, topic = apache_kafka.sasl_ssl, unique_name("sasl-ssl")
    security: dict[str, Any] = {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "alice",
        "ssl_cafile": str(tls.ca),
    }
    right = {**security, "sasl_plain_password": SCRAM_USERS["alice"]}
    options = {**client_options(tls, protocol="SASL_SSL"), **right}
    options.pop("ssl_cafile")
    await create_topic(bootstrap, topic, PARTITIONS, **options)
    records = [{"id": i, "kind": "secure"} for i in range(RECORDS)]
    assert await produce(bootstrap, topic, records, partitions=PARTITIONS, **options) == RECORDS
    bad = _config(make_config, bootstrap, topic, **security, sasl_plain_password="wrong")
    reason = (
        f"cannot connect to Kafka ({bootstrap}: SaslAuthenticationFailed: [Error 58] "
        "SaslAuthenticationFailed: Authentication failed during authentication due to "
        "invalid credentials with SASL mechanism SCRAM-SHA-512)"
    )
    async with _refused(run_daemon, bad, re.escape(reason)):
        pass
    async with Icespool(_config(make_config, bootstrap, topic, **right)) as service:
        assert await _landed_ids(service, RECORDS) == list(range(RECORDS))
