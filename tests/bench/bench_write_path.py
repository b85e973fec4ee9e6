"""The daemon's write path, end to end, beside a bare limit and a naive path (issue #3).

Run: .venv/bin/python tests/bench/bench_write_path.py [--quick] [--seconds S] [--clients N]
         [--soak-seconds S] [--trials N] [--dir DIR] [--profile FILE (needs py-spy)]

Everything is measured in one run, on the same data (8-column JSON events of 163 B,
10,000 per request), with the baselines interleaved between the daemon's phases and
the best of several trials kept, because other work shares the machine's cores:

  A. HTTP ndjson ingest into a real `icespool run` subprocess: concurrent aiohttp clients
     POST pre-built bodies at full speed for --seconds, then POST /flush; rows acked,
     rows committed (counted in the Iceberg table) per second from the first request to
     the end of the flush, ack latency at peak and at half of the peak request rate,
     and the daemon's peak RSS (VmHWM).
     Baselines: (a) bare limit: `pyarrow.json` decode + `pq.write_table` (zstd), one file
     per 1,000,000 rows, no spool, no catalog; (b) naive path: `json.loads` per record +
     `Table.from_pylist` + pyiceberg `table.append` per request (SQLite catalog).
  B. In-process `Icespool` service: 4 tasks `append` pre-built 10,000-row Arrow batches
     (the table's Arrow schema) for --seconds, then flush; beside a Parquet write of the
     same batches.
  C. `icespool replay` (subprocess) of 1,000,000 records spooled in the daemon's format,
     beside the bare limit (and beside Arrow IPC read + Parquet write).
  D. RSS of the daemon while clients ingest at full speed for --soak-seconds.

Targets (issue #3): committed >= 0.5x bare limit and >= 10x naive; ack p99 <= 20 ms at
half of peak load; replay >= 0.5x bare limit; RSS bounded over a 5-minute run
(--soak-seconds 300). The script reports misses; it does not fail on them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
from _events import COLUMNS, JSON_SCHEMA, decode_body, ndjson_body

from icespool.config import Config, validate_config
from icespool.errors import BackpressureError
from icespool.iceberg._catalog import load_catalog
from icespool.lifecycle.service import Icespool
from icespool.schema import conform, parse_schema
from icespool.spool import Spool

TABLE = "bench.events"
ROWS_PER_REQUEST = 10_000
FILE_ROWS = 1_000_000  # rows per Parquet file in the bare limits: one daemon commit's worth
NDJSON = {"Content-Type": "application/x-ndjson"}
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------ results


@dataclass
class Measured:
    """A path's throughput (and latencies, when it acks requests)."""

    label: str
    rows: int
    seconds: float
    latencies: list[float] = field(default_factory=list)
    note: str = ""

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    def quantile_ms(self, q: float) -> float | None:
        return quantile_ms(self.latencies, q) if self.latencies else None


def quantile_ms(latencies: Sequence[float], q: float) -> float:
    ordered = sorted(latencies)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3


def best(results: Sequence[Measured]) -> Measured:
    return max(results, key=lambda r: r.rows_per_s)


def print_table(title: str, rows: Sequence[Measured], bare: Measured) -> None:
    print(f"\n== {title} ==")
    print(f"{'path':52} {'rows/s':>11} {'x bare':>7} {'p50 ms':>7} {'p99 ms':>7}  note")
    for r in rows:
        p50, p99 = r.quantile_ms(0.5), r.quantile_ms(0.99)
        print(
            f"{r.label:52} {r.rows_per_s:11,.0f} {r.rows_per_s / bare.rows_per_s:7.2f} "
            f"{'-' if p50 is None else f'{p50:.1f}':>7} {'-' if p99 is None else f'{p99:.1f}':>7}"
            f"  {r.note}"
        )


def mib(kib: int) -> str:
    return f"{kib / 1024:,.0f} MiB"


# ------------------------------------------------------------------ baselines


def bare_json(bodies: Sequence[bytes], total_rows: int, directory: Path) -> Measured:
    """pyarrow.json decode of whole bodies + Parquet (zstd) files of FILE_ROWS rows."""
    decode_s = write_s = 0.0
    latencies: list[float] = []  # per body: the decode alone, a floor for ack latency
    pending: list[pa.Table] = []
    rows = pending_rows = files = 0

    def write() -> float:
        nonlocal files, pending_rows
        began = time.perf_counter()
        pq.write_table(
            pa.concat_tables(pending), directory / f"bare-{files}.parquet", compression="zstd"
        )
        files += 1
        pending.clear()
        pending_rows = 0
        return time.perf_counter() - began

    start = time.perf_counter()
    i = 0
    while rows < total_rows:
        began = time.perf_counter()
        table = decode_body(bodies[i % len(bodies)])
        latencies.append(time.perf_counter() - began)
        decode_s += latencies[-1]
        i += 1
        pending.append(table)
        rows += table.num_rows
        pending_rows += table.num_rows
        if pending_rows >= FILE_ROWS:
            write_s += write()
    if pending:
        write_s += write()
    seconds = time.perf_counter() - start
    _remove(directory.glob("bare-*.parquet"))
    note = (
        f"decode {rows / decode_s:,.0f}/s, parquet {rows / write_s:,.0f}/s; "
        "p50/p99: decode of one body"
    )
    return Measured("bare limit: pyarrow.json + Parquet zstd", rows, seconds, latencies, note)


def bare_parquet(batches: Sequence[pa.RecordBatch], directory: Path) -> Measured:
    """Parquet (zstd) files of FILE_ROWS rows from ready Arrow batches."""
    start = time.perf_counter()
    rows = files = 0
    group: list[pa.RecordBatch] = []
    for index, batch in enumerate(batches):
        group.append(batch)
        if sum(b.num_rows for b in group) >= FILE_ROWS or index == len(batches) - 1:
            pq.write_table(
                pa.Table.from_batches(group),
                directory / f"bare-{files}.parquet",
                compression="zstd",
            )
            files += 1
            rows += sum(b.num_rows for b in group)
            group = []
    seconds = time.perf_counter() - start
    _remove(directory.glob("bare-*.parquet"))
    return Measured("bare limit: Parquet zstd of the Arrow batches", rows, seconds)


def bare_ipc_to_parquet(ipc_path: Path, directory: Path) -> Measured:
    """Read an Arrow IPC stream file and write it as Parquet (what a replay must do)."""
    start = time.perf_counter()
    with pa.OSFile(str(ipc_path), "rb") as source:
        table = ipc.open_stream(source).read_all()
    pq.write_table(table, directory / "bare-ipc.parquet", compression="zstd")
    seconds = time.perf_counter() - start
    _remove([directory / "bare-ipc.parquet"])
    return Measured("bare: Arrow IPC read + Parquet zstd", table.num_rows, seconds)


def naive_path(bodies: Sequence[bytes], requests: int, directory: Path) -> Measured:
    """json.loads per record + Table.from_pylist + pyiceberg table.append per request."""
    directory.mkdir(parents=True, exist_ok=True)
    catalog = load_catalog(
        "naive",
        {
            "type": "sql",
            "uri": f"sqlite:///{directory / 'catalog.db'}",
            "warehouse": (directory / "warehouse").as_uri(),
        },
    )
    catalog.create_namespace("bench")
    table = catalog.create_table("bench.naive", parse_schema(COLUMNS))
    target = table.schema().as_arrow()
    as_text = pa.schema([f.with_type(pa.string()) if f.name == "ts" else f for f in JSON_SCHEMA])
    latencies: list[float] = []
    parse_s = 0.0
    start = time.perf_counter()
    rows = 0
    for k in range(requests):
        began = time.perf_counter()
        records = [json.loads(line) for line in bodies[k % len(bodies)].splitlines()]
        data = pa.Table.from_pylist(records, schema=as_text)
        data = data.set_column(1, "ts", pc.cast(data["ts"], JSON_SCHEMA.field("ts").type))
        parsed = time.perf_counter()
        parse_s += parsed - began
        table.append(data.cast(target))
        latencies.append(time.perf_counter() - began)
        rows += len(records)
    seconds = time.perf_counter() - start
    total = int(table.current_snapshot().summary["total-records"])  # type: ignore[union-attr]
    if total != rows:
        raise RuntimeError(f"naive path committed {total} rows, expected {rows}")
    # The append's cost grows with the table's snapshot count, so show first and last.
    note = (
        f"{requests} requests; json+from_pylist {rows / parse_s:,.0f}/s; request "
        f"{latencies[0] * 1e3:.0f} ms first, {latencies[-1] * 1e3:.0f} ms last"
    )
    return Measured(
        "naive: json.loads + from_pylist + table.append", rows, seconds, latencies, note
    )


def _remove(paths: Any) -> None:
    for path in paths:
        Path(path).unlink(missing_ok=True)


# ------------------------------------------------------------------ config and catalog


def daemon_config(directory: Path, port: int, batch_timeout: str = "5s") -> dict[str, Any]:
    """One table, big commits: 1,000,000 records or ``batch_timeout``, whichever first."""
    return {
        "catalog": {
            "name": "bench",
            "type": "sql",
            "uri": f"sqlite:///{directory / 'catalog.db'}",
            "warehouse": (directory / "warehouse").as_uri(),
        },
        "spool": {"dir": str(directory / "spool")},
        "http": {"listen": f"127.0.0.1:{port}"},
        "defaults": {"max_batch_records": 1_000_000, "batch_timeout": batch_timeout},
        # JSON lines, so the bench can read each commit's time and duration back.
        "log": {"level": "info", "format": "json"},
        "tables": [{"name": TABLE, "create": True, "schema": COLUMNS}],
    }


def to_toml(raw: dict[str, Any]) -> str:
    """Enough TOML for daemon_config's shape (json strings are valid TOML strings)."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int | float):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"
        raise TypeError(type(v))

    lines: list[str] = []
    for section, body in raw.items():
        if isinstance(body, list):
            for item in body:
                lines.append(f"[[{section}]]")
                lines.extend(f"{k} = {value(v)}" for k, v in item.items())
        else:
            lines.append(f"[{section}]")
            lines.extend(f"{k} = {value(v)}" for k, v in body.items())
        lines.append("")
    return "\n".join(lines)


def committed_rows(config: Config) -> int:
    """Rows in the table's current snapshot (a fresh catalog: it sees others' commits)."""
    catalog = load_catalog(config.catalog.name, config.catalog.properties())
    snapshot = catalog.load_table(TABLE).current_snapshot()
    return 0 if snapshot is None else int(snapshot.summary["total-records"])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def icespool_command() -> list[str]:
    script = Path(sys.executable).parent / "icespool"
    return [str(script)] if script.exists() else [sys.executable, "-m", "icespool"]


# ------------------------------------------------------------------ the daemon process


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS / VmHWM (kB) from /proc; empty once the process is gone."""
    out: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(rest.split()[0])
    return out


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads) so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:13]) / CLOCK_TICKS  # utime, stime


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent busy since boot (everything but idle and iowait)."""
    values = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(values) - values[3] - values[4]) / CLOCK_TICKS


class CpuShare:
    """Cores used by the daemon, by this process and by everything else over a phase:
    other engineers' jobs on the same 2 cores explain many a slow run."""

    def __init__(self, daemon_pid: int | None) -> None:
        self.pid = daemon_pid
        self.began = time.perf_counter()
        self.start = self._now()

    def _now(self) -> tuple[float, float, float]:
        daemon = proc_cpu_seconds(self.pid) if self.pid is not None else 0.0
        return machine_busy_seconds(), daemon, proc_cpu_seconds(os.getpid())

    def text(self) -> str:
        wall = time.perf_counter() - self.began
        busy, daemon, me = (b - a for a, b in zip(self.start, self._now(), strict=True))
        others = max(0.0, busy - daemon - me)
        mine = f"daemon {daemon / wall:.2f}, bench {me / wall:.2f}"
        if self.pid is None:
            mine = f"bench {me / wall:.2f}"
        return f"cores: {mine}, others {others / wall:.2f}"


_LIVE: set[subprocess.Popen[bytes]] = set()  # killed on the way out, whatever happens


def run_main(main: Callable[[], Coroutine[Any, Any, int]], started: str) -> None:
    """A bench's entry point: ``main()`` on uvloop, exiting with its status. SIGTERM
    unwinds like Ctrl-C (the phases' finally blocks stop what they started: ``started``
    names it), and every process in `_LIVE` still running is killed on the way out."""
    import uvloop

    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        sys.exit(uvloop.run(main()))
    except KeyboardInterrupt:
        print(f"interrupted; {started} and the temporary files are gone", file=sys.stderr)
        sys.exit(130)
    finally:
        for proc in _LIVE:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


class DaemonProcess:
    """`icespool run --config` in its own session; always killed on the way out."""

    def __init__(self, directory: Path, batch_timeout: str = "5s") -> None:
        self.directory = directory
        self.port = free_port()
        self.raw = daemon_config(directory, self.port, batch_timeout)
        self.config = validate_config(self.raw)
        self.config_path = directory / "icespool.toml"
        self.log_path = directory / "daemon.log"
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(to_toml(self.raw))
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [*icespool_command(), "run", "--config", str(self.config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        _LIVE.add(self.proc)

    async def wait_ready(
        self, session: aiohttp.ClientSession, within: float = 120.0, poll: float = 0.2
    ) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"icespool run exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with session.get(f"{self.base}/readyz") as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(poll)
        raise RuntimeError(f"icespool run not ready after {within:.0f}s:\n{self.log_tail()}")

    async def flush(self, session: aiohttp.ClientSession) -> dict[str, Any]:
        url = f"{self.base}/v1/tables/{TABLE}/flush"
        async with session.post(url, timeout=aiohttp.ClientTimeout(total=600)) as resp:
            text = await resp.text()
            if resp.status != 200:
                raise RuntimeError(f"flush answered {resp.status}: {text[:500]}")
            result: dict[str, Any] = json.loads(text)
            return result

    async def metrics(self, session: aiohttp.ClientSession) -> dict[str, float]:
        """Sums of the encode/commit histograms and the commit counter from /metrics."""
        wanted = re.compile(
            r"^(icespool_(?:encode|commit)_duration_seconds_(?:sum|count)|icespool_commits_total)"
            r"\{[^}]*\} ([0-9.e+-]+)$"
        )
        out: dict[str, float] = {}
        with contextlib.suppress(aiohttp.ClientError, OSError):
            async with session.get(f"{self.base}/metrics") as resp:
                for line in (await resp.text()).splitlines():
                    if m := wanted.match(line):
                        out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
        return out

    def status(self) -> dict[str, int]:
        return proc_status(self.pid)

    def stop(self, grace: float = 120.0) -> int | None:
        """SIGTERM (the daemon commits what is pending), SIGKILL after ``grace``."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def commit_windows(self) -> list[tuple[float, float]]:
        """(start, end) wall-clock seconds of every flush job, from the commit log lines."""
        windows: list[tuple[float, float]] = []
        with contextlib.suppress(OSError):
            for line in self.log_path.read_text(errors="replace").splitlines():
                if '"duration_ms"' not in line or '"snapshot_id"' not in line:
                    continue
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    entry = json.loads(line)
                    stamp = str(entry["timestamp"]).replace("Z", "+00:00")
                    end = datetime.fromisoformat(stamp).timestamp()
                    windows.append((end - float(entry["duration_ms"]) / 1e3, end))
        return windows

    def log_tail(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""


# ------------------------------------------------------------------ HTTP load


@dataclass
class Load:
    accepted: int = 0
    requests: int = 0
    rejected: int = 0  # 503 answers (backpressure)
    latencies: list[float] = field(default_factory=list)
    spans: list[tuple[float, float]] = field(default_factory=list)  # wall clock, per ack
    first_send: float = 0.0
    last_ack: float = 0.0

    @property
    def ack_seconds(self) -> float:
        return self.last_ack - self.first_send


async def http_load(
    session: aiohttp.ClientSession,
    url: str,
    bodies: Sequence[bytes],
    clients: int,
    seconds: float,
    rate: float | None = None,
) -> Load:
    """``clients`` loops POSTing bodies until ``seconds`` pass, at full speed or at ``rate``
    requests/s in total (a fixed schedule per client, staggered, so the load is even)."""
    load = Load(first_send=time.perf_counter())
    deadline = load.first_send + seconds
    interval = clients / rate if rate else 0.0

    async def client(index: int) -> None:
        k = index * 7
        next_at = load.first_send + index * interval / clients
        while True:
            now = time.perf_counter()
            if interval:
                if next_at >= deadline:
                    return
                if next_at > now:
                    await asyncio.sleep(next_at - now)
                next_at += interval
            elif now >= deadline:
                return
            body = bodies[k % len(bodies)]
            k += 1
            wall = time.time()
            began = time.perf_counter()
            async with session.post(url, data=body, headers=NDJSON) as resp:
                payload = await resp.read()
            done = time.perf_counter()
            if resp.status == 200:
                load.accepted += int(json.loads(payload)["accepted"])
                load.requests += 1
                load.latencies.append(done - began)
                load.spans.append((wall, wall + done - began))
                load.last_ack = max(load.last_ack, done)
            elif resp.status == 503:
                load.rejected += 1
                retry_after = float(resp.headers.get("Retry-After", "1"))
                await asyncio.sleep(min(retry_after, 0.5))
            else:
                raise RuntimeError(f"ingest answered {resp.status}: {payload[:500]!r}")

    await asyncio.gather(*(client(i) for i in range(clients)))
    return load


def latency_split(load: Load, windows: Sequence[tuple[float, float]]) -> str:
    """p99 of the requests that overlapped a flush job (seal, encode, commit) and of the rest."""
    during: list[float] = []
    outside: list[float] = []
    for (sent, acked), latency in zip(load.spans, load.latencies, strict=True):
        overlaps = any(sent < end and acked > start for start, end in windows)
        (during if overlaps else outside).append(latency)

    def p99(values: list[float]) -> str:
        return f"{quantile_ms(values, 0.99):.1f}" if values else "-"

    return (
        f"{len(during)} of {len(load.latencies)} requests overlapped a flush job: p99 "
        f"{p99(during)} ms; the others: p99 {p99(outside)} ms"
    )


class Profiler:
    """py-spy (if installed) on the daemon for one phase; prints where its time went."""

    def __init__(self, pid: int, seconds: float, out: Path | None) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.out = out
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if out is None or not Path(spy).exists():
            if out is not None:
                print("  (py-spy is not installed; no profile)")
            return
        options = f"record -p {pid} -r 100 -d {int(seconds)} --threads --nonblocking -f raw -o"
        self.proc = subprocess.Popen(
            [spy, *options.split(), str(out)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def report(self, top: int = 15) -> None:
        if self.proc is None or self.out is None:
            return
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        leaves: dict[str, int] = {}
        threads: dict[str, int] = {}
        with contextlib.suppress(OSError):
            for line in self.out.read_text().splitlines():
                stack, _, count = line.rpartition(" ")
                frames = stack.split(";")
                thread = re.sub(r"\(\d+\)|_\d+$", "", frames[0]).strip()
                threads[thread] = threads.get(thread, 0) + int(count)
                leaves[frames[-1]] = leaves.get(frames[-1], 0) + int(count)
        total = sum(leaves.values()) or 1
        print(f"  py-spy: {total} samples (100/s per busy thread); by thread:")
        for name, n in sorted(threads.items(), key=lambda x: -x[1]):
            print(f"    {n / total:6.1%}  {name}")
        print("  by innermost Python frame:")
        for name, n in sorted(leaves.items(), key=lambda x: -x[1])[:top]:
            print(f"    {n / total:6.1%}  {name}")


class RssSampler:
    """Samples a process's VmRSS every ``every`` seconds in the background."""

    def __init__(self, pid: int, every: float = 1.0) -> None:
        self.pid = pid
        self.every = every
        self.samples: list[tuple[float, int]] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> RssSampler:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        start = time.perf_counter()
        while True:
            rss = proc_status(self.pid).get("VmRSS")
            if rss is not None:
                self.samples.append((time.perf_counter() - start, rss))
            await asyncio.sleep(self.every)


# ------------------------------------------------------------------ A and D: HTTP


@dataclass
class HttpResults:
    acked: list[Measured] = field(default_factory=list)
    committed: list[Measured] = field(default_factory=list)
    half: Measured | None = None
    hwm_kib: int = 0
    soak: list[tuple[float, int]] = field(default_factory=list)
    soak_rate: float = 0.0
    notes: list[str] = field(default_factory=list)


class BareServer:
    """tests/bench/_bare_server.py in a subprocess: pyarrow.json per body, then the ack."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.proc: subprocess.Popen[bytes] | None = None
        self.base = ""

    async def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        port_file = self.directory / "port"
        script = Path(__file__).with_name("_bare_server.py")
        self.proc = subprocess.Popen(
            [sys.executable, str(script), str(port_file), str(self.directory)],
            start_new_session=True,
        )
        _LIVE.add(self.proc)
        deadline = time.monotonic() + 60
        while not port_file.exists() or not port_file.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the bare server did not start")
            await asyncio.sleep(0.05)
        self.base = f"http://127.0.0.1:{port_file.read_text()}"

    async def paced(
        self,
        session: aiohttp.ClientSession,
        bodies: Sequence[bytes],
        clients: int,
        seconds: float,
        rate: float,
    ) -> Measured:
        assert self.proc is not None
        cpu = CpuShare(self.proc.pid)
        load = await http_load(session, f"{self.base}/records", bodies, clients, seconds, rate)
        async with session.post(f"{self.base}/flush") as resp:
            await resp.read()
        cores = cpu.text().replace("daemon", "server", 1)
        return Measured(
            "bare server, acked",
            load.accepted,
            load.ack_seconds,
            load.latencies,
            note=f"{load.requests / load.ack_seconds:.1f} req/s; {cores}",
        )

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


async def ingest_and_flush(
    daemon: DaemonProcess,
    session: aiohttp.ClientSession,
    bodies: Sequence[bytes],
    clients: int,
    seconds: float,
    rate: float | None,
    label: str,
) -> tuple[Measured, Measured, Load]:
    before = await asyncio.to_thread(committed_rows, daemon.config)
    cpu = CpuShare(daemon.pid)
    url = f"{daemon.base}/v1/tables/{TABLE}/records"
    load = await http_load(session, url, bodies, clients, seconds, rate)
    await daemon.flush(session)
    flushed = time.perf_counter()
    cpu_text = cpu.text()
    after = await asyncio.to_thread(committed_rows, daemon.config)
    committed = after - before
    if committed != load.accepted:
        raise RuntimeError(f"{label}: {load.accepted} rows acked but {committed} committed")
    wall = flushed - load.first_send
    acked = Measured(
        f"icespool HTTP {label}, acked",
        load.accepted,
        load.ack_seconds,
        load.latencies,
        note=f"{load.requests / load.ack_seconds:.1f} req/s, {load.rejected} x 503",
    )
    done = Measured(
        f"icespool HTTP {label}, committed",
        committed,
        wall,
        note=cpu_text,
    )
    return acked, done, load


async def run_http(
    directory: Path,
    bodies: Sequence[bytes],
    args: argparse.Namespace,
    between: Callable[[], Awaitable[None]],
) -> HttpResults:
    results = HttpResults()
    daemon = DaemonProcess(directory)
    connector = aiohttp.TCPConnector(limit=args.clients * 2)
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        daemon.start()
        try:
            began = time.perf_counter()
            await daemon.wait_ready(session)
            results.notes.append(f"daemon ready in {time.perf_counter() - began:.1f}s")
            # Warm-up: first requests pay for imports, first segment files, first commit.
            await ingest_and_flush(daemon, session, bodies, args.clients, 1.0, None, "warm-up")
            loads: list[Load] = []
            for trial in range(args.trials):
                if trial:
                    await between()
                acked, committed, load = await ingest_and_flush(
                    daemon, session, bodies, args.clients, args.seconds, None, "peak"
                )
                results.acked.append(acked)
                results.committed.append(committed)
                loads.append(load)
                print(
                    f"  A peak trial {trial + 1}: acked {acked.rows_per_s:,.0f} rows/s, "
                    f"committed {committed.rows_per_s:,.0f} rows/s",
                    flush=True,
                )
            peak = max(loads, key=lambda x: x.requests / x.ack_seconds)
            half_rate = 0.5 * peak.requests / peak.ack_seconds
            profiler = Profiler(
                daemon.pid, args.seconds, Path(args.profile) if args.profile else None
            )
            acked, half_done, half_load = await ingest_and_flush(
                daemon, session, bodies, args.clients, args.seconds, half_rate, "half load"
            )
            acked.note += f"; {half_done.note}"
            profiler.report()
            windows = daemon.commit_windows()
            results.notes.append("at peak, " + latency_split(peak, windows))
            results.notes.append("at half load, " + latency_split(half_load, windows))
            acked.label = f"icespool HTTP at half peak ({half_rate:.1f} req/s), acked"
            results.half = acked
            results.hwm_kib = daemon.status().get("VmHWM", 0)
            m = await daemon.metrics(session)
            if m.get("icespool_commits_total"):
                results.notes.append(
                    f"daemon so far: {m['icespool_commits_total']:.0f} commits, encode "
                    f"{m.get('icespool_encode_duration_seconds_sum', 0):.1f}s, commit jobs "
                    f"{m.get('icespool_commit_duration_seconds_sum', 0):.1f}s in total"
                )
            if args.soak_seconds > 0:
                print(f"  D soak: {args.soak_seconds:.0f}s at full speed", flush=True)
                async with RssSampler(daemon.pid) as sampler:
                    acked, _, _ = await ingest_and_flush(
                        daemon, session, bodies, args.clients, args.soak_seconds, None, "soak"
                    )
                results.soak = sampler.samples
                results.soak_rate = acked.rows_per_s
            code = await asyncio.to_thread(daemon.stop)
            if code != 0:
                results.notes.append(f"daemon exit status on SIGTERM: {code}")
        except Exception:
            daemon.kill()
            print(f"--- daemon log tail ---\n{daemon.log_tail()}", file=sys.stderr)
            raise
        finally:
            daemon.kill()
    return results


@dataclass
class LatencyRun:
    """One run of the latency mode: bare limit, peak, then paced loads below that peak."""

    bare: Measured
    committed: Measured
    paced: dict[float, Measured]  # fraction of the peak request rate -> acks at that load
    bare_paced: dict[float, Measured]  # the bare server at the same request rates
    notes: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return self.committed.rows_per_s / self.bare.rows_per_s

    @property
    def half(self) -> Measured:
        return self.paced[0.5]


async def run_http_latency(
    directory: Path, bodies: Sequence[bytes], args: argparse.Namespace
) -> list[LatencyRun]:
    """``--http-only``: ``args.trials`` runs against one daemon, each measuring the
    bare limit, the committed rate at full speed (the peak) and the ack latency at
    half of that run's peak request rate (paced), flushes running (batch_timeout)."""
    runs: list[LatencyRun] = []
    daemon = DaemonProcess(directory, args.batch_timeout)
    server = BareServer(directory / "bare-server")
    connector = aiohttp.TCPConnector(limit=args.clients * 2)
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        daemon.start()
        try:
            await server.start()
            await daemon.wait_ready(session)
            await ingest_and_flush(daemon, session, bodies, args.clients, 1.0, None, "warm-up")
            for trial in range(args.trials):
                bare = await asyncio.to_thread(bare_json, bodies, FILE_ROWS, directory)
                _, committed, peak = await ingest_and_flush(
                    daemon, session, bodies, args.clients, args.seconds, None, "peak"
                )
                peak_rate = peak.requests / peak.ack_seconds
                last = trial == args.trials - 1
                run = LatencyRun(bare, committed, {}, {})
                for fraction in args.loads:
                    rate = fraction * peak_rate
                    profiled = args.profile and last and fraction == 0.5
                    profiler = Profiler(
                        daemon.pid, args.seconds, Path(args.profile) if profiled else None
                    )
                    acked, done, load = await ingest_and_flush(
                        daemon, session, bodies, args.clients, args.seconds, rate, f"{fraction:.0%}"
                    )
                    profiler.report()
                    acked.label = f"{fraction:.0%} of peak ({rate:.1f} req/s), acked"
                    acked.note += f"; {done.note}"
                    run.paced[fraction] = acked
                    run.bare_paced[fraction] = await server.paced(
                        session, bodies, args.clients, args.seconds, rate
                    )
                    windows = daemon.commit_windows()
                    run.notes.append(f"at {fraction:.0%} of peak, " + latency_split(load, windows))
                runs.append(run)
                print(
                    f"  run {trial + 1}: bare {bare.rows_per_s:,.0f} rows/s, committed "
                    f"{committed.rows_per_s:,.0f} rows/s ({run.ratio:.2f}x); peak "
                    f"{peak_rate:.1f} req/s\n    peak: {committed.note}",
                    flush=True,
                )
                for (fraction, acked), note in zip(run.paced.items(), run.notes, strict=True):
                    print(
                        f"    {fraction:.0%} of peak: ack p50 {acked.quantile_ms(0.5):.1f} ms, "
                        f"p99 {acked.quantile_ms(0.99):.1f} ms, max "
                        f"{max(acked.latencies) * 1e3:.1f} ms ({len(acked.latencies)} requests); "
                        f"{note.split(', ', 1)[1]}\n      {acked.note}",
                        flush=True,
                    )
                    floor = run.bare_paced[fraction]
                    print(
                        f"      bare server at the same rate: ack p50 "
                        f"{floor.quantile_ms(0.5):.1f} ms, p99 {floor.quantile_ms(0.99):.1f} ms; "
                        f"{floor.note}",
                        flush=True,
                    )
            await asyncio.to_thread(daemon.stop)
        except Exception:
            daemon.kill()
            print(f"--- daemon log tail ---\n{daemon.log_tail()}", file=sys.stderr)
            raise
        finally:
            daemon.kill()
            server.kill()
    return runs


def print_latency_summary(runs: Sequence[LatencyRun], args: argparse.Namespace) -> None:
    def spread(values: Sequence[float], fmt: str) -> str:
        ordered = sorted(values)
        mid = ordered[len(ordered) // 2]
        return " / ".join(format(v, fmt) for v in (ordered[0], mid, ordered[-1]))

    rows = [
        ("bare limit rows/s", spread([r.bare.rows_per_s for r in runs], ",.0f"), ""),
        ("icespool committed rows/s", spread([r.committed.rows_per_s for r in runs], ",.0f"), ""),
        ("committed / bare (same run)", spread([r.ratio for r in runs], ".2f"), ">= 0.95"),
        # The floor of an ack: pyarrow.json of one body alone, in this process.
        (
            "bare decode of one body p50 ms",
            spread([r.bare.quantile_ms(0.5) or 0 for r in runs], ".1f"),
            "",
        ),
        (
            "bare decode of one body p99 ms",
            spread([r.bare.quantile_ms(0.99) or 0 for r in runs], ".1f"),
            "",
        ),
    ]
    for fraction in args.loads:
        paced = [r.paced[fraction] for r in runs]
        target = "<= 20" if fraction == 0.5 else ""
        floors = [r.bare_paced[fraction] for r in runs]
        for q in (0.5, 0.99):
            rows.append(
                (
                    f"ack p{q * 100:.0f} ms at {fraction:.0%} of peak",
                    spread([h.quantile_ms(q) or 0 for h in paced], ".1f"),
                    target if q == 0.99 else "",
                )
            )
            rows.append(
                (
                    "  bare server, same rate",
                    spread([h.quantile_ms(q) or 0 for h in floors], ".1f"),
                    "",
                )
            )
    print(
        f"\n== HTTP latency mode: {len(runs)} runs, {args.clients} clients, "
        f"{args.rows_per_request:,} events/request, batch_timeout {args.batch_timeout}, "
        f"{args.seconds:.0f}s phases =="
    )
    print(f"{'':32} {'min / median / max':>36}  target")
    for label, value, target in rows:
        print(f"{label:32} {value:>36}  {target}")


# ------------------------------------------------------------------ B: in-process append


async def run_in_process(
    directory: Path, batches: Sequence[pa.RecordBatch], tasks: int, seconds: float
) -> tuple[Measured, Measured]:
    config = validate_config(daemon_config(directory, 0))
    backpressure = 0
    latencies: list[float] = []
    acked = 0
    async with Icespool(config) as ice:
        writer = ice.writer(TABLE)
        ready = [conform(b, writer.arrow_schema) for b in batches]
        cpu = CpuShare(None)
        start = time.perf_counter()
        deadline = start + seconds
        last_ack = start

        async def appender(index: int) -> None:
            nonlocal acked, backpressure, last_ack
            k = index
            while time.perf_counter() < deadline:
                began = time.perf_counter()
                try:
                    rows = await writer.append(ready[k % len(ready)])
                except BackpressureError:
                    backpressure += 1
                    await asyncio.sleep(0.05)
                    continue
                acked += rows
                last_ack = time.perf_counter()
                latencies.append(last_ack - began)
                k += tasks

        await asyncio.gather(*(appender(i) for i in range(tasks)))
        await writer.flush()
        flushed = time.perf_counter()
        cpu_text = cpu.text()
        committed = await asyncio.to_thread(committed_rows, config)
    if committed != acked:
        raise RuntimeError(f"in-process: {acked} rows acked but {committed} committed")
    note = f"{tasks} tasks, {backpressure} x backpressure"
    return (
        Measured("icespool append (in-process), acked", acked, last_ack - start, latencies, note),
        Measured(
            "icespool append (in-process), committed", committed, flushed - start, [], cpu_text
        ),
    )


# ------------------------------------------------------------------ C: replay


@dataclass
class ReplayResult:
    gross: Measured
    net: Measured
    startup_s: float
    fill: Measured


async def run_replay(
    directory: Path, batches: Sequence[pa.RecordBatch], total_rows: int, trials: int
) -> ReplayResult:
    raw = daemon_config(directory, 0)
    config = validate_config(raw)
    config_path = directory / "icespool.toml"
    directory.mkdir(parents=True, exist_ok=True)
    config_path.write_text(to_toml(raw))
    async with Icespool(config) as ice:  # creates the table; nothing to commit
        schema = ice.writer(TABLE).arrow_schema
    ready = [conform(b, schema) for b in batches]

    async def replay() -> tuple[float, int]:
        """Seconds until `icespool replay` exits, and the commits it logged."""
        began = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(
            *icespool_command(),
            "replay",
            "--config",
            str(config_path),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await proc.communicate()
        seconds = time.perf_counter() - began
        text = out.decode(errors="replace")
        if proc.returncode != 0:
            raise RuntimeError(f"icespool replay exited {proc.returncode}:\n{text[-3000:]}")
        return seconds, sum('"snapshot_id"' in line for line in text.splitlines())

    # The fixed cost of a replay process (interpreter, imports, catalog, table load),
    # measured on an empty spool so the net rate can be shown too.
    startup = min([(await replay())[0] for _ in range(2)])

    fills: list[Measured] = []
    runs: list[Measured] = []
    for _ in range(trials):
        before = await asyncio.to_thread(committed_rows, config)
        spool = Spool(
            config.spool.dir,
            durability=config.spool.durability,
            max_bytes=config.spool.max_bytes,
            segment_max_bytes=config.spool.segment_max_bytes,
        )
        rows = 0
        began = time.perf_counter()
        async with spool:
            k = 0
            while rows < total_rows:
                batch = ready[k % len(ready)]
                await spool.append(TABLE, batch)
                rows += batch.num_rows
                k += 1
        fills.append(
            Measured("spool fill (Spool.append, 1 task)", rows, time.perf_counter() - began)
        )
        seconds, commits = await replay()
        committed = await asyncio.to_thread(committed_rows, config) - before
        if committed != rows:
            raise RuntimeError(f"replay committed {committed} rows of {rows} spooled")
        left = [p for p in Path(config.spool.dir).rglob("*.arrow") if p.is_file()]
        if left:
            raise RuntimeError(f"replay exited 0 but left {len(left)} segment files")
        note = f"{rows:,} rows in {commits} commit(s), exit 0, spool empty"
        runs.append(Measured("icespool replay (process wall time)", rows, seconds, note=note))
    gross, fill = best(runs), best(fills)
    if len(runs) > 1:
        gross.note = f"best of {len(runs)}; {gross.note}"
    return ReplayResult(
        gross=gross,
        net=Measured(
            "icespool replay (minus empty-spool replay)",
            gross.rows,
            max(gross.seconds - startup, 1e-9),
            note=f"empty-spool replay {startup:.2f}s",
        ),
        startup_s=startup,
        fill=fill,
    )


# ------------------------------------------------------------------ main


def rss_summary(samples: Sequence[tuple[float, int]]) -> tuple[str, bool]:
    """Start/peak/end and a verdict: bounded when the last quarter does not top the
    second quarter's peak by more than 10% (steady growth would)."""
    values = [kib for _, kib in samples]
    if len(values) < 8:
        return "too few samples", True
    q = len(values) // 4
    early, late = max(values[q : 2 * q]), max(values[3 * q :])
    bounded = late <= early * 1.10
    text = (
        f"start {mib(values[0])}, peak {mib(max(values))}, end {mib(values[-1])}; "
        f"peak of 2nd quarter {mib(early)}, of last quarter {mib(late)} "
        f"({len(values)} samples over {samples[-1][0]:.0f}s)"
    )
    return text, bounded


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, help="duration of each load phase (A, B)")
    parser.add_argument("--clients", type=int, default=4, help="concurrent HTTP clients")
    parser.add_argument("--quick", action="store_true", help="short run (under a minute)")
    parser.add_argument("--soak-seconds", type=float, help="RSS run (D); 0 skips it")
    parser.add_argument("--trials", type=int, help="peak runs of A and of each bare limit")
    parser.add_argument("--naive-requests", type=int, help="requests of the naive path")
    parser.add_argument("--replay-rows", type=int, default=1_000_000, help="rows replayed (C)")
    parser.add_argument("--dir", default=None, help="directory on the disk to measure")
    parser.add_argument(
        "--profile", metavar="FILE", help="py-spy the daemon at half load into FILE (raw)"
    )
    parser.add_argument(
        "--http-only",
        action="store_true",
        help="only the HTTP figures of issue #17: --trials runs (default 3) of bare limit, "
        "peak and half-peak ack latency, min/median/max",
    )
    parser.add_argument(
        "--loads",
        default="0.1,0.25,0.5",
        help="--http-only: fractions of the peak request rate to measure ack latency at",
    )
    parser.add_argument(
        "--rows-per-request",
        type=int,
        default=ROWS_PER_REQUEST,
        help="--http-only: events per request body",
    )
    parser.add_argument(
        "--batch-timeout", help="the daemon's batch_timeout (default 5s; 1s with --http-only)"
    )
    args = parser.parse_args()
    args.loads = sorted({float(f) for f in args.loads.split(",")} | {0.5})
    quick = args.quick
    args.batch_timeout = args.batch_timeout or ("1s" if args.http_only else "5s")
    if args.http_only:
        return await main_http_only(args)
    args.seconds = args.seconds or (5.0 if quick else 15.0)
    args.soak_seconds = (
        args.soak_seconds if args.soak_seconds is not None else (10.0 if quick else 60.0)
    )
    args.trials = args.trials or (1 if quick else 2)
    args.naive_requests = args.naive_requests or (5 if quick else 30)

    run_started = time.perf_counter()
    directory = Path(tempfile.mkdtemp(prefix="icespool-bench-write-", dir=args.dir))
    load1, load5, _ = os.getloadavg()
    print(
        f"event loop: uvloop; cores: {len(os.sched_getaffinity(0))}; load average "
        f"{load1:.1f} (1 min), {load5:.1f} (5 min); disk: {directory}"
    )
    print(
        f"phases: {args.seconds:.0f}s each, {args.clients} clients, {args.trials} peak "
        f"trial(s), soak {args.soak_seconds:.0f}s",
        flush=True,
    )
    try:
        began = time.perf_counter()
        bodies = [ndjson_body(ROWS_PER_REQUEST, seed) for seed in range(20)]
        batches = [decode_body(b).combine_chunks().to_batches()[0] for b in bodies]
        bytes_per_event = sum(len(b) for b in bodies) / (len(bodies) * ROWS_PER_REQUEST)
        print(
            f"data: {len(bodies)} distinct bodies of {ROWS_PER_REQUEST:,} events, "
            f"{bytes_per_event:.0f} B/event ({time.perf_counter() - began:.1f}s to build)"
        )

        bare_runs: list[Measured] = []
        parquet_runs: list[Measured] = []
        ipc_runs: list[Measured] = []
        naive_runs: list[Measured] = []
        ipc_path = directory / "bare.arrow"
        with pa.OSFile(str(ipc_path), "wb") as sink, ipc.new_stream(sink, batches[0].schema) as w:
            for k in range(max(1, args.replay_rows // ROWS_PER_REQUEST)):
                w.write_batch(batches[k % len(batches)])

        async def baselines() -> None:
            bare_runs.append(await asyncio.to_thread(bare_json, bodies, FILE_ROWS, directory))
            parquet_runs.append(
                await asyncio.to_thread(
                    bare_parquet, [batches[k % 20] for k in range(100)], directory
                )
            )
            ipc_runs.append(await asyncio.to_thread(bare_ipc_to_parquet, ipc_path, directory))
            # A fresh table each time: the append's cost grows with the snapshot count.
            naive_dir = directory / f"naive-{len(naive_runs)}"
            naive_runs.append(
                await asyncio.to_thread(naive_path, bodies, args.naive_requests, naive_dir)
            )
            shutil.rmtree(naive_dir, ignore_errors=True)
            print(
                f"  bare limit: {bare_runs[-1].rows_per_s:,.0f} rows/s ({bare_runs[-1].note})\n"
                f"  naive: {naive_runs[-1].rows_per_s:,.0f} rows/s ({naive_runs[-1].note})",
                flush=True,
            )

        print("\nbaselines", flush=True)
        await baselines()

        print("\nA. HTTP ingest (daemon subprocess)", flush=True)
        http = await run_http(directory / "http", bodies, args, baselines)
        await baselines()

        print("\nB. in-process append", flush=True)
        b_acked, b_committed = await run_in_process(directory / "inproc", batches, 4, args.seconds)
        await baselines()

        print("\nC. replay", flush=True)
        replay = await run_replay(directory / "replay", batches, args.replay_rows, args.trials)
        if not quick:
            await baselines()
    finally:
        shutil.rmtree(directory, ignore_errors=True)

    bare = best(bare_runs)
    bare_pq = best(parquet_runs)
    bare_ipc = best(ipc_runs)
    naive = best(naive_runs)
    naive.note = f"best of {len(naive_runs)}; " + naive.note
    peak_acked, peak_committed = best(http.acked), best(http.committed)
    assert http.half is not None
    bare.note = f"best of {len(bare_runs)}; " + bare.note
    print_table(
        f"A. HTTP ndjson -> committed Iceberg rows ({args.clients} clients, "
        f"{ROWS_PER_REQUEST:,} events/request)",
        [bare, naive, peak_acked, peak_committed, http.half],
        bare,
    )
    print(f"daemon peak RSS (VmHWM) after A: {mib(http.hwm_kib)}")
    for note in http.notes:
        print(note)

    print_table(
        "B. in-process append of 10,000-row Arrow batches", [bare_pq, b_acked, b_committed], bare_pq
    )
    print(f"x JSON bare limit: committed {b_committed.rows_per_s / bare.rows_per_s:.2f}")

    print_table(
        f"C. replay of {replay.gross.rows:,} spooled records",
        [bare, bare_ipc, replay.fill, replay.gross, replay.net],
        bare,
    )

    rss_verdict = "-"
    if http.soak:
        text, bounded = rss_summary(http.soak)
        print(
            f"\n== D. daemon RSS over {args.soak_seconds:.0f}s at full speed "
            f"({http.soak_rate:,.0f} rows/s acked) ==\n{text}"
        )
        if args.soak_seconds < 60:
            rss_verdict = "too short to judge; run with --soak-seconds 300"
        else:
            rss_verdict = "ok" if bounded else "MISSED (grew in the last quarter)"

    half_p99 = http.half.quantile_ms(0.99) or 0.0
    committed_x_bare = peak_committed.rows_per_s / bare.rows_per_s
    committed_x_naive = peak_committed.rows_per_s / naive.rows_per_s
    replay_x_bare = replay.gross.rows_per_s / bare.rows_per_s
    checks: list[tuple[str, float, str, bool | None]] = [
        ("committed / bare limit", committed_x_bare, ">= 0.5", committed_x_bare >= 0.5),
        ("committed / naive", committed_x_naive, ">= 10", committed_x_naive >= 10),
        ("ack p99 at half load (ms)", half_p99, "<= 20", half_p99 <= 20),
        ("replay / bare limit (process wall)", replay_x_bare, ">= 0.5", replay_x_bare >= 0.5),
        ("replay / bare limit (net of startup)", replay.net.rows_per_s / bare.rows_per_s, "", None),
        (
            "in-process committed / Parquet of batches",
            b_committed.rows_per_s / bare_pq.rows_per_s,
            "",
            None,
        ),
    ]
    print("\n== ratios ==")
    for label, value, target, ok in checks:
        mark = "-" if ok is None else "ok" if ok else "MISSED"
        print(f"{label:44} {value:8.2f}  {'target ' + target if target else '':15}  {mark}")
    print(f"{'RSS bounded over the soak':44} {'':8}  {'':15}  {rss_verdict}")
    load1, _, _ = os.getloadavg()
    print(f"\nrun took {time.perf_counter() - run_started:.0f}s; load average now {load1:.1f}")
    return 0


async def main_http_only(args: argparse.Namespace) -> int:
    args.seconds = args.seconds or (5.0 if args.quick else 15.0)
    args.trials = args.trials or 3
    directory = Path(tempfile.mkdtemp(prefix="icespool-bench-http-", dir=args.dir))
    load1, load5, _ = os.getloadavg()
    print(
        f"cores: {len(os.sched_getaffinity(0))}; load average {load1:.1f} (1 min), "
        f"{load5:.1f} (5 min); disk: {directory}",
        flush=True,
    )
    try:
        bodies = [ndjson_body(args.rows_per_request, seed) for seed in range(20)]
        runs = await run_http_latency(directory / "http", bodies, args)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print_latency_summary(runs, args)
    return 0


if __name__ == "__main__":
    run_main(main, "the daemon")
