"""bench_vs_connect.py's runs of one contender: throughput, produce-to-visible, kill -9.

Each takes a ``make`` callable that builds a fresh, unstarted contender (_vs_systems.py)
on the given table and topic, so every system is started, watched and judged by the
same code.
"""

from __future__ import annotations

import asyncio
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _vs_systems import Contender, TableReport, TreeSampler, Visible, table_report
from bench_kafka import SnapshotWatcher, produce_live, snapshot_latencies
from bench_write_path import Profiler

__all__ = [
    "KillRun",
    "LatencyResult",
    "Throughput",
    "kill_run",
    "latency_run",
    "throughput_run",
]

Make = Callable[[str, str, str], Contender]  # (table, topic, tag) -> contender


@dataclass
class Throughput:
    label: str
    rows: int
    seconds: float  # partition assignment -> last row visible in the catalog
    startup: float  # spawn -> partition assignment (not timed)
    cpu_s: float  # the process tree's, over the timed span
    peak_rss_kib: int
    report: TableReport

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_per_million(self) -> float:
        return self.cpu_s / self.rows * 1e6 if self.rows else 0.0


def _start(contender: Contender) -> tuple[TreeSampler, threading.Thread, list[BaseException]]:
    """Start ``contender`` in a thread (the sink's start waits for its task) and sample
    its process tree from the moment it is spawned."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            contender.start()
        except BaseException as exc:
            errors.append(exc)

    starter = threading.Thread(target=run, daemon=True)
    starter.start()
    while not contender.spawned:
        if errors:
            raise errors[0]
        time.sleep(0.005)
    sampler = TreeSampler(contender.pid)
    sampler.start()
    return sampler, starter, errors


def _check(contender: Contender, errors: list[BaseException]) -> None:
    if errors:
        raise errors[0]
    problem = contender.failure()
    if problem:
        raise RuntimeError(f"{contender.label} failed: {problem}\n{contender.log_tail()}")


def throughput_run(
    make: Make,
    catalog: Any,
    table: str,
    topic: str,
    tag: str,
    total: int,
    within: float,
    profile: Path | None = None,
) -> Throughput:
    """Read the pre-produced ``topic`` into a new ``table`` until all ``total`` rows are
    visible; timed from the consumer's partition assignment. ``profile``: py-spy on the
    contender's root process from then on (bench_write_path.Profiler), reported at the end."""
    contender = make(table, topic, tag)
    spawned = time.time()
    visible = Visible(catalog, table)
    profiler: Profiler | None = None
    try:
        sampler, starter, errors = _start(contender)
        visible.start()
        deadline = time.monotonic() + within
        while visible.rows < total:
            _check(contender, errors)
            if profile is not None and profiler is None and contender.assigned_at():
                profiler = Profiler(contender.pid, within, profile)  # start-up left out
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{contender.label}: {visible.rows:,} of {total:,} rows visible after "
                    f"{within:.0f} s\n{contender.log_tail()}"
                )
            time.sleep(0.05)
        sampler.finish()
        visible.finish()
        if profiler is not None and profiler.proc is not None:
            profiler.proc.send_signal(signal.SIGINT)  # py-spy writes what it has
            profiler.report()
        starter.join(60)
        done = visible.reached(total) or time.time()
        assigned = contender.assigned_at()
        if not assigned:
            raise RuntimeError(f"{contender.label} logged no partition assignment")
        contender.stop()
    except BaseException:
        contender.kill9()
        raise
    return Throughput(
        contender.label,
        total,
        done - assigned,
        assigned - spawned,
        sampler.cpu_between(assigned, done),
        sampler.peak_rss_kib,
        table_report(catalog, table, total),
    )


@dataclass
class LatencyResult:
    label: str
    sent: int
    seen: list[float]  # per row: first catalog load showing it - its produce time
    stamped: list[float]  # per row: its snapshot's timestamp_ms - its produce time
    snapshots: int


def latency_run(
    make: Make,
    config: Any,
    table: str,
    topic: str,
    tag: str,
    rate: float,
    seconds: float,
    bootstrap: str,
    interval_s: float,
) -> LatencyResult:
    """``rate`` events/s for ``seconds`` into the live ``topic`` once the contender
    holds its partitions; every row's produce -> visible time from the data files."""
    contender = make(table, topic, tag)
    try:
        sampler, starter, errors = _start(contender)
        sampler.finish()  # only the start is wanted here, not the samples
        deadline = time.monotonic() + 180
        while not contender.assigned_at():
            _check(contender, errors)
            if time.monotonic() > deadline:
                raise RuntimeError(f"{contender.label} was not assigned {topic} in 180 s")
            time.sleep(0.05)
        starter.join(120)
        _check(contender, errors)
        watcher = SnapshotWatcher(config, table=table)
        watcher.start()
        sent = asyncio.run(produce_live(bootstrap, topic, rate, seconds))
        visible = Visible(config.catalog, table)
        visible.start()
        deadline = time.monotonic() + interval_s + 90
        while visible.rows < sent:
            _check(contender, errors)
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{contender.label}: {visible.rows:,} of {sent:,} live rows visible"
                )
            time.sleep(0.05)
        time.sleep(0.2)  # let the watcher see the last snapshot
        visible.finish()
        watcher.stop_event.set()
        watcher.join()
        contender.stop()
    except BaseException:
        contender.kill9()
        raise
    seen, stamped, snapshots = snapshot_latencies(config, watcher.seen, table)
    if len(seen) != sent:
        raise RuntimeError(f"{contender.label}: {len(seen)} live rows in the table, {sent} sent")
    return LatencyResult(contender.label, sent, seen, stamped, snapshots)


@dataclass
class KillRun:
    label: str
    kills: list[str] = field(default_factory=list)
    report: TableReport | None = None
    seconds: float = 0.0
    settled: str = ""


def kill_run(
    make: Make,
    catalog: Any,
    table: str,
    topic: str,
    tag: str,
    total: int,
    kills: int,
    interval_s: float,
    quiet_s: float,
) -> KillRun:
    """kill -9 of the contender's whole process tree ``kills`` times mid-stream, restarting
    it at once on the same table, group and (icespool) spool. The k-th kill comes once
    the table shows k of ``kills + 1`` equal shares of ``total`` and the incarnation has
    committed something of its own (the table grew since it started), plus a random part
    of a commit interval, so the kill lands between commits with records read and not yet
    committed. Then wait until all rows show and ``quiet_s`` passes with
    no change (late duplicates), or until nothing changed for ``quiet_s`` + the interval
    + 120 s; then count duplicates and missing ids."""
    result = KillRun(make(table, topic, tag).label)
    rng = random.Random(tag)
    visible = Visible(catalog, table)
    began = time.monotonic()
    contender = make(table, topic, tag)
    try:
        sampler, _, errors = _start(contender)
        sampler.finish()
        visible.start()
        for k in range(1, kills + 1):
            started_at = visible.rows
            share = total * k // (kills + 1)
            deadline = time.monotonic() + 600
            while (visible.rows <= started_at or visible.rows < share) and visible.rows < total:
                _check(contender, errors)
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{result.label}: {visible.rows:,} rows after 600 s")
                time.sleep(0.02)
            time.sleep(rng.uniform(0, interval_s))
            before = visible.rows
            contender.kill9()
            late = " (all rows were visible already)" if before >= total else ""
            result.kills.append(f"kill -9 at {before:,} rows visible{late}")
            contender = make(table, topic, tag)
            sampler, _, errors = _start(contender)
            sampler.finish()
        while True:
            _check(contender, errors)
            still = time.time() - visible.last_change()
            if visible.rows >= total and still >= quiet_s:
                result.settled = f"all rows visible, then {quiet_s:.0f} s without change"
                break
            if still >= quiet_s + interval_s + 120:
                result.settled = f"stalled at {visible.rows:,} rows for {still:.0f} s"
                break
            time.sleep(0.1)
        contender.stop()
    except BaseException:
        contender.kill9()
        raise
    finally:
        visible.finish()
    result.seconds = time.monotonic() - began
    result.report = table_report(catalog, table, total)
    return result
