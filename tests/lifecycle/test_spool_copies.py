"""A copied spool directory never loses or duplicates an acked record.

Real `icespool run` children on one PostgreSQL catalog and one warehouse. The spool
directory of a daemon is copied (``shutil.copytree``, as ``cp -a`` would: the directory
lock does not travel) while it holds an open segment, or after it was killed, and the
copy is started beside or after the original, in either order. The copy's segments
are prefixes of the original's: the one that commits second commits only the rest.
A copy whose original still runs is refused at start, naming it.
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import aiohttp
import pytest
from support.daemon_harness import Daemon, DaemonDir, DaemonError


def _homes(tmp_path: Path, postgres_uri: str) -> tuple[DaemonDir, DaemonDir]:
    warehouse = tmp_path / "warehouse"
    homes = []
    for name in ("original", "copy"):
        home = DaemonDir(tmp_path / name, catalog_uri=postgres_uri, shared_warehouse=warehouse)
        # No size or time trigger: only a flush, a shutdown or recovery commits.
        home.write_config(batch_timeout="1h", max_batch_records=10_000_000)
        homes.append(home)
    return homes[0], homes[1]


def _copy(source: DaemonDir, target: DaemonDir) -> None:
    shutil.rmtree(target.spool_dir, ignore_errors=True)
    shutil.copytree(source.spool_dir, target.spool_dir, symlinks=True)


async def _ingest(daemon: Daemon, ids: range) -> None:
    async with aiohttp.ClientSession() as session:
        for start in range(ids.start, ids.stop, 500):
            chunk = range(start, min(start + 500, ids.stop))
            await daemon.ingest(session, [{"id": i, "v": f"r{i}"} for i in chunk])


async def _flush(daemon: Daemon) -> None:
    async with aiohttp.ClientSession() as session:
        await daemon.flush(session)


async def _stop(daemon: Daemon) -> None:
    daemon.signal(15)
    assert await daemon.wait_exit(60) == 0, daemon.tail()


def _ids(home: DaemonDir) -> Counter[int]:
    rows, _ = home.read_rows()
    return Counter(int(r["id"]) for r in rows)


def _assert_exactly(home: DaemonDir, expected: range) -> None:
    ids = _ids(home)
    assert sorted(set(ids)) == list(expected), (
        f"missing {len(set(expected) - set(ids))}, extra {len(set(ids) - set(expected))}"
    )
    assert [i for i, n in ids.items() if n > 1] == []


async def test_a_copy_started_beside_its_running_original_is_refused(
    tmp_path: Path, postgres_uri: str
) -> None:
    original_home, copy_home = _homes(tmp_path, postgres_uri)
    original, copy = Daemon(original_home), Daemon(copy_home)
    try:
        original.start()
        await original.wait_ready()
        await _ingest(original, range(2000))
        _copy(original_home, copy_home)  # an open segment of 2,000 records
        await _ingest(original, range(2000, 4000))
        copy.start()
        assert await copy.wait_exit(60) != 0
        log = copy.log()
        assert "is held by incarnation" in log and f"pid {original.pid})" in log, copy.tail()
        assert "it is running on this machine" in log
        assert "must not run beside its original" in log
        # Nothing of the copy reached the table; the original commits all it acked.
        assert _ids(original_home) == Counter()
        await _flush(original)
        await _stop(original)
    finally:
        original.cleanup()
        copy.cleanup()
    _assert_exactly(original_home, range(4000))


@pytest.mark.parametrize("copy_first", [True, False], ids=["copy-commits-first", "original-first"])
async def test_a_copy_of_an_open_segment_commits_exactly_what_is_left(
    tmp_path: Path, postgres_uri: str, copy_first: bool
) -> None:
    """The original acked 4,000 records into one segment; the copy holds its first
    2,000. The original is killed; whichever starts first commits what it holds, the
    other commits only what is not in the table yet."""
    original_home, copy_home = _homes(tmp_path, postgres_uri)
    original, copy = Daemon(original_home), Daemon(copy_home)
    try:
        original.start()
        await original.wait_ready()
        await _ingest(original, range(2000))
        _copy(original_home, copy_home)
        await _ingest(original, range(2000, 4000))
        original.kill()
        first, second = (copy, original) if copy_first else (original, copy)
        first.start()
        await first.wait_ready()  # recovery committed its spool
        await _stop(first)
        second.start()
        await second.wait_ready()
        await _stop(second)
        if copy_first:
            assert "has 2000 of its 4000 records in the table already" in original.all_logs()
        else:
            assert "already in snapshot" in copy.all_logs()
    finally:
        original.cleanup()
        copy.cleanup()
    _assert_exactly(original_home, range(4000))
    assert original_home.spool_files() == [] and copy_home.spool_files() == []


async def test_an_old_snapshot_restored_after_the_original_is_gone(
    tmp_path: Path, postgres_uri: str
) -> None:
    """Disaster recovery from an old copy of the volume commits nothing twice."""
    original_home, copy_home = _homes(tmp_path, postgres_uri)
    original, copy = Daemon(original_home), Daemon(copy_home)
    try:
        original.start()
        await original.wait_ready()
        await _ingest(original, range(2000))
        _copy(original_home, copy_home)  # the snapshot
        await _ingest(original, range(2000, 4000))
        await _flush(original)
        await _ingest(original, range(4000, 5000))
        await _flush(original)
        await _ingest(original, range(5000, 5500))  # acked, then the machine is lost
        original.kill()
        shutil.rmtree(original_home.spool_dir)
        copy.start()
        await copy.wait_ready()
        await _stop(copy)
        assert "already in snapshot" in copy.log()
    finally:
        original.cleanup()
        copy.cleanup()
    # What the lost machine acked after its last commit is lost with its disk; the
    # restored snapshot adds nothing twice.
    _assert_exactly(original_home, range(5000))


async def test_a_copy_of_a_sealed_segment_started_after_a_crash(
    tmp_path: Path, postgres_uri: str
) -> None:
    original_home, copy_home = _homes(tmp_path, postgres_uri)
    original, copy = Daemon(original_home), Daemon(copy_home)
    try:
        original.start()
        await original.wait_ready()
        await _ingest(original, range(3000))
        original.kill()
        # The original restarts and seals its segment (recovery), then dies again
        # before committing it; the directory is copied now.
        original.start(env={"ICESPOOL__CATALOG__URI": "postgresql+psycopg2://nobody@127.0.0.1:1/x"})
        with pytest.raises(DaemonError):
            await original.wait_ready(within=5)
        original.kill()
        _copy(original_home, copy_home)
        original.start()
        await original.wait_ready()
        copy.start()
        assert await copy.wait_exit(60) != 0  # its original runs on this machine
        await _stop(original)
        copy.start()  # the original is gone now: the copy adopts the spool
        await copy.wait_ready()
        await _stop(copy)
        assert "already in snapshot" in copy.log()
    finally:
        original.cleanup()
        copy.cleanup()
    _assert_exactly(original_home, range(3000))
    assert copy_home.spool_files() == []
