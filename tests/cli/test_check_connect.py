"""check-config --connect: what would fail or degrade at start fails here, each failing
step named (the Kafka brokers and topics, the HTTP token files, declared schemas against
existing tables). A real Apache Kafka broker, a SQLite catalog in tmp_path; the CLI runs
in this process (a second interpreter start costs seconds) and its stderr is compared
line by line. The catalog and storage lines themselves are in tests/ops/test_security.py."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField
from support.apache_kafka import SCRAM_USERS, KafkaBroker
from support.kafka_harness import create_topic, unique_name

from icespool.cli import main

TOKEN = "s3cr3t-admin-token"


def _toml(value: Any) -> str:
    return json.dumps(value)


def _config(
    tmp_path: Path,
    *,
    kafka: list[dict[str, Any]] = (),  # type: ignore[assignment]
    http: str = "",
    schema: str = '{ name = "id", type = "long" }',
) -> Path:
    sources = "".join(
        "\n[[kafka]]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in source.items())
        for source in kafka
    )
    path = tmp_path / "icespool.toml"
    path.write_text(
        f"""\
[catalog]
name = "lake"
type = "sql"
uri = {_toml(f"sqlite:///{tmp_path / 'catalog.db'}")}
warehouse = {_toml((tmp_path / "warehouse").as_uri())}

[spool]
dir = {_toml(str(tmp_path / "spool"))}

[http]
listen = "127.0.0.1:0"
{http}
[[tables]]
name = "a.b"
create = true
schema = [{schema}]
{sources}"""
    )
    return path


def _check(path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, list[str]]:
    capsys.readouterr()
    code = main(["check-config", "--connect", "--config", str(path), *extra])
    printed = capsys.readouterr()
    assert TOKEN not in printed.out + printed.err
    return code, printed.err.splitlines()


def _source(bootstrap: str, topics: list[str], **more: Any) -> dict[str, Any]:
    return {"bootstrap_servers": [bootstrap], "topics": topics, "table": "a.b", **more}


def _sasl(password: str) -> dict[str, str]:
    return {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_plain_username": "alice",
        "sasl_plain_password": password,
    }


def _catalog(tmp_path: Path) -> list[str]:
    """The catalog's lines for a catalog the daemon has not created yet (the check creates
    nothing: tests/ops/test_security.py checks the lines of an existing one)."""
    return [
        f"catalog 'lake' (sql): the SQLite database {tmp_path / 'catalog.db'} does not exist "
        "yet; `icespool run` creates it at start",
        "table a.b: missing, created at start (create = true)",
        f"storage: the warehouse directory {tmp_path / 'warehouse'} does not exist yet; "
        "`icespool run` creates it (not probed)",
    ]


def test_a_good_config_passes_with_one_line_per_check(
    broker: KafkaBroker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one, two = unique_name("cc-one"), unique_name("cc-two")
    prefix = unique_name("cc-pat")
    for topic in (one, two, f"{prefix}-x", f"{prefix}-y"):
        asyncio.run(create_topic(broker.bootstrap, topic, 1))
    admin, scoped = tmp_path / "admin.token", tmp_path / "producer.token"
    admin.write_text(TOKEN + "\n")
    scoped.write_text("producer-token\n")
    http = (
        f'auth_token_file = {_toml(str(admin))}\n\n[[http.tokens]]\nname = "producer"\n'
        f'token_file = {_toml(str(scoped))}\ntables = ["a.*"]\n'
    )
    kafka = [
        _source(broker.bootstrap, [one, two]),
        _source(broker.sasl_plaintext, [one], **_sasl(SCRAM_USERS["alice"])),
        {"bootstrap_servers": [broker.bootstrap], "topic_pattern": f"{prefix}-.*", "table": "a.b"},
    ]
    code, lines = _check(_config(tmp_path, kafka=kafka, http=http), capsys)
    assert (code, lines) == (
        0,
        [
            f"http.auth_token_file: {admin} is readable and holds a token",
            f"http.tokens[0].token_file: {scoped} is readable and holds a token",
            *_catalog(tmp_path),
            f"kafka[0] ({broker.bootstrap}): connected (PLAINTEXT); 2 topics exist ({one}, {two})",
            f"kafka[1] ({broker.sasl_plaintext}): connected (SASL_PLAINTEXT); 1 topics exist "
            f"({one})",
            f"kafka[2] ({broker.bootstrap}): connected (PLAINTEXT); topic_pattern "
            f"'{prefix}-.*' matches 2 topics now",
        ],
    )


def test_a_missing_topic_fails_naming_it(
    broker: KafkaBroker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    there, missing = unique_name("cc-there"), unique_name("cc-missing")
    asyncio.run(create_topic(broker.bootstrap, there, 1))
    kafka = [_source(broker.bootstrap, [there, missing])]
    code, lines = _check(_config(tmp_path, kafka=kafka), capsys)
    assert (code, lines) == (
        2,
        [
            *_catalog(tmp_path),
            f"error: kafka[0] ({broker.bootstrap}): topic '{missing}' not found on the brokers "
            "(or this user may not describe them); create them, or fix topics",
        ],
    )


def test_a_closed_port_fails_within_the_timeout_naming_the_broker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Port 1 on loopback: nothing listens, every connect is refused.
    kafka = [_source("127.0.0.1:1", ["t"])]
    started = time.monotonic()
    code, lines = _check(_config(tmp_path, kafka=kafka), capsys, "--kafka-timeout", "5")
    assert time.monotonic() - started < 5 + 5  # the bound, and the catalog's few checks
    assert code == 2
    assert lines[:3] == _catalog(tmp_path)
    assert len(lines) == 4
    assert lines[3].startswith(
        "error: kafka[0] (127.0.0.1:1): cannot connect to Kafka (127.0.0.1:1: "
    ), lines[3]
    assert "Connect call failed ('127.0.0.1', 1)" in lines[3], lines[3]


def test_a_broker_that_never_answers_fails_at_the_timeout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A listening socket nobody reads: the connect succeeds, no answer ever comes.
    with socket.create_server(("127.0.0.1", 0)) as silent:
        server = f"127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        code, lines = _check(
            _config(tmp_path, kafka=[_source(server, ["t"])]), capsys, "--kafka-timeout", "2"
        )
        took = time.monotonic() - started
    assert 2 <= took < 2 + 5, took
    assert (code, lines) == (
        2,
        [
            *_catalog(tmp_path),
            f"error: kafka[0] ({server}): the brokers did not answer within 2 s; check "
            "bootstrap_servers, the network path and the security settings",
        ],
    )


def test_a_wrong_sasl_password_fails_naming_the_refused_login(
    broker: KafkaBroker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kafka = [_source(broker.sasl_plaintext, ["t"], **_sasl("wrong-password"))]
    code, lines = _check(_config(tmp_path, kafka=kafka), capsys)
    assert (code, lines) == (
        2,
        [
            *_catalog(tmp_path),
            # The broker's own words for a refused login (SaslAuthenticate error 58).
            f"error: kafka[0] ({broker.sasl_plaintext}): cannot connect to Kafka "
            f"({broker.sasl_plaintext}: SaslAuthenticationFailed: [Error 58] "
            "SaslAuthenticationFailed: Authentication failed during authentication due to "
            "invalid credentials with SASL mechanism SCRAM-SHA-256)",
        ],
    )


def test_an_unreadable_admin_token_file_fails_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    token = tmp_path / "admin.token"  # never written: what a wrong path or mount gives
    path = _config(tmp_path, http=f"auth_token_file = {_toml(str(token))}\n")
    code, lines = _check(path, capsys)
    assert (code, lines) == (
        2,
        [
            "error: config key 'http.auth_token_file': cannot read the token file "
            f"{token}: No such file or directory",
            *_catalog(tmp_path),
        ],
    )
    # Without --connect the admin's file is not read (only the daemon reads it).
    assert main(["check-config", "--config", str(path)]) == 0


def test_an_empty_admin_token_file_fails_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    token = tmp_path / "admin.token"
    token.write_text("\n")
    code, lines = _check(_config(tmp_path, http=f"auth_token_file = {_toml(str(token))}\n"), capsys)
    assert (code, lines) == (
        2,
        [
            f"error: config key 'http.auth_token_file': the token file {token} is empty; put "
            "the token in it",
            *_catalog(tmp_path),
        ],
    )


def test_a_declared_schema_contradicting_the_table_fails_naming_table_column_types(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _config(
        tmp_path, schema='{ name = "id", type = "long" }, { name = "note", type = "string" }'
    )
    catalog = SqlCatalog(
        "lake",
        uri=f"sqlite:///{tmp_path / 'catalog.db'}",
        warehouse=(tmp_path / "warehouse").as_uri(),
    )
    catalog.create_namespace("a")
    catalog.create_table(
        "a.b",
        Schema(
            NestedField(1, "id", LongType(), required=False),
            NestedField(2, "note", LongType(), required=False),
        ),
    )
    catalog.engine.dispose()
    code, lines = _check(path, capsys)
    assert (code, lines) == (
        2,
        [
            "error: tables[0] 'a.b': the declared schema does not match table a.b: note: "
            "declared as string but table a.b has long. Make the [[tables]] schema match "
            "the table, or change the table (ALTER TABLE)",
        ],
    )
    # The same declaration with the table's type passes.
    path = _config(
        tmp_path, schema='{ name = "id", type = "long" }, { name = "note", type = "long" }'
    )
    code, lines = _check(path, capsys)
    assert code == 0, lines
    assert lines[:2] == ["catalog 'lake' (sql) is reachable: 1 namespaces", "table a.b: exists"]
