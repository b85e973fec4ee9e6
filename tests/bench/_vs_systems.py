"""bench_vs_connect.py's two contenders and what it measures on each, the same way for both.

A contender is one process tree that consumes a Kafka topic into an Iceberg table of the
shared catalog: the Iceberg Kafka Connect sink (`SinkContender`: one ConnectStandalone
JVM, support/iceberg_sink.py) or icespool (`DaemonContender`: one `icespool run`,
bench_kafka's KafkaDaemon). Both answer ``start()``, ``pid``, ``assigned_at()`` (epoch time
its consumer was last handed partitions, from its log), ``kill9()`` (SIGKILL to its whole
session) and ``stop()``.

What is measured is read from outside, identically for both: the table's rows as the
catalog shows them (`Visible`, a pyiceberg load every 50 ms), CPU seconds and RSS of the
process tree from /proc (`TreeSampler`: the root and every descendant, every 100 ms), and
the finished table's rows, distinct ids, data files and snapshots (`table_report`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

import pyarrow.compute as pc
import pyarrow.parquet as pq
from bench_kafka import KafkaDaemon, assigned_at
from bench_write_path import _LIVE, CLOCK_TICKS
from support.iceberg_sink import IcebergSink

from icespool.config import validate_config
from icespool.iceberg._catalog import load_catalog

__all__ = [
    "Contender",
    "DaemonContender",
    "SinkContender",
    "TableReport",
    "TreeSampler",
    "Visible",
    "table_report",
]


class Contender(Protocol):
    label: str
    table: str

    @property
    def pid(self) -> int: ...

    @property
    def spawned(self) -> bool: ...

    def start(self) -> None: ...

    def assigned_at(self) -> float: ...

    def failure(self) -> str | None: ...

    def kill9(self) -> None: ...

    def stop(self) -> None: ...

    def log_tail(self) -> str: ...


class SinkContender:
    """The Iceberg sink in a Connect standalone worker (JVM options as users run it)."""

    label = "Connect sink"

    def __init__(self, root: Path, bootstrap: str, table: str, **options: Any) -> None:
        self.table = table
        self.sink = IcebergSink(root, bootstrap, table=table, **options)

    @property
    def pid(self) -> int:
        return self.sink.pid

    @property
    def spawned(self) -> bool:
        return self.sink.worker.process is not None

    def start(self) -> None:
        try:
            self.sink.start()
        finally:
            if self.sink.worker.process is not None:  # killed on the bench's way out
                _LIVE.add(self.sink.worker.process)

    def assigned_at(self) -> float:
        return self.sink.assigned_at()

    def failure(self) -> str | None:
        """A FAILED connector or task (its trace), or the JVM's exit."""
        process = self.sink.worker.process
        if process is not None and process.poll() is not None:
            return f"Kafka Connect exited with {process.returncode}"
        with contextlib.suppress(Exception):
            status = self.sink.worker.status()
            for part in [status.get("connector", {}), *status.get("tasks", [])]:
                if part.get("state") == "FAILED":
                    return str(part.get("trace", "FAILED"))[:3000]
        return None

    def kill9(self) -> None:
        self.sink.kill()

    def stop(self) -> None:
        # A sink keeps nothing that a stop would save: what is not committed is re-read.
        self.sink.kill()

    def log_tail(self) -> str:
        return self.sink.log_tail()


class DaemonContender:
    """`icespool run` with one [[kafka]] source on ``topic`` into ``table``."""

    label = "icespool"

    def __init__(
        self,
        root: Path,
        bootstrap: str,
        table: str,
        *,
        topic: str,
        group: str,
        batch_timeout: str,
        catalog: dict[str, Any],
        columns: list[dict[str, object]],
        properties: dict[str, str],
    ) -> None:
        self.table = table
        self.daemon = KafkaDaemon(root, bootstrap, topic, group, batch_timeout)
        raw = self.daemon.raw
        raw["catalog"] = dict(catalog)
        raw["tables"] = [
            {"name": table, "create": True, "schema": columns, "properties": properties}
        ]
        raw["kafka"][0]["table"] = table
        self.daemon.config = validate_config(raw)

    @property
    def pid(self) -> int:
        return self.daemon.pid

    @property
    def spawned(self) -> bool:
        return self.daemon.proc is not None

    def start(self) -> None:
        self.daemon.start()

    def assigned_at(self) -> float:
        return assigned_at(self.daemon.log_path)

    def failure(self) -> str | None:
        proc = self.daemon.proc
        if proc is not None and proc.poll() is not None:
            return f"icespool run exited with {proc.returncode}"
        return None

    def kill9(self) -> None:
        proc = self.daemon.proc
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)

    def stop(self) -> None:
        self.daemon.stop()
        self.kill9()

    def log_tail(self) -> str:
        return self.daemon.log_tail()


# ------------------------------------------------------------------ measuring


def _tree(root: int) -> list[int]:
    """``root`` and its descendants (one /proc pass)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            with open(f"/proc/{entry.name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def _cpu_rss(pid: int) -> tuple[float, int]:
    """CPU seconds (own + reaped children's) and RSS (KiB) of one process; 0 when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        rss_pages = int(fields[21])
    except (OSError, IndexError, ValueError):
        return 0.0, 0
    cpu = sum(int(x) for x in fields[11:15]) / CLOCK_TICKS  # utime stime cutime cstime
    return cpu, rss_pages * (os.sysconf("SC_PAGE_SIZE") // 1024)


class TreeSampler(threading.Thread):
    """CPU seconds and RSS of a process tree every ``every`` s: (time, cpu, rss KiB)."""

    def __init__(self, pid: int, every: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.every = every
        self.samples: list[tuple[float, float, int]] = []
        self.stop_event = threading.Event()
        self._members: list[int] = []
        self._passes = 0

    def sample(self) -> None:
        if self._passes % 10 == 0:  # new children are rare: rescan /proc once a second
            self._members = _tree(self.pid)
        self._passes += 1
        cpu = rss = 0
        for member in self._members:
            c, r = _cpu_rss(member)
            cpu += c  # type: ignore[assignment]
            rss += r
        self.samples.append((time.time(), float(cpu), rss))

    def run(self) -> None:
        while not self.stop_event.is_set():
            self.sample()
            self.stop_event.wait(self.every)

    def finish(self) -> None:
        self.stop_event.set()
        self.join()
        self._members = _tree(self.pid)
        self.sample()

    def cpu_at(self, when: float) -> float:
        """Tree CPU seconds at ``when`` (the last sample at or before it)."""
        before = [cpu for t, cpu, _ in self.samples if t <= when]
        return before[-1] if before else 0.0

    def cpu_between(self, start: float, end: float) -> float:
        return self.cpu_at(end) - self.cpu_at(start)

    @property
    def peak_rss_kib(self) -> int:
        return max((rss for _, _, rss in self.samples), default=0)


class Visible(threading.Thread):
    """The table's committed rows as a reader of the catalog sees them, every ``every``
    s; ``reached(n)`` is the first time at least ``n`` showed."""

    def __init__(self, catalog_config: Any, table: str, every: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.catalog_config = catalog_config
        self.table = table
        self.every = every
        self.rows = 0
        self.history: list[tuple[float, int]] = []
        self.errors = 0
        self.stop_event = threading.Event()

    def run(self) -> None:
        catalog = load_catalog(self.catalog_config.name, self.catalog_config.properties())
        while not self.stop_event.is_set():
            try:
                snapshot = catalog.load_table(self.table).current_snapshot()
                rows = 0 if snapshot is None else int(snapshot.summary["total-records"])
            except Exception:  # the table or its metadata is being written: try again
                self.errors += 1
                rows = self.rows
            now = time.time()
            if rows != self.rows or not self.history:
                self.history.append((now, rows))
            self.rows = rows
            self.stop_event.wait(self.every)
        engine = getattr(catalog, "engine", None)
        if engine is not None:
            engine.dispose()

    def reached(self, rows: int) -> float | None:
        return next((t for t, n in self.history if n >= rows), None)

    def last_change(self) -> float:
        return self.history[-1][0] if self.history else time.time()

    def finish(self) -> None:
        self.stop_event.set()
        if self.ident is not None:  # started
            self.join()


@dataclass
class TableReport:
    rows: int
    distinct: int
    duplicates: int
    missing: int
    files: int
    bytes: int
    median_file_bytes: float
    snapshots: int
    codec: str  # of the first data file's first column

    def text(self) -> str:
        return (
            f"{self.rows:,} rows, {self.distinct:,} distinct ids, {self.duplicates:,} "
            f"duplicates, {self.missing:,} missing; {self.files} data files ({self.codec}), "
            f"{self.bytes / 2**20:,.1f} MiB (median {self.median_file_bytes / 2**20:,.2f} MiB); "
            f"{self.snapshots} snapshots"
        )


def table_report(catalog_config: Any, table_name: str, expected: int) -> TableReport:
    """Rows, distinct ``event_id``s, duplicates and missing ids (of 0..expected-1), the
    current snapshot's data files and the number of snapshots: a fresh catalog."""
    catalog = load_catalog(catalog_config.name, catalog_config.properties())
    try:
        table = catalog.load_table(table_name)
        ids = table.scan(selected_fields=("event_id",)).to_arrow()["event_id"]
        rows = len(ids)
        distinct = int(pc.count_distinct(ids).as_py()) if rows else 0
        in_range = pc.and_(pc.greater_equal(ids, 0), pc.less(ids, expected)) if rows else None
        present = int(pc.count_distinct(pc.filter(ids, in_range)).as_py()) if rows else 0
        files = table.inspect.files().select(["file_path", "file_size_in_bytes"]).to_pylist()
        sizes = [int(f["file_size_in_bytes"]) for f in files]
        codec = "-"
        if files:
            path = urlparse(files[0]["file_path"]).path
            codec = pq.ParquetFile(path).metadata.row_group(0).column(0).compression
        return TableReport(
            rows=rows,
            distinct=distinct,
            duplicates=rows - distinct,
            missing=expected - present,
            files=len(sizes),
            bytes=sum(sizes),
            median_file_bytes=statistics.median(sizes) if sizes else 0.0,
            snapshots=len(table.snapshots()),
            codec=codec,
        )
    finally:
        engine = getattr(catalog, "engine", None)
        if engine is not None:
            engine.dispose()
