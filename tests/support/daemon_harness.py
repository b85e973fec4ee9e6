"""A real `icespool run` child process for fault tests.

Everything lives under one directory (normally pytest's ``tmp_path``): the TOML
config, a SQLite SQL catalog, the warehouse, the spool, and one log file per start.
The daemon listens on ``127.0.0.1:0``; its "icespool listening" log line names the port
it bound, so restarts never race other processes for a pre-picked port.

Failures carry the tail of the daemon's log, so a red test says what the daemon saw.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from pyiceberg.catalog import load_catalog
from pyiceberg.table import Table

__all__ = [
    "CATALOG_NAME",
    "NDJSON",
    "TABLE",
    "Daemon",
    "DaemonDir",
    "DaemonError",
    "crash_seam_env",
    "daemon_command",
    "ndjson",
]

TABLE = "t.events"
CATALOG_NAME = "lake"
NDJSON = "application/x-ndjson"
# Logged once /readyz first answers 200.
_READY_LINE = "icespool ready: "
# Logged before the start (recovery, the catalog): the port answers probes from then on.
_LISTENING_RE = re.compile(r"icespool listening: https?://(?P<host>[^\s,]+):(?P<port>\d+)")
_READY_TIMEOUT = 60.0
_DECLARED = """create = true
schema = [
  { name = "id", type = "long", required = true },
  { name = "v", type = "string" },
]"""


class DaemonError(AssertionError):
    """The daemon did not do what the test waited for (the message has its log tail)."""


#: Test-owned crash points for children (support/crash_seams/sitecustomize.py).
CRASH_SEAMS_DIR = Path(__file__).resolve().parent / "crash_seams"


def crash_seam_env(point: str) -> dict[str, str]:
    """The environment that makes a child ``icespool run`` stop at crash seam ``point``."""
    # No empty PYTHONPATH entry: it would put the daemon's cwd (holding spool/) on the path.
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {
        "TEST_CRASH_AT": point,
        "PYTHONPATH": os.pathsep.join([str(CRASH_SEAMS_DIR), *inherited]),
    }


def daemon_command() -> list[str]:
    """The console script next to this interpreter, else ``python -m icespool``."""
    script = Path(sys.executable).parent / "icespool"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "icespool"]


def ndjson(records: Iterable[Mapping[str, Any]]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()


@dataclass(frozen=True)
class DaemonDir:
    """The paths of one daemon installation under ``root``."""

    root: Path
    # Several daemons can share one catalog (e.g. PostgreSQL) and warehouse.
    catalog_uri: str | None = None
    shared_warehouse: Path | None = None
    # Any other catalog (a REST catalog on S3: support/object_store.py), as [catalog] keys.
    catalog: Mapping[str, str] | None = None

    @property
    def config_path(self) -> Path:
        return self.root / "icespool.toml"

    @property
    def spool_dir(self) -> Path:
        return self.root / "spool"

    @property
    def catalog_db(self) -> Path:
        return self.root / "catalog.db"

    @property
    def warehouse(self) -> Path:
        return self.shared_warehouse or self.root / "warehouse"

    @property
    def log_dir(self) -> Path:
        return self.root / "logs"

    @property
    def catalog_properties(self) -> dict[str, str]:
        if self.catalog is not None:
            return dict(self.catalog)
        return {
            "type": "sql",
            "uri": self.catalog_uri or f"sqlite:///{self.catalog_db}",
            "warehouse": self.warehouse.as_uri(),
        }

    def write_config(
        self,
        *,
        batch_timeout: str = "60s",
        max_batch_records: int = 500_000,
        durability: str = "page-cache",
        encode_workers: int = 2,
        extra: str = "",
        spool_extra: str = "",
        table: str | None = None,
    ) -> Path:
        """Write the daemon's TOML: table ``t.events`` (id long required, v string), or
        ``table``: the keys of its [[tables]] entry instead of that declaration."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.warehouse.mkdir(parents=True, exist_ok=True)
        catalog = "\n".join(
            f"{json.dumps(k)} = {json.dumps(v)}" for k, v in self.catalog_properties.items()
        )
        text = f"""\
[catalog]
name = "{CATALOG_NAME}"
{catalog}

[spool]
dir = {json.dumps(str(self.spool_dir))}
durability = "{durability}"
{spool_extra}

[http]
listen = "127.0.0.1:0"

[defaults]
batch_timeout = "{batch_timeout}"
max_batch_records = {max_batch_records}

[encode]
workers = {encode_workers}

[log]
level = "info"
format = "text"

[[tables]]
name = "{TABLE}"
{_DECLARED if table is None else table}
{extra}"""
        self.config_path.write_text(text)
        return self.config_path

    # ------------------------------------------------------------------ reading back

    def load_table(self) -> tuple[Table, Any]:
        """The table as the daemon's catalog holds it, and the catalog (dispose its engine)."""
        catalog = load_catalog(CATALOG_NAME, **self.catalog_properties)
        return catalog.load_table(TABLE), catalog

    def read_rows(self) -> tuple[list[dict[str, Any]], Table]:
        """Every row of the table (current snapshot) and the loaded table."""
        table, catalog = self.load_table()
        try:
            arrow = table.scan().to_arrow()
        finally:
            _dispose(catalog)
        return arrow.to_pylist(), table

    def spool_files(self) -> list[Path]:
        if not self.spool_dir.exists():
            return []
        return sorted(p for p in self.spool_dir.iterdir() if p.name.endswith(".arrow"))

    def quarantined(self) -> list[Path]:
        q = self.spool_dir / "quarantine"
        return sorted(q.iterdir()) if q.exists() else []


def _dispose(catalog: Any) -> None:
    engine = getattr(catalog, "engine", None)  # SqlCatalog: close its connection pool
    if engine is not None:
        engine.dispose()
    session = getattr(catalog, "_session", None)  # RestCatalog: close its HTTP session
    if session is not None:
        session.close()


class Daemon:
    """One daemon installation; `start` may be called again after it died."""

    def __init__(self, home: DaemonDir, *, tls: ssl.SSLContext | None = None) -> None:
        self.home = home
        # A client context trusting the daemon's certificate: the daemon serves HTTPS.
        self.tls = tls
        self.proc: subprocess.Popen[bytes] | None = None
        self.port: int | None = None
        self.starts = 0
        self._log_file: Any = None
        self.log_path: Path | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(
        self,
        env: Mapping[str, str] | None = None,
        wrapper: Sequence[str] = (),
        crash: Sequence[str] = (),
        control: Path | None = None,
    ) -> None:
        """Start ``icespool run``; ``wrapper`` prefixes the command (e.g. strace).

        ``crash``: crash points ``OP:PATTERN:N`` (see support/fault_daemon.py): the
        daemon runs with a file-system seam that SIGKILLs it at that call. ``control``:
        the seam's control file, naming the fault the disk has (support/fault_daemon.py).
        """
        if self.running:
            raise DaemonError(f"daemon already running (pid {self.pid})")
        self._close_log()
        self.starts += 1
        self.port = None
        self.home.log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.home.log_dir / f"start-{self.starts:03d}.log"
        self._log_file = open(self.log_path, "wb")  # noqa: SIM115 - lives as long as the child
        child_env = {k: v for k, v in os.environ.items() if not k.startswith("ICESPOOL")}
        child_env.update(env or {})
        child_env["PYTHONUNBUFFERED"] = "1"
        command = [*daemon_command(), "run", "--config", str(self.home.config_path)]
        if crash or control is not None:
            launcher = Path(__file__).with_name("fault_daemon.py")
            points = [arg for point in crash for arg in ("--crash", point)]
            command = [sys.executable, str(launcher), "--config", str(self.home.config_path)]
            command += points
            if control is not None:
                command += ["--control", str(control)]
        self.proc = subprocess.Popen(
            [*wrapper, *command],
            cwd=self.home.root,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=child_env,
        )

    async def wait_ready(self, within: float = _READY_TIMEOUT) -> int:
        """Wait for ``GET /readyz`` == 200 and the "icespool ready" line; returns the port."""
        proc = self._require_proc()
        deadline = time.monotonic() + within
        if self.port is None:
            await self.wait_listening(within)
        if self.port == 0:
            raise DaemonError(f"the listening line names port 0, not the bound port\n{self.tail()}")
        connector = aiohttp.TCPConnector(ssl=self.tls if self.tls is not None else True)
        async with aiohttp.ClientSession(connector=connector) as session:
            while True:
                try:
                    async with session.get(f"{self.url}/readyz") as resp:
                        if resp.status == 200:
                            break
                        last = f"{resp.status} {await resp.text()}"
                except aiohttp.ClientError as exc:
                    last = repr(exc)
                if proc.poll() is not None:
                    raise DaemonError(
                        f"daemon exited with {_describe_exit(proc.returncode)} while waiting "
                        "for /readyz "
                        f"({last})\n{self.tail()}"
                    )
                if time.monotonic() > deadline:
                    raise DaemonError(f"/readyz never answered 200 (last: {last})\n{self.tail()}")
                await asyncio.sleep(0.02)
        # The log says ready within a readiness poll of /readyz saying so (naming the
        # configured host, e.g. 0.0.0.0, and the bound port).
        line = re.compile(rf"{_READY_LINE}https?://[^\s,]+:{self.port}\b")
        until = max(deadline, time.monotonic() + 1.0)
        while not line.search(self.log()):
            if time.monotonic() > until:
                raise DaemonError(f"/readyz answers 200 but no ready line\n{self.tail()}")
            await asyncio.sleep(0.01)
        return self.port

    async def wait_listening(self, within: float = _READY_TIMEOUT) -> int:
        """Wait for the "icespool listening" line (before the start finishes); returns
        the port, which then answers /healthz, /readyz, /metrics and /v1/status."""
        proc = self._require_proc()
        deadline = time.monotonic() + within
        while True:
            match = _LISTENING_RE.search(self.log())
            if match:
                self.port = int(match.group("port"))
                return self.port
            if proc.poll() is not None:
                raise DaemonError(
                    f"daemon exited with {_describe_exit(proc.returncode)} before it "
                    f"listened\n{self.tail()}"
                )
            if time.monotonic() > deadline:
                raise DaemonError(f"daemon not listening after {within:.0f}s\n{self.tail()}")
            await asyncio.sleep(0.02)

    def kill(self) -> int:
        """SIGKILL and reap; returns the exit status (-9 unless it had already exited)."""
        proc = self._require_proc()
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        return proc.wait(timeout=30)

    def signal(self, signum: int) -> None:
        self._require_proc().send_signal(signum)

    async def wait_exit(self, within: float) -> int:
        """Wait (without blocking the loop) for the child to exit; returns its status."""
        proc = self._require_proc()
        deadline = time.monotonic() + within
        while proc.poll() is None:
            if time.monotonic() > deadline:
                raise DaemonError(f"daemon still running after {within:.1f}s\n{self.tail()}")
            await asyncio.sleep(0.01)
        return proc.returncode

    async def wait_log(self, needle: str, within: float, *, count: int = 1) -> None:
        """Wait until ``needle`` occurs ``count`` times in this start's log."""
        deadline = time.monotonic() + within
        while self.log().count(needle) < count:
            if time.monotonic() > deadline:
                raise DaemonError(f"log never showed {needle!r} x{count}\n{self.tail()}")
            await asyncio.sleep(0.005)

    def cleanup(self) -> None:
        """Make sure no child survives the test (fixture teardown, also on failure)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=30)
        self._close_log()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    @property
    def url(self) -> str:
        if self.port is None:
            raise DaemonError("the daemon has not reported its port yet")
        return f"{'https' if self.tls is not None else 'http'}://127.0.0.1:{self.port}"

    def records_url(self, table: str = TABLE) -> str:
        return f"{self.url}/v1/tables/{table}/records"

    def flush_url(self, table: str = TABLE) -> str:
        return f"{self.url}/v1/tables/{table}/flush"

    # ------------------------------------------------------------------ HTTP helpers

    async def post_records(
        self, session: aiohttp.ClientSession, records: list[Mapping[str, Any]]
    ) -> tuple[int, str]:
        async with session.post(
            self.records_url(), data=ndjson(records), headers={"Content-Type": NDJSON}
        ) as resp:
            return resp.status, await resp.text()

    async def ingest(
        self, session: aiohttp.ClientSession, records: list[Mapping[str, Any]]
    ) -> None:
        """POST records and insist on ``200 {"accepted": len(records)}``."""
        status, text = await self.post_records(session, records)
        if status != 200 or _json(text).get("accepted") != len(records):
            raise DaemonError(
                f"ingest of {len(records)} records answered {status} {text!r}\n{self.tail()}"
            )

    async def flush(self, session: aiohttp.ClientSession) -> dict[str, Any]:
        async with session.post(self.flush_url()) as resp:
            text = await resp.text()
            if resp.status != 200:
                raise DaemonError(f"flush answered {resp.status} {text!r}\n{self.tail()}")
        return _json(text)

    async def metrics(self, session: aiohttp.ClientSession) -> str:
        async with session.get(f"{self.url}/metrics") as resp:
            text = await resp.text()
            if resp.status != 200:
                raise DaemonError(f"/metrics answered {resp.status}\n{self.tail()}")
            return text

    # ------------------------------------------------------------------ logs

    def log(self, start: int | None = None) -> str:
        """The log of one start (default: the latest)."""
        path = self.log_path if start is None else self.home.log_dir / f"start-{start:03d}.log"
        if path is None or not path.exists():
            return ""
        return path.read_text(errors="replace")

    def all_logs(self) -> str:
        return "".join(self.log(n) for n in range(1, self.starts + 1))

    def tail(self, lines: int = 40) -> str:
        text = self.log().splitlines()[-lines:]
        status = "never started"
        if self.proc is not None:
            code = self.proc.poll()
            status = "running" if code is None else _describe_exit(code)
        return (
            f"--- daemon log tail (start #{self.starts}, pid {self.pid}, {status}, "
            f"{self.log_path}) ---\n" + "\n".join(text)
        )

    # ------------------------------------------------------------------ internals

    def _require_proc(self) -> subprocess.Popen[bytes]:
        if self.proc is None:
            raise DaemonError("the daemon was never started")
        return self.proc

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None


def _json(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _describe_exit(code: int) -> str:
    if code >= 0:
        return f"exit status {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return f"exit status {code} (killed by {name})"
