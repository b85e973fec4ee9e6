"""Fault tests of a real `icespool run` process (guarantees 1, 2 and 7).

Every test starts the daemon as a child process (tests/support/daemon_harness.py) with a
SQLite catalog, a warehouse and a spool under tmp_path, talks to it over HTTP and
reads the Iceberg table back with pyiceberg. Nothing is mocked: kills are real
SIGKILLs, the torn segment is a real file cut with truncate, the crash between
commit and spool delete is a crash point the test sets through the spool's
file-system seam (support/fault_daemon.py).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import re
import signal
import sqlite3
import struct
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from pyiceberg.table import Table
from pyiceberg.types import LongType, NestedField, StringType
from support.daemon_harness import (
    NDJSON,
    TABLE,
    Daemon,
    DaemonDir,
    daemon_command,
    ndjson,
)
from support.fixture_types import rest_catalog_server

SEGMENTS_KEY = "icespool.segments"
REASON_KEY = "icespool.reason"
_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # Arrow IPC end-of-stream: the segment was sealed
_TIMEOUT = aiohttp.ClientTimeout(total=20)

MakeDaemon = Callable[..., tuple[DaemonDir, Daemon]]


@pytest.fixture
def make_daemon(tmp_path: Path) -> Iterator[MakeDaemon]:
    """Builds daemons under tmp_path; every child is SIGKILLed and reaped at teardown."""
    made: list[Daemon] = []

    def make(
        name: str = "d", catalog: dict[str, str] | None = None, **config: Any
    ) -> tuple[DaemonDir, Daemon]:
        home = DaemonDir(tmp_path / name, catalog=catalog)
        home.write_config(**config)
        daemon = Daemon(home)
        made.append(daemon)
        return home, daemon

    yield make
    for daemon in made:
        daemon.cleanup()


# ---------------------------------------------------------------------- helpers


def _snapshots(table: Table) -> list[Any]:
    return sorted(table.metadata.snapshots, key=lambda s: s.sequence_number or 0)


def _segments_of(snapshot: Any) -> list[str]:
    raw = snapshot.summary[SEGMENTS_KEY]
    return [] if not raw else raw.split(",")


def _segment_id(path: Path) -> str:
    # {namespace}__{table}__{segment_id}.arrow
    return path.name.removesuffix(".arrow").rsplit("__", 1)[1]


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert match is not None, f"metric {name} not exported:\n{text}"
    return float(match.group(1))


def _flush_snapshot(result: dict[str, Any]) -> Any:
    assert "snapshot_id" in result, f"flush answer has no snapshot_id: {result}"
    return result["snapshot_id"]


def _flush_records(result: dict[str, Any]) -> Any:
    assert "records" in result, f"flush answer has no records count: {result}"
    return result["records"]


def _check_exactly_once(
    rows: list[dict[str, Any]], acked: set[int], sent: set[int], where: str
) -> None:
    counts = Counter(r["id"] for r in rows)
    dupes = sorted(i for i, c in counts.items() if c > 1)
    missing = sorted(acked - counts.keys())
    unknown = sorted(counts.keys() - sent)
    wrong_v = [r for r in rows if r["v"] != f"v{r['id']}"][:5]
    assert not dupes, f"{len(dupes)} ids committed more than once, e.g. {dupes[:20]}\n{where}"
    assert not missing, f"{len(missing)} acked ids missing, e.g. {missing[:20]}\n{where}"
    assert not unknown, f"{len(unknown)} ids never sent, e.g. {unknown[:20]}\n{where}"
    assert not wrong_v, f"rows with a value that was not sent with their id: {wrong_v}\n{where}"


def _records(ids: range | list[int]) -> list[dict[str, Any]]:
    return [{"id": i, "v": f"v{i}"} for i in ids]


def _log_problems(text: str) -> list[str]:
    return [
        line
        for line in text.splitlines()
        if "Traceback" in line
        or "[error" in line
        or "[critical" in line
        or "segment quarantined" in line
    ]


# ---------------------------------------------------------------------- 1. kill -9 under load


# Rounds of kill -9: 6 in CI keeps the suite within its time budget (each round costs
# ~9 s); ICESPOOL_KILL_ROUNDS=50 for a long soak. The REST catalogs on S3 (SeaweedFS's and
# Apache Iceberg's reference server), the PostgreSQL catalog on Google Cloud Storage
# (fake-gcs-server) and the Hive Metastore run the same rounds, fewer of them in CI (their
# other faults have their own tests).
KILL_ROUNDS = max(4, int(os.environ.get("ICESPOOL_KILL_ROUNDS", "6")))
# Rounds of the REST, gs:// and Hive variants.
REST_KILL_ROUNDS = max(3, int(os.environ.get("ICESPOOL_REST_KILL_ROUNDS", "3")))
CLIENTS = 4
KILL_MODES = ("random", "after_flush", "during_commit")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sql", "rest-s3", "rest-iceberg", "sql-gcs", "hive"])
async def test_kill_9_during_concurrent_ingest_keeps_every_acked_record_exactly_once(
    backend: str, make_daemon: MakeDaemon, request: pytest.FixtureRequest
) -> None:
    seed = int(os.environ.get("ICESPOOL_FAULT_SEED", random.randrange(2**32)))
    rng = random.Random(seed)
    rounds = KILL_ROUNDS
    catalog = None
    extra = ""
    if backend == "sql-gcs":
        gcs = request.getfixturevalue("fake_gcs")
        bucket = f"kill9-{uuid.uuid4().hex[:12]}"
        gcs.create_bucket(bucket)
        catalog = {
            "type": "sql",
            "uri": request.getfixturevalue("postgres_uri"),
            **gcs.catalog_properties(f"gs://{bucket}/warehouse"),
        }
        rounds = REST_KILL_ROUNDS
    elif backend == "hive":
        # Apache Hive's standalone metastore, tables in a local directory.
        metastore = request.getfixturevalue("hive_metastore")
        catalog = metastore.catalog_properties(metastore.warehouse())
        rounds = REST_KILL_ROUNDS
        # Hive holds no maintenance lease either (README, Table maintenance).
        extra = '[maintenance]\nlease = "none"\n'
    elif backend != "sql":
        store = rest_catalog_server(backend, request)
        catalog = store.catalog_properties(store.warehouse())
        rounds = REST_KILL_ROUNDS
        # A REST catalog cannot hold the maintenance lease: with the default the daemon
        # logs an error at every start (README, Table maintenance). One daemon maintains.
        extra = '[maintenance]\nlease = "none"\n'
    # Commits every ~200 ms, so a kill at a random instant often lands inside one.
    home, daemon = make_daemon(batch_timeout="200ms", catalog=catalog, extra=extra)
    next_id = itertools.count(1)
    sent: set[int] = set()
    acked: set[int] = set()
    unexpected: list[str] = []
    history: list[str] = []
    in_flush = 0
    test_started = time.monotonic()

    async def client(
        session: aiohttp.ClientSession, url: str, killed: asyncio.Event, tag: str
    ) -> tuple[int, int]:
        oks = fails = 0
        while not killed.is_set():
            n = rng.randint(1, 500)
            ids = [next(next_id) for _ in range(n)]
            sent.update(ids)
            try:
                async with session.post(
                    url, data=ndjson(_records(ids)), headers={"Content-Type": NDJSON}
                ) as resp:
                    status, text = resp.status, await resp.text()
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                fails += 1
                if not killed.is_set():
                    unexpected.append(f"{tag}: {exc!r} before the kill\n{daemon.tail()}")
                return oks, fails
            if status == 200:
                try:
                    accepted = json.loads(text).get("accepted")
                except ValueError:
                    accepted = None
                if accepted != n:
                    unexpected.append(f"{tag}: 200 with body {text!r} for {n} records")
                acked.update(ids)
                oks += 1
            else:
                fails += 1
                unexpected.append(f"{tag}: unexpected {status} {text!r}")
                return oks, fails
        return oks, fails

    async def flush_quietly(session: aiohttp.ClientSession) -> None:
        try:
            async with session.post(daemon.flush_url()) as resp:
                await resp.read()
        except (aiohttp.ClientError, OSError, TimeoutError):
            pass  # cut by the kill

    modes = [KILL_MODES[i % len(KILL_MODES)] for i in range(rounds)]
    rng.shuffle(modes)
    # Some restarts are killed again while recovery commits the leftovers (before ready).
    startup_kills = set(rng.sample(range(1, rounds), min(3, rounds - 1)))

    for round_no, mode in enumerate(modes):
        if round_no in startup_kills:
            daemon.start()
            # Kill while recovery commits the previous round's leftovers: the
            # "replaying" line comes right before that commit.
            start_deadline = time.monotonic() + 30
            while "replaying" not in (log := daemon.log()) and "icespool started" not in log:
                assert daemon.running, f"daemon died during startup\n{daemon.tail()}"
                assert time.monotonic() < start_deadline, f"startup hangs\n{daemon.tail()}"
                await asyncio.sleep(0.002)
            delay = rng.uniform(0.0, 0.1)
            await asyncio.sleep(delay)
            code = daemon.kill()
            log = daemon.log()
            phase = (
                "after ready"
                if "icespool started" in log
                else "after the recovery commit"
                if "replayed" in log
                else "during the recovery commit"
                if "replaying" in log
                else "before recovery"
            )
            history.append(f"round {round_no}: killed {phase}, {delay * 1000:.0f} ms after replay")
            assert code == -signal.SIGKILL, f"startup ended with {code}\n{daemon.tail()}"
        daemon.start()
        await daemon.wait_ready()
        killed = asyncio.Event()
        async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
            url = daemon.records_url()
            clients = [
                asyncio.create_task(client(session, url, killed, f"round {round_no} client {c}"))
                for c in range(CLIENTS)
            ]
            await asyncio.sleep(rng.uniform(0.2, 1.2))
            flusher = None
            if mode == "after_flush":
                flusher = asyncio.create_task(flush_quietly(session))
                await asyncio.sleep(rng.uniform(0.0, 0.06))
            elif mode == "during_commit":
                # A commit job is under way from the moment the age trigger fires; the
                # previous commit's log line plus a short delay lands inside the next one.
                seen = daemon.log().count(f"committed {TABLE}")
                await daemon.wait_log(f"committed {TABLE}", within=10, count=seen + 1)
                await asyncio.sleep(rng.uniform(0.15, 0.3))
            killed.set()
            code = daemon.kill()
            outcomes = await asyncio.gather(*clients)
            if flusher is not None:
                await flusher
        assert code == -signal.SIGKILL, (
            f"round {round_no}: the daemon exited by itself with {code}\n{daemon.tail()}"
        )
        # A sealed segment still in the spool means a flush job was between its seal
        # and its spool delete (encoding, committing, or committed) when the kill hit.
        sealed = sum(1 for p in home.spool_files() if p.read_bytes().endswith(_EOS))
        in_flush += sealed > 0
        history.append(
            f"round {round_no} ({mode}): {'inside a flush job, ' if sealed else ''}recovery found "
            f"{daemon.log().count('already in snapshot')} already committed segments, "
            f"{sum(o for o, _ in outcomes)} acked requests, "
            f"{sum(f for _, f in outcomes)} cut, {len(acked)} acked ids so far, "
            f"spool files at kill: {len(home.spool_files())}"
        )
        assert not unexpected, "\n".join(unexpected[:5])

    daemon.start()
    await daemon.wait_ready()
    async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
        await daemon.flush(session)
    daemon.signal(signal.SIGTERM)
    code = await daemon.wait_exit(35)
    where = f"{backend} seed={seed}\n" + "\n".join(history) + "\n" + daemon.tail()
    assert code == 0, f"final SIGTERM exit status {code}\n{where}"

    rows, table = home.read_rows()
    _check_exactly_once(rows, acked, sent, where)
    assert len(acked) > 5_000, f"too little was acked for the test to mean anything\n{where}"
    committed_segments = Counter(s for snap in _snapshots(table) for s in _segments_of(snap))
    twice = [s for s, c in committed_segments.items() if c > 1]
    assert not twice, f"segments committed in more than one snapshot: {twice}\n{where}"
    assert home.spool_files() == [], f"spool not empty after final flush\n{where}"
    assert home.quarantined() == [], f"kill -9 made quarantined segments\n{where}"
    problems = _log_problems(daemon.all_logs())
    assert not problems, "daemon logged errors:\n" + "\n".join(problems[:20]) + f"\n{where}"
    assert in_flush >= 1, (
        f"no kill landed inside a flush job (seal .. commit .. delete); the test did not "
        f"exercise kills during commits\n{where}"
    )
    elapsed = time.monotonic() - test_started
    print(f"kill-9 test ({backend}): seed={seed} {elapsed:.1f}s\n" + "\n".join(history))


# ---------------------------------------------------------------------- 2. crash after commit


async def test_crash_after_commit_before_spool_delete_does_not_commit_twice(
    make_daemon: MakeDaemon,
) -> None:
    home, daemon = make_daemon(batch_timeout="3600s")
    # A crash point through the spool's file-system seam: the daemon SIGKILLs itself
    # at its first segment unlink, i.e. right after the Iceberg commit of the flush.
    daemon.start(crash=["unlink:*.arrow:1"])
    await daemon.wait_ready()
    n = 1_234
    async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
        for chunk in (range(500), range(500, 1_000), range(1_000, n)):
            await daemon.ingest(session, _records(chunk))
        with pytest.raises(aiohttp.ClientError):
            await daemon.flush(session)
    assert await daemon.wait_exit(20) == -signal.SIGKILL, daemon.tail()
    [spooled] = home.spool_files()
    segment = _segment_id(spooled)
    rows, table = home.read_rows()
    snaps = _snapshots(table)
    assert len(snaps) == 1 and _segments_of(snaps[0]) == [segment], (
        f"the segment was not committed: {[s.summary for s in snaps]}\n{daemon.tail()}"
    )
    assert len(rows) == n

    daemon.start()
    await daemon.wait_ready()
    async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
        result = await daemon.flush(session)
    assert _flush_snapshot(result) is None, f"flush committed again: {result}\n{daemon.tail()}"
    assert _flush_records(result) == 0, result

    rows, table = home.read_rows()
    ids = [r["id"] for r in rows]
    assert len(ids) == n and set(ids) == set(range(n)), (
        f"{len(ids)} rows, {len(set(ids))} distinct; expected {n}\n{daemon.tail()}"
    )
    snaps = _snapshots(table)
    assert len(snaps) == 1, f"{len(snaps)} snapshots: {[s.summary for s in snaps]}"
    assert _segments_of(snaps[0]) == [segment]
    assert home.spool_files() == [], "the already committed segment was not deleted"
    assert "already in snapshot" in daemon.log(), f"recovery did not say why\n{daemon.tail()}"
    daemon.signal(signal.SIGTERM)
    assert await daemon.wait_exit(35) == 0, daemon.tail()


# ---------------------------------------------------------------------- 3. torn newest segment


def _message_offsets(data: bytes) -> list[tuple[int, int]]:
    """(start, end) of every IPC message in a stream file, parsed by pyarrow."""
    stream = pa.BufferReader(pa.py_buffer(data))
    offsets = []
    while stream.tell() < len(data):
        start = stream.tell()
        try:
            ipc.read_message(stream)
        except StopIteration:  # end-of-stream marker
            break
        offsets.append((start, stream.tell()))
    return offsets


@pytest.mark.parametrize(
    ("batches", "cut"),
    [
        (6, "body"),  # 10 bytes off the end: inside the last batch's body
        (6, "metadata"),  # inside the last batch's flatbuffer header
        (6, "marker"),  # inside the last batch's 0xFFFFFFFF continuation marker
        (1, "body"),  # the only batch is torn: the complete prefix is empty
    ],
)
async def test_truncated_newest_segment_commits_the_complete_prefix_and_reports_the_cut(
    make_daemon: MakeDaemon, batches: int, cut: str
) -> None:
    home, daemon = make_daemon(batch_timeout="3600s")
    daemon.start()
    await daemon.wait_ready()
    # One request = one spooled batch, with known ids.
    requests = [range(k * 100, k * 100 + 10 + k) for k in range(batches)]
    async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
        for ids in requests:
            await daemon.ingest(session, _records(ids))
    assert daemon.kill() == -signal.SIGKILL

    files = home.spool_files()
    assert len(files) == 1, files
    path = files[0]
    data = path.read_bytes()
    # Precondition, checked with pyarrow rather than the spool's own scanner: the
    # unsealed file is schema + one message per request, and the cut lands inside
    # the last one.
    read_back = list(ipc.open_stream(pa.py_buffer(data)))
    assert [b.column("id").to_pylist() for b in read_back] == [list(r) for r in requests]
    messages = _message_offsets(data)
    assert len(messages) == 1 + len(requests), messages
    last_start, last_end = messages[-1]
    assert last_end == len(data), "the file ends with an end-of-stream marker (sealed?)"
    (meta_len,) = struct.unpack_from("<i", data, last_start + 4)
    body_start = last_start + 8 + meta_len
    cut_at = {
        "body": len(data) - 10,
        "metadata": last_start + 8 + meta_len // 2,
        "marker": last_start + 3,
    }[cut]
    assert last_start < cut_at < last_end, (last_start, cut_at, last_end)
    assert cut != "body" or cut_at > body_start, "the cut would not land in the body"
    os.truncate(path, cut_at)

    daemon.start()
    await daemon.wait_ready()
    async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
        metrics = await daemon.metrics(session)
        result = await daemon.flush(session)
    assert _flush_snapshot(result) is None, f"recovery left records pending: {result}"

    rows, table = home.read_rows()
    expected = sorted(i for ids in requests[:-1] for i in ids)
    got = sorted(r["id"] for r in rows)
    assert got == expected, (
        f"expected the first {len(requests) - 1} requests ({len(expected)} ids), got "
        f"{len(got)} ids; missing {sorted(set(expected) - set(got))[:10]}, extra "
        f"{sorted(set(got) - set(expected))[:10]}\n{daemon.tail()}"
    )
    assert all(r["v"] == f"v{r['id']}" for r in rows)
    snaps = _snapshots(table)
    if expected:
        assert len(snaps) == 1, [s.summary for s in snaps]
        assert _segments_of(snaps[0]) == [_segment_id(path)]
        assert snaps[0].summary[REASON_KEY] == "recovery"
    else:
        assert snaps == [], [s.summary for s in snaps]
    assert home.spool_files() == [] and home.quarantined() == []

    cut_bytes = len(data) - cut_at
    reported = [
        line for line in daemon.log().splitlines() if "torn tail" in line and path.name in line
    ]
    assert reported, (
        f"recovery cut {cut_bytes} bytes of a torn batch ({len(requests[-1])} records) but "
        f"no log line reports a torn tail of {path.name}\n{daemon.tail()}"
    )
    assert _metric(metrics, "icespool_truncated_segments_total") == 1, (
        f"recovery cut {cut_bytes} bytes of a torn batch, but "
        f"icespool_truncated_segments_total is "
        f"{_metric(metrics, 'icespool_truncated_segments_total')}\n{daemon.tail()}"
    )
    assert _metric(metrics, "icespool_quarantined_segments_total") == 0, metrics
    daemon.signal(signal.SIGTERM)
    assert await daemon.wait_exit(35) == 0, daemon.tail()


# ---------------------------------------------------------------------- 4. graceful shutdown


async def test_sigterm_commits_everything_and_exits_zero(make_daemon: MakeDaemon) -> None:
    home, daemon = make_daemon(batch_timeout="3600s")
    daemon.start()
    await daemon.wait_ready()
    ids = list(range(5_000))
    async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
        for k in range(0, len(ids), 1_000):
            await daemon.ingest(session, _records(ids[k : k + 1_000]))
    assert len(home.spool_files()) == 1, "records should wait in the spool (no commit yet)"
    t0 = time.monotonic()
    daemon.signal(signal.SIGTERM)
    code = await daemon.wait_exit(35)  # the daemon's grace period is 30 s
    took = time.monotonic() - t0
    assert code == 0, f"exit status {code}\n{daemon.tail()}"
    assert "stopped cleanly" in daemon.log(), daemon.tail()
    assert home.spool_files() == [], "SIGTERM left records in the spool"

    rows, table = home.read_rows()
    _check_exactly_once(rows, set(ids), set(ids), daemon.tail())
    snaps = _snapshots(table)
    assert len(snaps) == 1 and snaps[0].summary[REASON_KEY] == "shutdown", [
        s.summary for s in snaps
    ]
    print(f"SIGTERM drain of {len(ids)} records took {took:.2f}s")


async def test_second_sigterm_during_slow_drain_exits_130_and_loses_nothing(
    make_daemon: MakeDaemon,
) -> None:
    home, daemon = make_daemon(batch_timeout="3600s")
    daemon.start()
    await daemon.wait_ready()
    ids = list(range(3_000))
    async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
        await daemon.ingest(session, _records(ids))
    # Hold the catalog database's write lock: the drain's commit cannot finish, so
    # the drain is slow for as long as the test wants.
    blocker = sqlite3.connect(home.catalog_db, isolation_level=None, timeout=10)
    try:
        blocker.execute("BEGIN EXCLUSIVE")
        daemon.signal(signal.SIGTERM)
        await daemon.wait_log("shutting down", within=10)
        await asyncio.sleep(0.3)
        assert daemon.running, f"the drain finished despite the locked catalog\n{daemon.tail()}"
        t0 = time.monotonic()
        daemon.signal(signal.SIGTERM)
        code = await daemon.wait_exit(5)
        took = time.monotonic() - t0
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert code == 130, f"second SIGTERM: exit status {code}\n{daemon.tail()}"
    assert took < 2, f"second SIGTERM took {took:.2f}s to exit"

    daemon.start()
    await daemon.wait_ready()
    async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
        await daemon.flush(session)
    daemon.signal(signal.SIGTERM)
    assert await daemon.wait_exit(35) == 0, daemon.tail()
    rows, _ = home.read_rows()
    _check_exactly_once(rows, set(ids), set(ids), daemon.tail())
    assert home.spool_files() == []


# ---------------------------------------------------------------------- 5. round trip


async def test_table_reads_back_equal_with_one_snapshot_per_flush(
    make_daemon: MakeDaemon,
) -> None:
    home, daemon = make_daemon(batch_timeout="3600s")
    daemon.start()
    await daemon.wait_ready()
    batches: list[list[dict[str, Any]]] = [
        [
            {"id": 0, "v": "plain"},
            {"id": -1, "v": ""},
            {"id": 9_223_372_036_854_775_807, "v": "max long"},
            {"id": -9_223_372_036_854_775_808, "v": "min long"},
            {"id": 9_007_199_254_740_993, "v": "2**53 + 1 (not a double)"},
        ],
        [
            {"id": 10, "v": None},
            {"id": 11},  # optional column left out: null
            {"id": 12, "v": "ünïcödé ✓ 🧊 中文"},
            {"id": 13, "v": 'quotes " and \\ backslash\nnewline\ttab'},
        ],
        [{"id": 1_000 + i, "v": f"bulk-{i}" * (i % 7)} for i in range(2_000)],
    ]
    flushes = []
    async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
        for batch in batches:
            await daemon.ingest(session, batch)
            flushes.append(await daemon.flush(session))
        empty = await daemon.flush(session)
    assert _flush_snapshot(empty) is None, f"a flush with nothing pending committed: {empty}"
    assert [_flush_records(f) for f in flushes] == [len(b) for b in batches], flushes

    rows, table = home.read_rows()
    sent = sorted(
        ({"id": r["id"], "v": r.get("v")} for batch in batches for r in batch),
        key=lambda r: r["id"],
    )
    assert sorted(rows, key=lambda r: r["id"]) == sent

    fields = table.schema().fields
    assert [(f.name, f.field_type, f.required) for f in fields] == [
        ("id", LongType(), True),
        ("v", StringType(), False),
    ], fields
    assert all(isinstance(f, NestedField) for f in fields)
    arrow = table.scan().to_arrow()
    assert arrow.schema.field("id").type == pa.int64()
    assert not arrow.schema.field("id").nullable
    assert arrow.schema.field("v").type in (pa.string(), pa.large_string())

    snaps = _snapshots(table)
    assert len(snaps) == len(batches), [s.summary for s in snaps]
    assert [s.snapshot_id for s in snaps] == [_flush_snapshot(f) for f in flushes]
    assert [s.summary["added-records"] for s in snaps] == [str(len(b)) for b in batches]
    assert [s.summary[REASON_KEY] for s in snaps] == ["manual"] * len(batches)
    daemon.signal(signal.SIGTERM)
    assert await daemon.wait_exit(35) == 0, daemon.tail()


async def test_second_daemon_on_the_same_spool_fails_fast_naming_the_holder(
    make_daemon: MakeDaemon,
) -> None:
    home, first = make_daemon()
    first.start()
    await first.wait_ready()
    second = Daemon(home)  # same config, same spool directory, port 0 again
    started = time.monotonic()
    second.start()
    try:
        code = await second.wait_exit(within=20)
        assert code == 1, second.tail()
        assert time.monotonic() - started < 20
        assert f"locked by pid {first.pid}" in second.log(), second.tail()
        assert first.running  # the holder is unaffected
    finally:
        second.cleanup()


async def test_replay_commits_the_spool_and_exits(make_daemon: MakeDaemon) -> None:
    home, daemon = make_daemon(batch_timeout="1h")
    daemon.start()
    await daemon.wait_ready()
    async with aiohttp.ClientSession() as session:
        for start in range(0, 3000, 1000):
            await daemon.ingest(
                session, [{"id": i, "v": f"r{i}"} for i in range(start, start + 1000)]
            )
    assert daemon.kill() == -signal.SIGKILL
    assert home.spool_files()  # acked, never committed
    env = {k: v for k, v in os.environ.items() if not k.startswith("ICESPOOL")}
    done = subprocess.run(
        [*daemon_command(), "replay", "--config", str(home.config_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the spool is empty" in done.stdout + done.stderr
    rows, table = home.read_rows()
    assert sorted(r["id"] for r in rows) == list(range(3000))
    assert home.spool_files() == []
    assert [s.summary["icespool.reason"] for s in table.metadata.snapshots] == ["recovery"]
