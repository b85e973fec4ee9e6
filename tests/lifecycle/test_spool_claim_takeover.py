"""A copy of a spool running on "another machine" and an original paused past its claim.

Real `icespool run` children on one PostgreSQL catalog and one warehouse. The copy runs
in a pid namespace of its own (``unshare --pid --fork --mount-proc``), so it cannot look
the original's pid up: to it, the original may run on another machine. ``claim_ttl`` is
3 s (its minimum) so the waits stay short.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from collections import Counter
from pathlib import Path

import aiohttp
from support.daemon_harness import Daemon, DaemonDir

ELSEWHERE = ("unshare", "--pid", "--fork", "--mount-proc", "--kill-child")


def _homes(tmp_path: Path, postgres_uri: str) -> tuple[DaemonDir, DaemonDir]:
    warehouse = tmp_path / "warehouse"
    homes = []
    for name in ("original", "copy"):
        home = DaemonDir(tmp_path / name, catalog_uri=postgres_uri, shared_warehouse=warehouse)
        home.write_config(
            batch_timeout="1h", max_batch_records=10_000_000, spool_extra='claim_ttl = "3s"'
        )
        homes.append(home)
    return homes[0], homes[1]


def _copy(source: DaemonDir, target: DaemonDir) -> None:
    shutil.rmtree(target.spool_dir, ignore_errors=True)
    shutil.copytree(source.spool_dir, target.spool_dir, symlinks=True)


def _records(ids: range) -> list[dict[str, object]]:
    return [{"id": i, "v": f"r{i}"} for i in ids]


def _ids(home: DaemonDir) -> Counter[int]:
    rows, _ = home.read_rows()  # a full scan: fails if a data file is missing
    return Counter(int(r["id"]) for r in rows)


def _assert_exactly(home: DaemonDir, expected: set[int]) -> None:
    ids = _ids(home)
    assert set(ids) == expected, (
        f"missing {sorted(expected - set(ids))[:10]}.. ({len(expected - set(ids))}), "
        f"extra {len(set(ids) - expected)}"
    )
    assert [i for i, n in ids.items() if n > 1] == []


def _inner_pid(daemon: Daemon) -> int:
    """The daemon's own pid: under ``unshare --fork`` the child's, which unshare does
    not forward signals to."""
    assert daemon.pid is not None
    children = Path(f"/proc/{daemon.pid}/task/{daemon.pid}/children").read_text().split()
    return int(children[0]) if children else daemon.pid


async def _stop(daemon: Daemon) -> None:
    os.kill(_inner_pid(daemon), signal.SIGTERM)
    assert await daemon.wait_exit(60) == 0, daemon.tail()


async def test_a_copy_elsewhere_waits_refuses_then_adopts_after_a_kill(
    tmp_path: Path, postgres_uri: str
) -> None:
    original_home, copy_home = _homes(tmp_path, postgres_uri)
    original, copy = Daemon(original_home), Daemon(copy_home)
    try:
        original.start()
        await original.wait_ready()
        async with aiohttp.ClientSession() as session:
            await original.ingest(session, _records(range(2000)))
            _copy(original_home, copy_home)
            await original.ingest(session, _records(range(2000, 4000)))
        copy.start(wrapper=ELSEWHERE)
        assert await copy.wait_exit(60) != 0, copy.tail()
        log = copy.log()
        assert "may still run on another machine" in log, copy.tail()
        assert "it renewed its claim just now" in log, copy.tail()
        assert _ids(original_home) == Counter()
        original.kill()
        copy.start(wrapper=ELSEWHERE)
        await copy.wait_ready()
        assert "lapsed (unchanged for 3s); adopting the spool" in copy.log(), copy.tail()
        await _stop(copy)
        _assert_exactly(original_home, set(range(2000)))
        original.start()  # the rest: 2,000 more records of the same segment
        await original.wait_ready()
        assert "has 2000 of its 4000 records in the table already" in original.log()
        await _stop(original)
    finally:
        original.cleanup()
        copy.cleanup()
    _assert_exactly(original_home, set(range(4000)))


async def test_an_original_paused_past_its_claim_acks_nothing_it_cannot_commit(
    tmp_path: Path, postgres_uri: str
) -> None:
    """The original is SIGSTOPped past claim_ttl; a copy elsewhere adopts the spool and
    commits. Resumed, the original has lost its claim: it commits nothing more and
    takes no more records (503 naming why, /readyz 503, counted). Once the copy is
    stopped, the original's restart commits exactly what it acked and the copy did not."""
    original_home, copy_home = _homes(tmp_path, postgres_uri)
    original, copy = Daemon(original_home), Daemon(copy_home)
    try:
        original.start()
        await original.wait_ready()
        async with aiohttp.ClientSession() as session:
            await original.ingest(session, _records(range(2000)))
            _copy(original_home, copy_home)
            await original.ingest(session, _records(range(2000, 4000)))
            original.signal(signal.SIGSTOP)
            copy.start(wrapper=ELSEWHERE)
            await copy.wait_ready()
            assert "adopting the spool" in copy.log(), copy.tail()
            assert 'icespool_spool_claim_changes_total{kind="adopted"} 1.0' in (
                await copy.metrics(session)
            )
            await copy.ingest(session, _records(range(10_000, 11_000)))
            await copy.flush(session)
            original.signal(signal.SIGCONT)
            await original.wait_log("took its claim over", within=30)
            status, text = await original.post_records(session, _records(range(20_000, 20_100)))
            assert status == 503, text
            assert "took its claim over" in text and "takes no more records" in text, text
            async with session.post(original.flush_url()) as resp:
                assert resp.status == 503, await resp.text()
            async with session.get(f"{original.url}/readyz") as resp:
                assert resp.status == 503
                assert "took its claim over" in await resp.text()
            metrics = await original.metrics(session)
            assert 'icespool_spool_claim_changes_total{kind="lost"} 1.0' in metrics, metrics
            assert "icespool_ready 0.0" in metrics
        _assert_exactly(original_home, set(range(2000)) | set(range(10_000, 11_000)))
        await _stop(copy)
        await _stop(original)
        original.start()  # the copy is gone: the original's spool commits the rest
        await original.wait_ready()
        assert "has 2000 of its 4000 records in the table already" in original.log()
        await _stop(original)
    finally:
        if original.running and original.pid is not None:
            os.kill(original.pid, signal.SIGCONT)
        original.cleanup()
        copy.cleanup()
    _assert_exactly(original_home, set(range(4000)) | set(range(10_000, 11_000)))
    assert original_home.spool_files() == [] and copy_home.spool_files() == []


async def test_two_copies_started_at_the_same_instant(tmp_path: Path, postgres_uri: str) -> None:
    """Copies of a killed daemon's spool, started together (one in a pid namespace of
    its own): at most one keeps the claim, and every acked record lands exactly once."""
    original_home, copy_home = _homes(tmp_path, postgres_uri)
    original, copy = Daemon(original_home), Daemon(copy_home)
    acked: set[int] = set()
    try:
        for round_ in range(3):
            original.start()
            await original.wait_ready()
            base = round_ * 10_000
            async with aiohttp.ClientSession() as session:
                await original.ingest(session, _records(range(base, base + 2000)))
                _copy(original_home, copy_home)
                await original.ingest(session, _records(range(base + 2000, base + 3000)))
            acked |= set(range(base, base + 3000))
            original.kill()
            original.start()
            copy.start(wrapper=ELSEWHERE)
            outcomes = await asyncio.gather(
                original.wait_ready(), copy.wait_ready(), return_exceptions=True
            )
            print(round_, outcomes)
            await asyncio.sleep(4)  # past a renewal: the loser knows by now
            for daemon in (original, copy):
                if daemon.running:
                    await _stop(daemon)
            # Whoever was refused or lost commits the rest on its own now.
            for daemon in (original, copy):
                daemon.start(wrapper=ELSEWHERE if daemon is copy else ())
                await daemon.wait_ready()
                await _stop(daemon)
            _assert_exactly(original_home, acked)
            assert original_home.spool_files() == [] and copy_home.spool_files() == []
    finally:
        original.cleanup()
        copy.cleanup()
