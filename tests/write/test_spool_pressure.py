"""Spool-wide pressure relief: a real `icespool run` with 64 tables whose spool volume
(a real tmpfs) runs out of inodes, or of bytes, while 44 tables hold its data; and
1,000 appends refused by `spool.max_bytes` starting one relief round.

Without relief, the 20 empty tables were refused (503) for as long as a client
retried: only the refused table was flushed early, and it held nothing. With it,
every refusal for lack of room flushes the tables holding the most of what ran out
(a bounded number per round, rounds coalesced), so the empty tables' appends
succeed within `_RELIEF_BOUND` seconds of retrying. Every acked record of all 64
tables is then in its table exactly once, and no other record is.

Needs root (mount); fails loudly, never skips, without it. The volume is shrunk with
`mount -o remount` once the daemon runs, so it is full by exactly the data of the 44
tables whatever the daemon's own files take.

The coalescing test holds the catalog rows of the tables relief flushes locked in a
real PostgreSQL catalog, so the round provably runs while all 1,000 refusals arrive.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import psycopg2  # type: ignore[import-untyped]
import pyarrow as pa
import pytest
from pyiceberg.catalog import load_catalog
from support.daemon_harness import CATALOG_NAME, NDJSON, Daemon, DaemonDir, ndjson
from support.fixture_types import MakeConfig
from support.many_tables import declared_tables, make_tables
from support.service_helpers import metric, table_rows

from icespool.errors import BackpressureError
from icespool.lifecycle.service import Icespool

_TABLES = [f"t.p{i:02d}" for i in range(64)]
_HOLDERS = _TABLES[:44]  # hold the volume's data when it runs out
_EMPTY = _TABLES[44:]  # refused until relief frees room
_WORKERS = 4  # encode workers: the tables one relief round flushes
_RELIEF_BOUND = 10.0  # s from the first refused attempt until all 20 tables are acked
_RETRY = 0.25  # s between a client's attempts
_PAD = "x" * 120
_TIMEOUT = aiohttp.ClientTimeout(total=30)
_ROUND = re.compile(
    r"spool pressure \((?P<reason>[a-z_]+)\): (?P<table>\S+) was refused .*; "
    r"flushing (?P<chosen>\d+) of (?P<holding>\d+) tables holding spooled data early: "
)


def _tables_toml() -> str:
    return "".join(
        f'\n[[tables]]\nname = "{name}"\ncreate = true\nschema = [\n'
        '  { name = "id", type = "long", required = true },\n'
        '  { name = "v", type = "string" },\n]\n'
        for name in _TABLES
    )


@pytest.fixture
def home(tmp_path: Path) -> Iterator[DaemonDir]:
    """64 tables in the catalog; the spool on a 64 MiB tmpfs, unmounted at teardown."""
    home = DaemonDir(tmp_path / "d")
    home.write_config(batch_timeout="1h", encode_workers=_WORKERS, extra=_tables_toml())
    make_tables(CATALOG_NAME, home.catalog_properties, _TABLES)
    home.spool_dir.mkdir(parents=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(home.spool_dir)], check=True
    )
    try:
        yield home
    finally:
        subprocess.run(["umount", "-l", str(home.spool_dir)], check=False)


@pytest.fixture
def daemon(home: DaemonDir) -> Iterator[Daemon]:
    daemon = Daemon(home)
    try:
        yield daemon
    finally:
        daemon.cleanup()  # SIGKILL and reap before the tmpfs goes


def _remount(directory: Path, option: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{option}", str(directory)], check=True)


class _Load:
    """Unique-id NDJSON requests; remembers which ids each table acked with 200."""

    def __init__(self, daemon: Daemon, session: aiohttp.ClientSession) -> None:
        self.daemon = daemon
        self.session = session
        self.ids = itertools.count()
        self.acked: dict[str, set[int]] = {name: set() for name in _TABLES}
        self.refusals: Counter[str] = Counter()  # 503 texts, shortened

    async def post(self, table: str, records: int) -> int:
        ids = [next(self.ids) for _ in range(records)]
        body = ndjson({"id": i, "v": f"v{i}{_PAD}"} for i in ids)
        async with self.session.post(
            self.daemon.records_url(table), data=body, headers={"Content-Type": NDJSON}
        ) as resp:
            text = await resp.text()
            if resp.status == 200:
                assert (await resp.json())["accepted"] == records, text
                self.acked[table].update(ids)
            else:
                assert resp.status == 503, f"{resp.status} {text}\n{self.daemon.tail()}"
                assert int(resp.headers["Retry-After"]) >= 1, resp.headers
                self.refusals["No space left on device" if "No space" in text else text] += 1
            return resp.status

    async def until_acked(self, table: str, records: int, deadline: float) -> int:
        """Retry every `_RETRY` s until acked or past ``deadline``; returns the attempts."""
        for attempt in itertools.count(1):
            if await self.post(table, records) == 200:
                return attempt
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{table} still refused after {attempt} attempts: {dict(self.refusals)}"
                    f"\n{self.daemon.tail(60)}"
                )
            await asyncio.sleep(_RETRY)
        raise AssertionError("unreachable")


async def _flush_all(load: _Load) -> None:
    for table in _TABLES:
        for _ in range(20):
            async with load.session.post(load.daemon.flush_url(table)) as resp:
                text = await resp.text()
                if resp.status == 200:
                    break
                assert resp.status == 503, f"flush {table}: {resp.status} {text}"
            await asyncio.sleep(0.5)
        else:
            raise AssertionError(f"flush of {table} never succeeded\n{load.daemon.tail()}")


def _committed(home: DaemonDir) -> dict[str, Counter[int]]:
    catalog = load_catalog(CATALOG_NAME, **home.catalog_properties)
    try:
        return {
            name: Counter(catalog.load_table(name).scan().to_arrow().column("id").to_pylist())
            for name in _TABLES
        }
    finally:
        catalog.engine.dispose()  # type: ignore[attr-defined]


def _metric(text: str, reason: str) -> float:
    match = re.search(rf'^icespool_pressure_flushes_total{{reason="{reason}"}} (\S+)$', text, re.M)
    assert match, text
    return float(match.group(1))


async def _exhaust_then_relieve(
    home: DaemonDir, daemon: Daemon, *, resource: str, records: int
) -> None:
    """Ack ``records`` into each holder, take the volume's last free ``resource``
    (inodes: one per segment file; bytes: every block), then the empty tables retry
    until acked; check the bound, the rounds logged and counted, and the tables."""
    daemon.start()
    await daemon.wait_ready()
    async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
        load = _Load(daemon, session)
        vfs = os.statvfs(home.spool_dir)
        if resource == "inodes":
            # One inode per holder's segment file, and not one more.
            _remount(home.spool_dir, f"nr_inodes={vfs.f_files - vfs.f_ffree + len(_HOLDERS)}")
        for table in _HOLDERS:
            assert await load.post(table, records) == 200, daemon.tail()
        vfs = os.statvfs(home.spool_dir)
        if resource == "bytes":
            _remount(home.spool_dir, f"size={(vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize}")
        vfs = os.statvfs(home.spool_dir)
        assert (vfs.f_ffree if resource == "inodes" else vfs.f_bfree) == 0, vfs
        log_start = len(daemon.log())

        started = time.monotonic()
        attempts = await asyncio.gather(
            *(load.until_acked(t, records, started + _RELIEF_BOUND) for t in _EMPTY)
        )
        took = time.monotonic() - started
        print(
            f"{resource}: the {len(_EMPTY)} empty tables acked within {took:.1f}s, attempts "
            f"{sorted(attempts)}, refusals {dict(load.refusals)}"
        )
        assert took < _RELIEF_BOUND
        assert load.refusals["No space left on device"] > 0, "the volume never refused"
        assert set(load.refusals) == {"No space left on device"}, load.refusals

        relief = daemon.log()[log_start:]
        rounds = [m.groupdict() for m in _ROUND.finditer(relief)]
        reason = f"disk_{resource}"
        assert rounds, f"no relief round logged\n{daemon.tail(60)}"
        assert {r["reason"] for r in rounds} == {reason}, rounds
        assert all(1 <= int(r["chosen"]) <= _WORKERS for r in rounds), rounds
        # Coalesced: never a round per refusal while one runs.
        assert len(rounds) <= sum(load.refusals.values()), (rounds, load.refusals)
        assert "committed t.p" in relief and "reason=pressure" in relief, daemon.tail(60)
        metrics = await daemon.metrics(session)
        assert _metric(metrics, reason) == sum(int(r["chosen"]) for r in rounds)
        assert _metric(metrics, "max_bytes") == 0
        other = "disk_bytes" if resource == "inodes" else "disk_inodes"
        assert _metric(metrics, other) == 0

        await _flush_all(load)
    committed = await asyncio.to_thread(_committed, home)
    for table in _TABLES:
        twice = sorted(i for i, n in committed[table].items() if n > 1)
        assert not twice, f"{table}: {len(twice)} ids committed twice, e.g. {twice[:10]}"
        assert set(committed[table]) == load.acked[table], (
            f"{table}: lost {sorted(load.acked[table] - set(committed[table]))[:10]}, "
            f"never acked {sorted(set(committed[table]) - load.acked[table])[:10]}"
        )
    assert all(load.acked[t] for t in _TABLES), "every table acked its records"


async def test_out_of_inodes_flushes_the_tables_holding_them(
    home: DaemonDir, daemon: Daemon
) -> None:
    await _exhaust_then_relieve(home, daemon, resource="inodes", records=50)


async def test_out_of_bytes_flushes_the_tables_holding_them(
    home: DaemonDir, daemon: Daemon
) -> None:
    await _exhaust_then_relieve(home, daemon, resource="bytes", records=1000)


# ------------------------------------------------------------------ spool.max_bytes


def _batch(ids: range) -> pa.RecordBatch:
    # Equal-length values: every holder spools exactly as many bytes.
    return pa.record_batch({"id": pa.array(ids, pa.int64()), "v": [f"v{i:09d}{_PAD}" for i in ids]})


async def test_a_thousand_refusals_start_one_round_that_flushes_the_biggest(
    make_config: MakeConfig, postgres_uri: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    names = [f"m.q{i}" for i in range(9)]
    holders, empty = names[:7], names[7:]  # 7 x 139.3 KiB spooled: no room for an 8th
    config = make_config(
        catalog={
            "name": "pg",
            "type": "sql",
            "uri": postgres_uri,
            "warehouse": (tmp_path / "warehouse").as_uri(),
        },
        tables=declared_tables(names),
        defaults={"batch_timeout": "1h"},
        spool={"dir": str(tmp_path / "spool"), "max_bytes": "1MiB", "segment_max_bytes": "1MiB"},
    )
    caplog.set_level("INFO", logger="icespool.pressure")
    ids = itertools.count()
    acked: dict[str, set[int]] = {name: set() for name in names}

    async def append(service: Icespool, table: str) -> None:
        start = next(ids) * 1000
        await service.writer(table).append(_batch(range(start, start + 1000)))
        acked[table].update(range(start, start + 1000))

    service = Icespool(config)
    await service.start()
    lock = psycopg2.connect(postgres_uri.replace("postgresql+psycopg2", "postgresql"))
    try:
        for table in holders:  # oldest first: m.q0 .. m.q6, equal bytes
            await append(service, table)
        # The two oldest holders' catalog rows stay locked: their pressure flushes
        # (and so the round) cannot end before the lock goes.
        with lock.cursor() as cursor:
            cursor.execute(
                "SELECT table_name FROM iceberg_tables WHERE table_namespace = 'm' "
                "AND table_name IN ('q0', 'q1') FOR UPDATE"
            )
            assert sorted(r[0] for r in cursor.fetchall()) == ["q0", "q1"]
        outcomes = await asyncio.gather(
            *(append(service, empty[i % 2]) for i in range(1000)), return_exceptions=True
        )
        assert all(isinstance(o, BackpressureError) for o in outcomes), outcomes[:3]
        assert all(str(o).startswith("spool is full: ") for o in outcomes), outcomes[:3]
        assert metric(service, "icespool_pressure_flushes_total", reason="max_bytes") == 2
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(warnings) == 1, warnings
        assert re.match(
            r"spool pressure \(max_bytes\): m\.q[78] was refused \(spool is full: .*\); "
            r"flushing 2 of 7 tables holding spooled data early: "
            r"m\.q0 \(1 segment, \d+\.\d KiB, oldest [\d.]+s\), "
            r"m\.q1 \(1 segment, \d+\.\d KiB, oldest [\d.]+s\)$",
            warnings[0],
        ), warnings[0]
        lock.rollback()  # the round's two commits go through now

        deadline = time.monotonic() + _RELIEF_BOUND
        while not any("early flushes done" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, caplog.text
            await asyncio.sleep(0.05)
        done = [r.getMessage() for r in caplog.records if "early flushes done" in r.getMessage()]
        assert re.fullmatch(
            r"spool pressure \(max_bytes\): 2 of 2 early flushes done in [\d.]+s "
            r"\(2000 records committed\); 999 more refusals waited for this round",
            done[0],
        ), done
        for table in empty:  # the room of the two flushed holders takes them now
            await append(service, table)
        assert metric(service, "icespool_pressure_flushes_total", reason="max_bytes") == 2
        assert metric(service, "icespool_commits_total", table="m.q0", reason="pressure") == 1
        assert metric(service, "icespool_commits_total", table="m.q2", reason="pressure") == 0
    finally:
        lock.close()
        await service.stop()
    restarted = Icespool(config)  # a reader of the catalog; the spool is empty
    await restarted.start()
    try:
        for table in names:
            rows = await asyncio.to_thread(table_rows, restarted, table)
            found = Counter(r["id"] for r in rows)
            assert max(found.values()) == 1, f"{table}: ids committed twice"
            assert set(found) == acked[table], table
            assert acked[table], table
    finally:
        await restarted.stop()


async def test_a_volume_held_by_other_files_is_said_and_nothing_is_flushed(
    make_config: MakeConfig, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(spool)], check=True)
    try:
        config = make_config(
            tables=declared_tables(["m.a", "m.b"]),
            defaults={"batch_timeout": "1h"},
            spool={"dir": str(spool)},
        )
        caplog.set_level("INFO", logger="icespool.pressure")
        service = Icespool(config)
        await service.start()
        try:
            filler = spool / "filler"
            with open(filler, "wb", buffering=0) as out:  # every free block of the volume
                chunk = b"\0" * 4096
                while True:
                    try:
                        out.write(chunk)
                    except OSError:
                        break
            for _ in range(3):
                with pytest.raises(BackpressureError, match="No space left on device"):
                    await service.writer("m.a").append(_batch(range(10)))
            warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
            assert len(warnings) == 1, warnings  # once a minute, not once a refusal
            assert re.fullmatch(
                r"spool pressure \(disk_bytes\): m\.a was refused \(spool disk error while "
                r"appending to segment \S+: \[Errno 28\] No space left on device; retry "
                r"later\); nothing to flush early: no table holds spooled data: the room is "
                r"taken by quarantine/ \(0 B\) or by other files",
                warnings[0],
            ), warnings[0]
            for reason in ("disk_bytes", "disk_inodes", "max_bytes"):
                assert metric(service, "icespool_pressure_flushes_total", reason=reason) == 0
            filler.unlink()
            assert await service.writer("m.a").append(_batch(range(10, 20))) == 10
        finally:
            await service.stop()
        assert sorted(r["id"] for r in table_rows(service, "m.a")) == list(range(10, 20))
    finally:
        subprocess.run(["umount", "-l", str(spool)], check=False)
