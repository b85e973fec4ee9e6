"""TLS on the HTTP listener with a CA made here: real TLS clients (aiohttp), certificate
rotation by reload (in process and by SIGHUP to a real ``icespool run``) while the
listener and open connections stay, and check-config naming the key of a bad pair."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cryptography import x509
from support.daemon_harness import Daemon, DaemonDir
from support.fixture_types import MakeConfig
from support.tls_certs import LocalCA

from icespool.cli import main
from icespool.config import Config
from icespool.errors import ConfigError
from icespool.http import HttpServer, server_context, start_http
from icespool.http._conn import ConnectionLimits
from icespool.lifecycle.service import Icespool


class Raw:
    """One kept-alive TLS connection speaking HTTP/1.1 by hand: which certificate it
    got in its handshake stays readable for its whole life (aiohttp hides that)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, url: str, context: ssl.SSLContext) -> Raw:
        port = int(url.rsplit(":", 1)[1])
        return cls(*await asyncio.open_connection("127.0.0.1", port, ssl=context))

    @property
    def serial(self) -> int:
        der = self.writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        return int(x509.load_der_x509_certificate(der).serial_number)

    async def get(self, path: str, headers: str = "") -> tuple[int, Any]:
        self.writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n{headers}\r\n".encode())
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 10)
        status = int(head.split(b" ", 2)[1])
        length = int(head.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
        return status, json.loads(await self.reader.readexactly(length))

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await self.writer.wait_closed()


async def _served_serial(url: str, context: ssl.SSLContext) -> int:
    """The serial of the certificate a new connection to ``url`` is shown."""
    raw = await Raw.open(url, context)
    try:
        assert await raw.get("/healthz") == (200, {"status": "ok"})
        return raw.serial
    finally:
        await raw.close()


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with session.get(url) as reply:
        return reply.status, await reply.json()


@pytest.fixture
def ca(tmp_path: Path) -> LocalCA:
    return LocalCA.create(tmp_path / "ca")


@pytest.fixture
def tls_config(tmp_path: Path, ca: LocalCA, make_config: MakeConfig) -> tuple[Config, int]:
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"
    serial = ca.issue(cert, key, "icespool one")
    return make_config(http={"tls_cert_file": str(cert), "tls_key_file": str(key)}), serial


@pytest.fixture
async def served(tls_config: tuple[Config, int]) -> AsyncIterator[tuple[HttpServer, str, Config]]:
    config, _ = tls_config
    service = Icespool(config)
    await service.start()
    try:
        http = await start_http(
            service,
            "127.0.0.1",
            0,
            max_body_bytes=config.http.max_body_bytes,
            tls=server_context(config.http),
        )
        try:
            yield http, f"https://127.0.0.1:{http.port}", config
        finally:
            await http.stop()
    finally:
        await service.stop()


async def test_https_serves_the_api_and_only_to_clients_that_trust_the_certificate(
    served: tuple[HttpServer, str, Config], ca: LocalCA, tls_config: tuple[Config, int]
) -> None:
    _, base, _ = served
    _, serial = tls_config
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=ca.client_context())
    ) as session:
        assert await _get(session, f"{base}/healthz") == (200, {"status": "ok"})
        async with session.post(
            f"{base}/v1/tables/demo.events/records",
            data=b'{"event_id": 1}\n',
            headers={"Content-Type": "application/x-ndjson"},
        ) as reply:
            assert (reply.status, await reply.json()) == (200, {"accepted": 1})
    assert await _served_serial(base, ca.client_context()) == serial
    # A client with the system's trust store refuses the test CA's certificate ...
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await session.get(f"{base}/healthz")
    # ... and plain HTTP to the TLS port gets no HTTP answer.
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientError):
            await session.get(base.replace("https://", "http://") + "/healthz")


async def test_a_reload_swaps_the_certificate_for_new_connections_only(
    served: tuple[HttpServer, str, Config],
    ca: LocalCA,
    tls_config: tuple[Config, int],
    tmp_path: Path,
) -> None:
    http, base, config = served
    _, first = tls_config
    assert config.http.tls_cert_file is not None and config.http.tls_key_file is not None
    kept = await Raw.open(base, ca.client_context())
    try:
        assert (await kept.get("/healthz"), kept.serial) == ((200, {"status": "ok"}), first)
        second = ca.issue(config.http.tls_cert_file, config.http.tls_key_file, "icespool two")
        assert await http.reload(config.http) == [
            f"TLS certificate {config.http.tls_cert_file}",
            "tokens (none: API open)",
        ]
        # The kept-alive connection goes on with its handshake's certificate ...
        assert (await kept.get("/healthz"), kept.serial) == ((200, {"status": "ok"}), first)
        # ... and every new connection gets the new one.
        assert await _served_serial(base, ca.client_context()) == second
        # A key that does not belong to the certificate is refused by key; the running
        # certificate stays.
        other_key = tmp_path / "other.key"
        ca.issue(tmp_path / "other.pem", other_key, "other")
        config.http.tls_key_file.write_bytes(other_key.read_bytes())
        with pytest.raises(ConfigError) as caught:
            await http.reload(config.http)
        assert caught.value.key == "http.tls_key_file"
        assert "does not belong to the certificate" in caught.value.problem
        assert await _served_serial(base, ca.client_context()) == second
        assert await kept.get("/healthz") == (200, {"status": "ok"})
    finally:
        await kept.close()


async def test_sighup_rotates_the_certificate_of_a_running_daemon(
    tmp_path: Path, ca: LocalCA
) -> None:
    home = DaemonDir(tmp_path / "d")
    cert, key, token = tmp_path / "tls.pem", tmp_path / "tls.key", tmp_path / "token"
    first = ca.issue(cert, key, "first")
    token.write_text("s3cret-admin\n")
    home.write_config()
    env = {
        "ICESPOOL__HTTP__TLS_CERT_FILE": str(cert),
        "ICESPOOL__HTTP__TLS_KEY_FILE": str(key),
        "ICESPOOL__HTTP__AUTH_TOKEN_FILE": str(token),
    }
    daemon = Daemon(home, tls=ca.client_context())
    daemon.start(env=env)
    try:
        await daemon.wait_ready()
        assert f"icespool ready: https://127.0.0.1:{daemon.port}" in daemon.log()
        auth = {"Authorization": "Bearer s3cret-admin"}
        kept = await Raw.open(daemon.url, ca.client_context())
        try:
            assert kept.serial == first
            second = ca.issue(cert, key, "second")
            daemon.signal(signal.SIGHUP)
            await daemon.wait_log("SIGHUP: HTTP reloaded", within=10)
            assert f"SIGHUP: HTTP reloaded TLS certificate {cert}; tokens auth_token_file" in (
                daemon.log()
            )
            assert "s3cret-admin" not in daemon.log()
            assert await _served_serial(daemon.url, ca.client_context()) == second
            async with aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=ca.client_context()), headers=auth
            ) as session:
                await daemon.ingest(session, [{"id": 1, "v": "over TLS"}])
                status, body = await _get(session, f"{daemon.url}/v1/status")
                assert status == 200 and body["tables"]["t.events"]["pending_records"] == 1
            # The listener was never dropped: the connection from before still answers.
            status, _ = await kept.get("/v1/status", "Authorization: Bearer s3cret-admin\r\n")
            assert (status, kept.serial) == (200, first)
        finally:
            await kept.close()
    finally:
        daemon.kill()
        daemon.cleanup()


def _check_config(tmp_path: Path, http: dict[str, str], capsys: pytest.CaptureFixture[str]) -> Any:
    path = tmp_path / "c.toml"
    lines = "\n".join(f"{k} = {json.dumps(v)}" for k, v in http.items())
    path.write_text(f"[http]\n{lines}\n")
    code = main(["check-config", "--config", str(path), "--format", "json"])
    out, err = capsys.readouterr()
    return code, out, err


def test_check_config_loads_the_pair_and_names_the_key_of_a_bad_one(
    tmp_path: Path, ca: LocalCA, capsys: pytest.CaptureFixture[str]
) -> None:
    cert, key = tmp_path / "s.pem", tmp_path / "s.key"
    ca.issue(cert, key, "ok")
    code, out, err = _check_config(
        tmp_path, {"tls_cert_file": str(cert), "tls_key_file": str(key)}, capsys
    )
    assert (code, err) == (0, "")
    assert json.loads(out)["http"]["tls_cert_file"] == str(cert)

    cases = [
        ({"tls_cert_file": str(cert)}, "http.tls_key_file", "set both or neither"),
        ({"tls_key_file": str(key)}, "http.tls_cert_file", "set both or neither"),
        (
            {"tls_cert_file": str(tmp_path / "nope.pem"), "tls_key_file": str(key)},
            "http.tls_cert_file",
            "does not exist",
        ),
        ({"tls_cert_file": str(key), "tls_key_file": str(key)}, "http.tls_cert_file", "PEM"),
        ({"tls_cert_file": str(cert), "tls_key_file": str(cert)}, "http.tls_key_file", "PEM"),
    ]
    other_cert, other_key = tmp_path / "o.pem", tmp_path / "o.key"
    ca.issue(other_cert, other_key, "other")
    cases.append(
        (
            {"tls_cert_file": str(cert), "tls_key_file": str(other_key)},
            "http.tls_key_file",
            "does not belong to the certificate",
        )
    )
    for http, key_name, fragment in cases:
        code, out, err = _check_config(tmp_path, http, capsys)
        assert (code, out) == (2, ""), http
        assert f"config key {key_name!r}" in err and fragment in err, (http, err)


async def test_a_client_that_never_finishes_the_handshake_is_closed(
    tls_config: tuple[Config, int],
) -> None:
    config, _ = tls_config
    service = Icespool(config)
    await service.start()
    try:
        http = await start_http(
            service,
            "127.0.0.1",
            0,
            max_body_bytes=config.http.max_body_bytes,
            tls=server_context(config.http),
            limits=ConnectionLimits(header_timeout=0.5),
        )
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", http.port)
            started = time.monotonic()
            writer.write(b"\x16\x03\x01")  # the first bytes of a ClientHello, then nothing
            assert await asyncio.wait_for(reader.read(), 10) == b""
            assert 0.45 <= time.monotonic() - started < 0.5 + 1.5
            writer.close()
        finally:
            await http.stop()
    finally:
        await service.stop()
