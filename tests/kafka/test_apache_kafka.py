"""A real `icespool run` child consuming from a real Apache Kafka broker (the session's
`apache_kafka`, support/apache_kafka.py) over each way a client can connect: PLAINTEXT,
SASL_PLAINTEXT with SCRAM-SHA-256, SCRAM-SHA-512 and PLAIN, TLS with the test CA, and
mutual TLS with an encrypted client key. Every test reads the table back and asserts
every produced id exactly once; a wrong SASL password is reported while the daemon keeps
serving, and the right one then lands every record.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import support.apache_kafka as apache_kafka_module
from support.apache_kafka import PLAIN_USERS, SCRAM_USERS, KafkaBroker, KafkaToolsMissing
from support.daemon_harness import TABLE, Daemon, DaemonDir
from support.kafka_harness import SESSION_TIMEOUT, create_topic, produce
from support.kafka_tls import client_options

PARTITIONS = 3
RECORDS = 3000
LAND_WITHIN = 60.0
# The SASL user of each mechanism (support/apache_kafka.py keeps SCRAM and PLAIN users
# apart, so a login proves that mechanism's own credential store answered).
USERS = {"SCRAM-SHA-256": "alice", "SCRAM-SHA-512": "bob", "PLAIN": "carol"}
PASSWORDS = {**SCRAM_USERS, **PLAIN_USERS}


def _unique(prefix: str) -> str:
    """Topics and groups of their own: the broker lives as long as the xdist worker."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _toml(options: dict[str, Any]) -> str:
    return "".join(f'{key} = "{value}"\n' for key, value in options.items())


def _kafka_section(bootstrap: str, topic: str, security: dict[str, Any]) -> str:
    return f"""
[[kafka]]
bootstrap_servers = "{bootstrap}"
group_id = "g-{topic}"
topics = ["{topic}"]
table = "{TABLE}"
offset_commit_interval = "1s"
session_timeout = "{SESSION_TIMEOUT}"
{_toml(security)}"""


def _sasl(mechanism: str, password: str) -> dict[str, Any]:
    return {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": mechanism,
        "sasl_plain_username": USERS[mechanism],
        "sasl_plain_password": password,
    }


async def _produce_ids(bootstrap: str, topic: str, **options: Any) -> list[int]:
    await create_topic(bootstrap, topic, PARTITIONS, **options)
    ids = list(range(RECORDS))
    records = [{"id": i, "v": f"r{i}"} for i in ids]
    assert await produce(bootstrap, topic, records, partitions=PARTITIONS, **options) == RECORDS
    return ids


async def _landed_ids(home: DaemonDir, daemon: Daemon) -> list[int]:
    """The table's ids once it holds ``RECORDS`` rows and nothing more arrives."""
    deadline = time.monotonic() + LAND_WITHIN
    rows: list[dict[str, Any]] = []
    while len(rows) < RECORDS:
        assert time.monotonic() < deadline, f"{len(rows)} of {RECORDS} rows\n{daemon.tail()}"
        await asyncio.sleep(0.5)
        rows, _ = await asyncio.to_thread(home.read_rows)
    await asyncio.sleep(2.0)  # batch_timeout 1s: a duplicate would have landed by now
    rows, _ = await asyncio.to_thread(home.read_rows)
    counts = Counter(r["id"] for r in rows)
    assert [i for i, n in counts.items() if n > 1] == [], "ids landed twice"
    return sorted(counts)


async def _run_until_landed(
    home: DaemonDir, security: dict[str, Any], topic: str, bootstrap: str
) -> list[int]:
    home.write_config(batch_timeout="1s", extra=_kafka_section(bootstrap, topic, security))
    daemon = Daemon(home)
    try:
        daemon.start()
        await daemon.wait_ready()
        return await _landed_ids(home, daemon)
    finally:
        daemon.cleanup()


async def test_plaintext_lands_every_record_exactly_once(
    apache_kafka: KafkaBroker, tmp_path: Path
) -> None:
    topic = _unique("ak-plain")
    ids = await _produce_ids(apache_kafka.bootstrap, topic)
    home = DaemonDir(tmp_path / "d")
    assert await _run_until_landed(home, {}, topic, apache_kafka.bootstrap) == ids


@pytest.mark.parametrize("mtls", [False, True], ids=["server-verified", "mutual"])
async def test_tls_with_the_test_ca_lands_every_record_exactly_once(
    apache_kafka: KafkaBroker, tmp_path: Path, mtls: bool
) -> None:
    tls = apache_kafka.tls
    bootstrap = apache_kafka.mtls if mtls else apache_kafka.ssl
    topic = _unique("ak-mtls" if mtls else "ak-tls")
    ids = await _produce_ids(bootstrap, topic, **client_options(tls, client_cert=mtls))
    security: dict[str, Any] = {"security_protocol": "SSL", "ssl_cafile": str(tls.ca)}
    if mtls:
        security |= {
            "ssl_certfile": str(tls.client_cert),
            "ssl_keyfile": str(tls.client_key),
            "ssl_password": tls.client_key_password,
        }
    home = DaemonDir(tmp_path / "d")
    assert await _run_until_landed(home, security, topic, bootstrap) == ids


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"])
async def test_sasl_wrong_password_is_reported_then_the_right_one_lands_every_record(
    apache_kafka: KafkaBroker, tmp_path: Path, mechanism: str
) -> None:
    bootstrap = apache_kafka.sasl_plaintext
    user = USERS[mechanism]
    topic = _unique(f"ak-{mechanism.lower()}")
    # The test's own producer logs in with the same mechanism and user.
    ids = await _produce_ids(bootstrap, topic, **_sasl(mechanism, PASSWORDS[user]))
    home = DaemonDir(tmp_path / "d")
    home.write_config(
        batch_timeout="1s",
        extra=_kafka_section(bootstrap, topic, _sasl(mechanism, "wrong-password")),
    )
    daemon = Daemon(home)
    # The broker's own words for a refused login (SaslAuthenticate error 58).
    said = (
        "Authentication failed: Invalid username or password"
        if mechanism == "PLAIN"
        else "Authentication failed during authentication due to invalid credentials with "
        f"SASL mechanism {mechanism}"
    )
    refusal = (
        f"cannot connect to Kafka ({bootstrap}: SaslAuthenticationFailed: "
        f"[Error 58] SaslAuthenticationFailed: {said})"
    )
    try:
        daemon.start()
        await daemon.wait_listening()
        await daemon.wait_log("Kafka unavailable, retrying", within=60, count=2)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{daemon.url}/healthz") as response:
                assert response.status == 200
            async with http.get(f"{daemon.url}/readyz") as response:
                assert response.status == 503
                readyz = await response.text()
            async with http.get(f"{daemon.url}/v1/status") as response:
                assert response.status == 200
                source = (await response.json())["kafka"]["sources"][0]
        assert "Kafka not connected (kafka[0]); retrying with backoff" in readyz, readyz
        assert source["connected"] is False, source
        assert source["last_error"] == refusal, source
        assert daemon.running
    finally:
        daemon.cleanup()
    assert home.read_rows()[0] == []
    # Same spool, catalog and group: the right password lands every record once.
    assert await _run_until_landed(home, _sasl(mechanism, PASSWORDS[user]), topic, bootstrap) == ids


def test_missing_broker_jars_fail_naming_make_test_deps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "libs"
    empty.mkdir()
    monkeypatch.setattr(apache_kafka_module, "LIBS", empty)
    with pytest.raises(KafkaToolsMissing) as raised:
        KafkaBroker.start(tmp_path / "broker")
    assert str(raised.value) == (
        f"the Apache Kafka broker jars are missing from {empty}: run `make test-deps` "
        "(it copies those tests/support/kafka/pom.xml pins from Maven Central)"
    )
    assert not (tmp_path / "broker").exists()
