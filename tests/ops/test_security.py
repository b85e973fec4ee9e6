"""check-config --connect, secrets kept out of output and logs, slow HTTP bodies."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from support.daemon_harness import daemon_command
from support.fixture_types import RunDaemon

from icespool.config import REDACTED, embedded_default, is_secret_key, redacted, validate_config

PASSWORD = "hunter2-Secret"
DEMO = "demo.events"
NDJSON = "application/x-ndjson"


def _icespool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ICESPOOL")}
    return subprocess.run(
        [*daemon_command(), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _write(tmp_path: Path, catalog_uri: str, *, create: bool = True) -> Path:
    path = tmp_path / "icespool.toml"
    path.write_text(
        f"""\
[catalog]
name = "lake"
type = "sql"
uri = {json.dumps(catalog_uri)}
warehouse = {json.dumps((tmp_path / "warehouse").as_uri())}

[spool]
dir = {json.dumps(str(tmp_path / "spool"))}

[http]
listen = "127.0.0.1:0"

[[tables]]
name = "a.b"
create = {"true" if create else "false"}
schema = [{{ name = "id", type = "long" }}]
"""
    )
    return path


# ------------------------------------------------------------------ check-config --connect


def test_check_config_connect_reports_a_reachable_catalog(tmp_path: Path) -> None:
    config = _write(tmp_path, f"sqlite:///{tmp_path / 'catalog.db'}")
    # The catalog and warehouse a first `icespool run` leaves.
    SqlCatalog(
        "lake",
        uri=f"sqlite:///{tmp_path / 'catalog.db'}",
        warehouse=(tmp_path / "warehouse").as_uri(),
    ).engine.dispose()
    (tmp_path / "warehouse").mkdir()
    result = _icespool("check-config", "--config", str(config), "--connect", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        "catalog 'lake' (sql) is reachable: 0 namespaces",
        "table a.b: missing, created at start (create = true)",
        # No table yet: the warehouse itself is probed (write, list, delete).
        "storage (warehouse): wrote, listed and deleted a probe object under "
        f"{(tmp_path / 'warehouse').as_uri()}",
    ]
    assert list((tmp_path / "warehouse").iterdir()) == []
    assert result.stdout.startswith("# icespool effective config from the config file")


def test_check_config_connect_creates_nothing_before_the_first_start(tmp_path: Path) -> None:
    """A SQLite catalog the daemon has not created yet is checked as the empty catalog it
    will be; neither the database nor its directory nor the warehouse is created."""
    config = _write(tmp_path, f"sqlite:///{tmp_path / 'new' / 'catalog.db'}")
    before = sorted(tmp_path.iterdir())
    result = _icespool("check-config", "--config", str(config), "--connect", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        f"catalog 'lake' (sql): the SQLite database {tmp_path / 'new' / 'catalog.db'} does "
        "not exist yet; `icespool run` creates it at start",
        "table a.b: missing, created at start (create = true)",
        f"storage: the warehouse directory {tmp_path / 'warehouse'} does not exist yet; "
        "`icespool run` creates it (not probed)",
    ]
    assert sorted(tmp_path.iterdir()) == before


def test_check_config_connect_fails_on_a_missing_table_without_create(tmp_path: Path) -> None:
    """A mistyped database path: the table that should be there is missing, and the error
    names the database that is not; nothing is created there."""
    database = tmp_path / "typo" / "catalog.db"
    config = _write(tmp_path, f"sqlite:///{database}", create=False)
    result = _icespool("check-config", "--config", str(config), "--connect", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == (
        "error: tables[0] 'a.b' not found in catalog 'lake' and create = false; create the "
        f"table, or set create = true with a schema (its SQLite database {database} does "
        "not exist: is catalog.uri right?)\n"
    )
    assert not (tmp_path / "typo").exists() and not (tmp_path / "warehouse").exists()


def test_read_only_commands_create_nothing(tmp_path: Path) -> None:
    """tables --offline and dead-letters list, in a directory without the embedded
    default's data, or with a mistyped database path: an error naming the missing
    database, and nothing on disk."""
    result = _icespool("tables", "--offline", cwd=tmp_path)
    assert result.returncode == 1
    database = tmp_path / "icespool-data" / "catalog.db"
    assert result.stderr.splitlines() == [
        "note: no --config (nor ICESPOOL_CONFIG): the embedded default's data directory is "
        f"./icespool-data of the working directory, {tmp_path / 'icespool-data'}, which does "
        "not exist; run this where `icespool run` runs, or pass --config",
        f"error: catalog 'icespool': the SQLite database {database} does not exist "
        f"(catalog.uri 'sqlite:///{database}'); check the path: `icespool run` creates it at "
        "its first start, this command creates nothing",
    ]
    typo = tmp_path / "typo" / "catalog.db"
    config = _write(tmp_path, f"sqlite:///{typo}")
    with config.open("a") as out:
        out.write(
            '\n[[kafka]]\nbootstrap_servers = ["127.0.0.1:1"]\ntopics = ["t"]\ntable = "a.b"\n'
        )
    for command in (["tables", "--offline"], ["dead-letters", "list"]):
        result = _icespool(*command, "--config", str(config), cwd=tmp_path)
        assert result.returncode == 1, (command, result.stderr)
        assert f"the SQLite database {typo} does not exist" in result.stderr, command
    assert sorted(p.name for p in tmp_path.iterdir()) == ["icespool.toml"]


def test_check_config_connect_exits_2_when_the_catalog_is_unreachable(tmp_path: Path) -> None:
    # Port 1 on loopback: nothing listens, the connect is refused at once.
    config = _write(tmp_path, f"postgresql+psycopg2://icespool:{PASSWORD}@127.0.0.1:1/lake")
    result = _icespool("check-config", "--config", str(config), "--connect", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("error: cannot load catalog 'lake' (OperationalError: ")
    assert "Connection refused" in result.stderr
    assert "check the [catalog] settings" in result.stderr
    assert PASSWORD not in result.stderr + result.stdout
    assert f"postgresql+psycopg2://icespool:{REDACTED}@127.0.0.1:1/lake" in result.stdout
    # Without --connect the same file is only validated: exit 0.
    plain = _icespool("check-config", "--config", str(config), cwd=tmp_path)
    assert (plain.returncode, plain.stderr) == (0, "")


def test_run_with_an_unreachable_catalog_logs_no_password(tmp_path: Path) -> None:
    """The daemon retries the catalog (see tests/faults/test_timeouts.py); its log of every
    failed attempt names the catalog, never the password."""
    config = _write(tmp_path, f"postgresql+psycopg2://icespool:{PASSWORD}@127.0.0.1:1/lake")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ICESPOOL")}
    log = tmp_path / "run.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*daemon_command(), "run", "--config", str(config)],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 60
            while log.read_text().count("retrying in") < 2:
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
        finally:
            proc.terminate()
            assert proc.wait(timeout=60) == 0
    text = log.read_text()
    assert "cannot load catalog 'lake' (OperationalError: " in text
    assert "Connection refused" in text
    assert PASSWORD not in text


# ------------------------------------------------------------------ redaction


@pytest.mark.parametrize(
    ("key", "secret"),
    [
        ("sasl_password", True),
        ("sasl_plain_password", True),
        ("ssl_password", True),
        ("sasl_oauth_token", True),
        ("sasl.jaas.config", True),
        ("adls.connection-string", True),
        ("adls.sas-token.account", True),
        ("adls.account-key", True),
        ("gcs.oauth2.token", True),
        ("s3.secret-access-key", True),
        ("s3.session-token", True),
        ("credential", True),
        ("token", True),
        ("ssl_keyfile", False),  # a path to the key, not the key
        ("ssl_cafile", False),
        ("connection_string_file", False),
        ("sasl_mechanism", False),
        ("partition_key", False),
    ],
)
def test_secret_keys_of_catalogs_and_kafka(key: str, secret: bool) -> None:
    assert is_secret_key(key) is secret


def test_catalog_credentials_are_redacted_in_the_effective_config(tmp_path: Path) -> None:
    raw = embedded_default(tmp_path)
    raw["catalog"] = {
        "name": "lake",
        "type": "rest",
        "uri": "https://catalog.example/api",
        "credential": "client:" + PASSWORD,
        "token": PASSWORD,
        "s3": {"secret-access-key": PASSWORD, "access-key-id": "AKIA1", "endpoint": "http://s3"},
        "adls": {"connection-string": f"AccountName=a;AccountKey={PASSWORD}"},
    }
    shown = redacted(validate_config(raw))
    assert PASSWORD not in json.dumps(shown)
    catalog = shown["catalog"]
    for key in ("credential", "token", "s3.secret-access-key", "adls.connection-string"):
        assert catalog[key] == REDACTED, key
    assert catalog["s3.endpoint"] == "http://s3"
    assert catalog["uri"] == "https://catalog.example/api"


# ------------------------------------------------------------------ slow bodies


async def test_a_trickling_body_is_cut_off_and_does_not_block_others(
    run_daemon: RunDaemon,
) -> None:
    async def trickle() -> AsyncIterator[bytes]:
        yield b'{"event_id": 1}\n'
        await asyncio.sleep(5)
        yield b'{"event_id": 2}\n'

    async with run_daemon(body_timeout=1.0) as (service, base):
        url = f"{base}/v1/tables/{DEMO}/records"
        async with aiohttp.ClientSession() as slow, aiohttp.ClientSession() as fast:

            async def slow_post() -> tuple[int, str, float]:
                async with slow.post(url, data=trickle(), headers={"Content-Type": NDJSON}) as r:
                    return r.status, await r.text(), time.monotonic()

            started = time.monotonic()
            stalled = asyncio.create_task(slow_post())
            await asyncio.sleep(0.1)
            # Other clients are served at once while the slow body is being waited for.
            for i in range(5):
                async with fast.post(
                    url, data=f'{{"event_id": {10 + i}}}\n', headers={"Content-Type": NDJSON}
                ) as resp:
                    assert (resp.status, await resp.json()) == (200, {"accepted": 1})
            served = time.monotonic()
            assert not stalled.done()
            status, text, ended = await stalled
            assert status == 408 and "did not arrive within 1 s" in text
            assert served - started < 1.0 <= ended - started < 4.0
        assert service.writer(DEMO).pending_records == 5


async def test_a_raw_client_that_stops_sending_gets_408_and_connection_close(
    run_daemon: RunDaemon,
) -> None:
    async with run_daemon(body_timeout=0.5) as (service, base):
        host, port = base.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            f"POST /v1/tables/{DEMO}/records HTTP/1.1\r\nHost: x\r\n"
            f"Content-Type: {NDJSON}\r\nContent-Length: 1000\r\n\r\n".encode()
            + b'{"event_id": 1}\n'
        )
        await writer.drain()
        started = time.monotonic()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        took = time.monotonic() - started
        headers = dict(
            line.split(": ", 1) for line in head.decode().split("\r\n")[1:] if ": " in line
        )
        body = await asyncio.wait_for(reader.readexactly(int(headers["Content-Length"])), 5)
        writer.close()
        await writer.wait_closed()
        assert head.startswith(b"HTTP/1.1 408 ")
        # aiohttp then lingers briefly for the rest of the body; the client is told to go.
        assert headers["Connection"] == "close"
        assert json.loads(body)["error"].startswith(
            "the request body did not arrive within 0.5 s (16 bytes received)"
        )
        assert 0.4 < took < 3.0
        assert service.writer(DEMO).pending_records == 0
