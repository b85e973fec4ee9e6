"""`icespool status` and `icespool tables`, run as real processes against a real daemon.

The daemon is the in-process one of the `run_daemon` fixture (its HTTP server on a free
port), or a real `icespool run` child (daemon_harness) where the config file matters.
The CLI runs through asyncio subprocesses so the in-process daemon keeps answering.
"""

from __future__ import annotations

import asyncio
import json
import os
import pty
import re
import signal
import socket
import ssl
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from pyiceberg.catalog import load_catalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField
from support.daemon_harness import TABLE, Daemon, DaemonDir, daemon_command, ndjson
from support.fixture_types import MakeConfig, RunDaemon

NDJSON = {"Content-Type": "application/x-ndjson"}
# Tables of the in-process daemon: two that serve, one that cannot load (degraded).
COLUMNS = [
    {"name": "event_id", "type": "long", "required": True},
    {"name": "kind", "type": "string"},
]
TABLES = [
    {"name": "demo.events", "create": True, "schema": COLUMNS},
    {"name": "demo.other", "create": True, "schema": COLUMNS},
    {"name": "demo.missing", "create": False, "schema": COLUMNS},
]
MISSING_REASON = (
    "cannot load the table: CatalogError: table 'demo.missing' does not exist; create it or "
    "set create = true"
)
# Differ between two looks at the same daemon.
VOLATILE = {
    "uptime_seconds",
    "age_seconds",
    "oldest_pending_age_seconds",
    "at",
    "next_due_in_seconds",
}
# A table's maintenance column before its first run (the first comes after half to one
# [maintenance] interval: 5 minutes by default).
NOT_MAINTAINED_YET = r"not run yet, next in (?:[0-9.]+s|\d+m\d\ds)"
# Bounds on a CLI process's first output: its start alone (importing the daemon package)
# takes seconds on a loaded machine, so this only guards against a hang. What a test
# proves about timing is measured after the first output (see the --watch tests).
CLI_START_S = 120
# The same for a whole one-shot CLI run whose own timeout is short (--timeout 0.5 or 2):
# without that timeout it would last 100 s (a trickling server) or forever (a silent one).
CLI_RUN_S = 40


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("ICESPOOL")}


async def icespool(*args: str, cwd: Path) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *daemon_command(),
        *args,
        cwd=cwd,
        env=clean_env(),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), CLI_START_S)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def post(url: str, table: str, ids: range) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{url}/v1/tables/{table}/records",
            data=ndjson({"event_id": i, "kind": "k"} for i in ids),
            headers=NDJSON,
        ) as resp,
    ):
        assert (resp.status, await resp.json()) == (200, {"accepted": len(ids)})


async def get_status(url: str, token: str | None = None) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{url}/v1/status", headers=headers) as resp,
    ):
        assert resp.status == 200
        status: dict[str, Any] = await resp.json()
        return status


def without_volatile(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_volatile(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [without_volatile(v) for v in value]
    return value


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def cells(text: str, first: str) -> list[str]:
    """The whitespace-separated cells of the line of ``text`` starting with ``first``."""
    [line] = [line for line in text.splitlines() if line.startswith(first + " ")]
    return line.split()


# ------------------------------------------------------------------ status


async def test_status_shows_pending_records_then_the_last_commit(
    run_daemon: RunDaemon, make_config: MakeConfig, tmp_path: Path
) -> None:
    async with run_daemon(make_config(tables=TABLES)) as (_, url):
        await post(url, "demo.events", range(3))

        code, out, err = await icespool("status", "--url", url, cwd=tmp_path)

        assert (code, err) == (0, "")
        lines = out.splitlines()
        assert re.fullmatch(rf"icespool at {url}: ready, up \d+\.\ds", lines[0]), lines[0]
        assert re.fullmatch(
            r"spool: \d+ B of 10\.0 GiB \(0\.0%\), 1 segments, page-cache; quarantine: "
            r"0 segments, 0 B",
            lines[1],
        ), lines[1]
        assert lines[3].split() == [
            "TABLE", "PENDING", "BYTES", "OLDEST", "QUEUE", "SEGMENTS", "LAST", "COMMIT",
            "MAINTENANCE",
        ]  # fmt: skip
        events = cells(out, "demo.events")
        assert events[0:2] == ["demo.events", "3"]
        assert events[5:9] == ["0", "1", "none", "yet"]
        assert re.fullmatch(NOT_MAINTAINED_YET, " ".join(events[9:])), events
        other = cells(out, "demo.other")
        assert other[:9] == ["demo.other", "0", "0", "B", "-", "0", "0", "none", "yet"]
        assert re.fullmatch(NOT_MAINTAINED_YET, " ".join(other[9:])), other
        assert "demo.missing " not in out.split("degraded tables")[0]  # not loaded: no row
        assert out.split("\n\n")[2] == f"degraded tables (1):\n  demo.missing: {MISSING_REASON}\n"

        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{url}/v1/tables/demo.events/flush") as resp,
        ):
            assert (await resp.json())["records"] == 3
        code, out, err = await icespool("status", "--url", url, cwd=tmp_path)

        assert (code, err) == (0, "")
        events = cells(out, "demo.events")
        assert events[0:3] == ["demo.events", "0", "0"]
        assert events[4:9] == ["-", "0", "0", "manual,", "3"]
        assert re.fullmatch(
            r"records, \d+\.\ds ago +" + NOT_MAINTAINED_YET, " ".join(events[9:])
        ), events


async def test_status_json_is_the_daemons_status(
    run_daemon: RunDaemon, make_config: MakeConfig, tmp_path: Path
) -> None:
    async with run_daemon(make_config(tables=TABLES)) as (_, url):
        await post(url, "demo.other", range(7))

        code, out, err = await icespool("status", "--url", url, "--json", cwd=tmp_path)
        direct = await get_status(url)

    assert (code, err) == (0, "")
    printed = json.loads(out)
    assert without_volatile(printed) == without_volatile(direct)
    assert printed["tables"]["demo.other"]["pending_records"] == 7
    assert printed["degraded"] == {"demo.missing": MISSING_REASON}


async def test_status_needs_the_right_token(run_daemon: RunDaemon, tmp_path: Path) -> None:
    right, wrong = tmp_path / "right", tmp_path / "wrong"
    right.write_text("s3cr3t-token\n")
    wrong.write_text("guess\n")
    async with run_daemon(auth_token="s3cr3t-token") as (_, url):
        missing = await icespool("status", "--url", url, cwd=tmp_path)
        refused = await icespool("status", "--url", url, "--token-file", str(wrong), cwd=tmp_path)
        accepted = await icespool("status", "--url", url, "--token-file", str(right), cwd=tmp_path)

    hint = "; pass the token file of http.auth_token_file with --token-file, or the right --config"
    assert missing == (
        1,
        "",
        f"error: {url}/v1/status answered 401 (no token was sent: missing 'Authorization: "
        f"Bearer <token>' header){hint}\n",
    )
    assert refused == (
        1,
        "",
        f"error: {url}/v1/status answered 401 (the token was refused: wrong bearer token){hint}\n",
    )
    assert accepted[0] == 0 and accepted[2] == ""
    assert cells(accepted[1], "demo.events")[1] == "0"


async def test_unreachable_daemon_is_one_line_and_exit_1(tmp_path: Path) -> None:
    port = free_port()  # closed again: nothing listens there
    url = f"http://127.0.0.1:{port}"

    code, out, err = await icespool("status", "--url", url, cwd=tmp_path)

    assert (code, out) == (1, "")
    assert err == (
        f"error: cannot reach the icespool daemon at {url}/v1/status: [Errno 111] Connection "
        "refused; is it running, and is this its [http] listen address (--config / --url)?\n"
    )
    code, out, err = await icespool("tables", "--url", url, cwd=tmp_path)
    assert (code, out) == (1, "")
    assert err.startswith(f"error: cannot reach the icespool daemon at {url}/v1/status: ")


async def test_url_without_scheme_is_named(tmp_path: Path) -> None:
    code, out, err = await icespool("status", "--url", "127.0.0.1:8080", cwd=tmp_path)
    assert (code, out) == (1, "")
    assert err == (
        "error: URL '127.0.0.1:8080' must start with http:// or https:// "
        "(e.g. http://127.0.0.1:8080)\n"
    )


async def test_https_daemon_with_an_unknown_ca_is_refused(tmp_path: Path) -> None:
    # Not an https server at all: the TLS handshake fails, and says so, within the timeout.
    with socket.socket() as plain:
        plain.bind(("127.0.0.1", 0))
        plain.listen(8)
        url = f"https://127.0.0.1:{plain.getsockname()[1]}"
        missing_ca = await icespool(
            "status", "--url", url, "--cafile", str(tmp_path / "none.pem"), cwd=tmp_path
        )
        silent = await icespool("status", "--url", url, "--timeout", "0.5", cwd=tmp_path)

    assert missing_ca[:2] == (1, "")
    assert missing_ca[2].startswith(f"error: cannot load --cafile {tmp_path / 'none.pem'}: ")
    assert silent[:2] == (1, "")
    assert silent[2].startswith(f"error: cannot reach the icespool daemon at {url}/v1/status: ")
    assert "timed out" in silent[2]


async def test_https_with_cafile_reads_the_daemons_status(
    run_daemon: RunDaemon, tmp_path: Path
) -> None:
    # The daemon's own TLS listener is built elsewhere; until then a TLS front (aiohttp
    # with a self-signed certificate for 127.0.0.1) relays the real daemon's status.
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    async with run_daemon() as (_, url):
        await post(url, "demo.events", range(3))

        async def relay(_: web.Request) -> web.Response:
            return web.json_response(await get_status(url))

        app = web.Application()
        app.router.add_get("/v1/status", relay)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
        await site.start()
        try:
            port = runner.addresses[0][1]
            https = f"https://127.0.0.1:{port}"
            trusted = await icespool("status", "--url", https, "--cafile", str(cert), cwd=tmp_path)
            untrusted = await icespool("status", "--url", https, cwd=tmp_path)
        finally:
            await runner.cleanup()

    assert trusted[0] == 0 and trusted[2] == ""
    assert trusted[1].startswith(f"icespool at {https}: ready, up ")
    assert cells(trusted[1], "demo.events")[1] == "3"
    assert untrusted[:2] == (1, "")
    assert untrusted[2].startswith(
        f"error: cannot reach the icespool daemon at {https}/v1/status: [SSL: "
        "CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate"
    )


async def test_silent_daemon_times_out(tmp_path: Path) -> None:
    # Accepts connections (the kernel's backlog) and never answers a byte.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()

        code, out, err = await icespool("status", "--url", url, "--timeout", "0.5", cwd=tmp_path)

        took = time.monotonic() - started
    assert (code, out) == (1, "")
    assert err == (
        f"error: no answer from the icespool daemon at {url}/v1/status within 0.5s: timed out\n"
    )
    assert took < CLI_RUN_S, took


async def _serve_once(answer: bytes | None, *, trickle: bool = False) -> tuple[str, asyncio.Server]:
    """A fake daemon on loopback: sends ``answer`` (one byte a second with ``trickle``)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        try:
            for i in range(len(answer or b"")):
                writer.write((answer or b"")[i : i + 1] if trickle else (answer or b"")[i:])
                await writer.drain()
                if not trickle:
                    break
                await asyncio.sleep(1)
        except ConnectionError:
            pass
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", server


@pytest.mark.parametrize(
    ("answer", "trickle", "error"),
    [
        # Every read returns a byte within the timeout: only a deadline on the whole
        # request ends it.
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"{" * 100, True, "timed out"),
        (b"SSH-2.0-OpenSSH_9\r\n\r\n", False, "did not answer in HTTP: BadStatusLine"),
        (
            b'HTTP/1.1 200 OK\r\nContent-Length: 27\r\n\r\n{"ready": "x", "tables": 5}',
            False,
            "/v1/status has an unexpected shape",
        ),
    ],
)
async def test_a_daemon_that_misbehaves_is_one_error_line(
    tmp_path: Path, answer: bytes, trickle: bool, error: str
) -> None:
    url, server = await _serve_once(answer, trickle=trickle)
    async with server:
        started = time.monotonic()
        code, out, err = await icespool("status", "--url", url, "--timeout", "2", cwd=tmp_path)
        took = time.monotonic() - started
    assert (code, out) == (1, ""), err
    assert err.startswith("error: ") and error in err and "Traceback" not in err, err
    assert len(err.splitlines()) == 1, err
    assert took < CLI_RUN_S, took


async def test_status_watch_prints_snapshots_until_ctrl_c(
    run_daemon: RunDaemon, tmp_path: Path
) -> None:
    async with run_daemon() as (_, url):
        await post(url, "demo.events", range(3))
        proc = await asyncio.create_subprocess_exec(
            *daemon_command(),
            "status",
            "--url",
            url,
            "--watch",
            "0.2",
            cwd=tmp_path,
            env=clean_env(),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        assert proc.stdout is not None and proc.stderr is not None
        seen = b""
        async with asyncio.timeout(CLI_START_S):
            while b"--- " not in seen:  # the first snapshot has begun
                seen += await proc.stdout.read(4096)
        async with asyncio.timeout(30):  # 0.2 s apart: two more
            while seen.count(b"\n--- ") < 2:  # the third snapshot has begun
                seen += await proc.stdout.read(4096)
        proc.send_signal(signal.SIGINT)
        rest, err = await asyncio.wait_for(proc.communicate(), 30)

    assert (proc.returncode, err) == (0, b"")
    snapshots = (seen + rest).decode().split("--- ")[1:]
    assert len(snapshots) >= 3
    for snapshot in snapshots[:-1]:  # the last one may be cut by the SIGINT
        stamp, headline = snapshot.splitlines()[:2]
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", stamp)
        assert headline.startswith(f"icespool at {url}: ready, up ")
        assert cells(snapshot, "demo.events")[1] == "3"


async def test_status_watch_redraws_a_terminal(run_daemon: RunDaemon, tmp_path: Path) -> None:
    clear = b"\x1b[H\x1b[2J"
    master, slave = pty.openpty()
    try:
        async with run_daemon() as (_, url):
            proc = await asyncio.create_subprocess_exec(
                *daemon_command(),
                "status",
                "--url",
                url,
                "--watch",
                "0.2",
                cwd=tmp_path,
                env=clean_env(),
                stdout=slave,
                stderr=asyncio.subprocess.PIPE,
            )
            seen = b""
            loop = asyncio.get_running_loop()
            async with asyncio.timeout(CLI_START_S):
                while clear not in seen:
                    seen += await loop.run_in_executor(None, os.read, master, 4096)
            async with asyncio.timeout(30):  # 0.2 s apart: two more
                while seen.count(clear) < 3:
                    seen += await loop.run_in_executor(None, os.read, master, 4096)
            proc.send_signal(signal.SIGINT)
            _, err = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        os.close(slave)
        os.close(master)

    assert (proc.returncode, err) == (0, b"")
    screens = seen.split(clear)[1:3]
    for screen in screens:
        text = screen.decode().replace("\r\n", "\n")
        assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d  every 0\.2s, Ctrl-C to stop\n\n", text)
        assert f"icespool at {url}: ready" in text
        assert "\n--- " not in text


async def test_status_watch_json_is_one_line_per_snapshot(
    run_daemon: RunDaemon, tmp_path: Path
) -> None:
    async with run_daemon() as (_, url):
        proc = await asyncio.create_subprocess_exec(
            *daemon_command(),
            *("status", "--url", url, "--watch", "0.1", "--json"),
            cwd=tmp_path,
            env=clean_env(),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        assert proc.stdout is not None
        lines = [await asyncio.wait_for(proc.stdout.readline(), CLI_START_S)]
        lines.append(await asyncio.wait_for(proc.stdout.readline(), 30))  # 0.1 s later
        proc.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(proc.communicate(), 30)

    assert (proc.returncode, err) == (0, b"")
    for line in lines:
        assert json.loads(line)["tables"]["demo.events"]["pending_records"] == 0


async def test_bad_watch_interval_is_a_usage_error(tmp_path: Path) -> None:
    code, out, err = await icespool("status", "--watch", "0", cwd=tmp_path)
    assert (code, out) == (2, "")
    assert err.endswith(
        "icespool status: error: argument --watch: '0' must be > 0 and at most 86400 seconds\n"
    )


# ------------------------------------------------------------------ tables


async def test_tables_lists_the_daemons_tables(
    run_daemon: RunDaemon, make_config: MakeConfig, tmp_path: Path
) -> None:
    async with run_daemon(make_config(tables=TABLES)) as (_, url):
        await post(url, "demo.events", range(3))
        await post(url, "demo.other", range(5))
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{url}/v1/tables/demo.other/flush") as resp,
        ):
            assert resp.status == 200
        await post(url, "demo.other", range(5, 7))

        code, out, err = await icespool("tables", "--url", url, cwd=tmp_path)
        json_code, json_out, _ = await icespool("tables", "--url", url, "--json", cwd=tmp_path)

    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert len(lines) == 4
    assert lines[0].split() == ["TABLE", "PENDING", "LAST", "COMMIT", "STATE"]
    assert lines[1].split() == ["demo.events", "3", "none", "yet", "ok"]
    assert lines[2].split() == ["demo.missing", "-", "-", "degraded:", *MISSING_REASON.split()]
    other = lines[3].split()
    assert other[:4] == ["demo.other", "2", "manual,", "5"]
    assert other[-1] == "ok"
    assert json_code == 0
    listed = json.loads(json_out)
    assert sorted(listed) == ["demo.events", "demo.missing", "demo.other"]
    assert listed["demo.missing"] == {"degraded": MISSING_REASON}
    assert listed["demo.events"]["pending_records"] == 3
    assert listed["demo.events"]["degraded"] is None
    assert listed["demo.other"]["last_commit"]["records"] == 5


async def test_tables_offline_reads_config_and_catalog(tmp_path: Path) -> None:
    home = DaemonDir(tmp_path / "home")
    config = home.write_config(
        extra="""
[[tables]]
name = "t.declared_only"
create = true
schema = [ { name = "id", type = "long", required = true } ]
"""
    )
    catalog = load_catalog("lake", **home.catalog_properties)
    schema = Schema(NestedField(1, "id", LongType(), required=True))
    catalog.create_namespace("t")
    catalog.create_namespace("elsewhere")
    catalog.create_table(f"{TABLE}", schema)
    catalog.create_table("t.made_by_spark", schema)
    catalog.create_table("elsewhere.unrelated", schema)
    catalog.engine.dispose()  # type: ignore[attr-defined]

    code, out, err = await icespool("tables", "--offline", "--config", str(config), cwd=tmp_path)
    json_code, json_out, _ = await icespool(
        "tables", "--offline", "--json", "--config", str(config), cwd=tmp_path
    )

    assert (code, err) == (0, "")
    assert out == (
        "t.declared_only  configured, not in the catalog yet\n"
        "t.events         configured, in the catalog\n"
        "t.made_by_spark  in the catalog\n"
    )
    assert json_code == 0
    assert json.loads(json_out) == [
        {"table": "t.declared_only", "source": "configured, not in the catalog yet"},
        {"table": "t.events", "source": "configured, in the catalog"},
        {"table": "t.made_by_spark", "source": "in the catalog"},
    ]
    assert not home.spool_dir.exists()  # no daemon was started


async def test_tables_offline_unreachable_catalog_is_an_error(tmp_path: Path) -> None:
    port = free_port()
    config = tmp_path / "icespool.toml"
    config.write_text(
        f"""
[catalog]
name = "lake"
type = "rest"
uri = "http://127.0.0.1:{port}"
[spool]
dir = "{tmp_path / "spool"}"
[timeouts]
catalog_connect = "1s"
catalog_request = "1s"
"""
    )
    code, out, err = await icespool("tables", "--offline", "--config", str(config), cwd=tmp_path)
    assert (code, out) == (1, "")
    assert err.startswith("error: cannot load catalog 'lake' (")
    assert "Traceback" not in err


# ------------------------------------------------------------------ a real `icespool run`


@pytest.mark.slow
async def test_status_finds_the_daemon_and_token_through_its_config(tmp_path: Path) -> None:
    home = DaemonDir(tmp_path / "home")
    token = tmp_path / "token"
    token.write_text("from-the-config\n")
    port = free_port()
    config = home.write_config()
    text = config.read_text().replace(
        'listen = "127.0.0.1:0"', f'listen = "0.0.0.0:{port}"\nauth_token_file = "{token}"'
    )
    config.write_text(text)
    daemon = Daemon(home)
    try:
        daemon.start()
        await daemon.wait_ready()
        async with aiohttp.ClientSession(
            headers={"Authorization": "Bearer from-the-config"}
        ) as session:
            await daemon.ingest(session, [{"id": i, "v": "x"} for i in range(4)])

        code, out, err = await icespool("status", "--config", str(config), cwd=tmp_path)
        tables = await icespool("tables", "--config", str(config), cwd=tmp_path)
    finally:
        daemon.cleanup()

    assert (code, err) == (0, "")
    # A listener on every address is asked through loopback.
    assert out.startswith(f"icespool at http://127.0.0.1:{port}: ready, up ")
    assert cells(out, TABLE)[:2] == [TABLE, "4"]
    assert tables == (
        0,
        "TABLE     PENDING  LAST COMMIT  STATE\nt.events        4  none yet     ok\n",
        "",
    )


async def test_status_with_a_port_0_config_asks_for_url(tmp_path: Path) -> None:
    config = DaemonDir(tmp_path / "home").write_config()

    code, out, err = await icespool("status", "--config", str(config), cwd=tmp_path)

    assert (code, out) == (1, "")
    assert err == (
        "error: http.listen '127.0.0.1:0' picks a free port at start; pass --url with the "
        "port the daemon's 'icespool listening' log line names\n"
    )
