"""kill -9 of a real `icespool run` child at each step of an upsert commit that deletes by
position (tests/support/crash_seams): data files encoded and no attempt made; an attempt's
position deletes and tail copy written, the commit not sent; the commit landed, neither
the key index nor the spool told; the key index taking a landed commit, its transaction
not committed. After a clean restart every acked change is applied exactly once, in
order (the merged state equals the test's key by key, each segment in one snapshot),
later changes still delete by position, the key index names exactly the live row of
each key, and the orphan sweep leaves no file that no snapshot references.
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from urllib.parse import urlparse

import aiohttp
import pytest
from support.cdc_tables import assert_index_exact
from support.daemon_harness import TABLE, Daemon, DaemonDir, crash_seam_env

from icespool.cdc import KeyIndex, read_merged
from icespool.iceberg import SEGMENTS_SUMMARY_KEY
from icespool.spool import table_file_stem
from icespool.write import KEY_INDEX_DIR

_TIMEOUT = aiohttp.ClientTimeout(total=60)
_NDJSON = {"Content-Type": "application/x-ndjson"}
_MAINTENANCE = """\
key = ["id"]

[maintenance]
interval = "1s"
orphan_older_than = "1s"
"""
State = dict[int, str]


async def _send(
    session: aiohttp.ClientSession,
    daemon: Daemon,
    state: State,
    changes: list[tuple[int, str | None]],
) -> None:
    """Changes (id, value; None deletes) in one body, acked; ``state`` follows."""
    body = "".join(
        json.dumps({"id": i, "_op": "delete"} if v is None else {"id": i, "v": v, "_op": "upsert"})
        + "\n"
        for i, v in changes
    ).encode()
    url = f"{daemon.url}/v1/tables/{TABLE}/changes"
    async with session.post(url, data=body, headers=_NDJSON) as resp:
        assert resp.status == 200, f"{resp.status} {await resp.text()}\n{daemon.tail()}"
    for i, v in changes:
        if v is None:
            state.pop(i, None)
        else:
            state[i] = v


async def _index_ready(session: aiohttp.ClientSession, daemon: Daemon) -> None:
    for _ in range(600):
        async with session.get(f"{daemon.url}/v1/status") as resp:
            status = await resp.json()
        index = status["tables"][TABLE]["key_index"]
        if index is not None and index["ready"]:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"key index not ready: {index}\n{daemon.tail()}")


async def _position_commits(session: aiohttp.ClientSession, daemon: Daemon) -> float:
    text = await daemon.metrics(session)
    needle = f'icespool_upsert_commits_total{{deletes="position",table="{TABLE}"}} '
    lines = [line for line in text.splitlines() if line.startswith(needle)]
    return float(lines[0].rsplit(" ", 1)[1]) if lines else 0.0


def _round(tag: str, ids: range, deletes_every: int) -> list[tuple[int, str | None]]:
    return [(i, None if i % deletes_every == 0 else f"{tag}{i}") for i in ids]


@pytest.mark.parametrize(
    "seam",
    [
        "upsert-before-commit",
        "upsert-during-attempt",
        "upsert-after-commit",
        "upsert-during-index-update",
    ],
)
async def test_kill_9_at_each_step_of_an_upsert_commit_applies_every_change_once(
    tmp_path: Path, seam: str
) -> None:
    home = DaemonDir(tmp_path / "d")
    home.write_config(batch_timeout="3600s", extra=_MAINTENANCE)
    daemon = Daemon(home)
    state: State = {}
    try:
        # Every key once, committed (nothing to delete yet), and the index built.
        daemon.start()
        await daemon.wait_ready()
        async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
            await _index_ready(session, daemon)
            await _send(session, daemon, state, [(i, f"a{i}") for i in range(300)])
            await daemon.flush(session)
        daemon.signal(signal.SIGTERM)
        assert await daemon.wait_exit(60) == 0, daemon.tail()

        # The commit that deletes by position dies at the seam (the index update runs
        # when the index is next used: at the commit after).
        daemon.start(env=crash_seam_env(seam))
        await daemon.wait_ready()
        async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
            await _index_ready(session, daemon)
            await _send(session, daemon, state, _round("b", range(0, 300, 2), 7))
            if seam == "upsert-during-index-update":
                await daemon.flush(session)
                await _send(session, daemon, state, _round("c", range(100, 200), 5))
            with pytest.raises(aiohttp.ClientError):
                await daemon.flush(session)  # the daemon dies inside it
        assert await daemon.wait_exit(30) == -signal.SIGKILL, daemon.tail()
        assert f"crash seam: SIGKILL at {seam}" in daemon.log()
        assert home.spool_files(), "the kill came after the spool let go"

        # Recovered, then more changes of the same keys: each still deletes by position.
        daemon.start()
        await daemon.wait_ready()
        async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
            await daemon.flush(session)
            await _index_ready(session, daemon)
            before = await _position_commits(session, daemon)
            await _send(session, daemon, state, _round("d", range(0, 300, 3), 4))
            result = await daemon.flush(session)
            assert result["records"] == 100, result
            assert await _position_commits(session, daemon) == before + 1
            # What the killed attempt wrote and never committed is an orphan: the sweep
            # (every second here) takes it.
            for _ in range(600):
                if not await asyncio.to_thread(_unreferenced, home):
                    break
                await asyncio.sleep(0.1)
            assert await asyncio.to_thread(_unreferenced, home) == set()
        assert home.spool_files() == []
        daemon.signal(signal.SIGTERM)
        assert await daemon.wait_exit(60) == 0, daemon.tail()
    finally:
        daemon.cleanup()

    table, catalog = home.load_table()
    try:
        rows = read_merged(table).to_pylist()
        assert len(rows) == len({r["id"] for r in rows}), "a key live twice"
        assert {r["id"]: r["v"] for r in rows} == state
        segments = [
            segment
            for s in table.metadata.snapshots
            if s.summary is not None and s.summary.get(SEGMENTS_SUMMARY_KEY)
            for segment in s.summary[SEGMENTS_SUMMARY_KEY].split(",")
        ]
        assert len(segments) == len(set(segments)), "a segment committed twice"
        index_file = home.spool_dir / KEY_INDEX_DIR / f"{table_file_stem(TABLE)}.sqlite3"
        index = KeyIndex(index_file, [1], cache_bytes=1 << 20)
        try:
            # At the daemon's last commit, or behind by maintenance's: it follows.
            assert table.metadata.snapshot_by_id(index.snapshot_id) is not None
            assert_index_exact(index, table, ("id",))
        finally:
            index.close()
    finally:
        catalog.engine.dispose()


def _unreferenced(home: DaemonDir) -> set[str]:
    """Parquet files under the table's data directory that no snapshot references."""
    table, catalog = home.load_table()
    try:
        referenced = {
            urlparse(entry.data_file.file_path).path
            for snapshot in table.metadata.snapshots
            for manifest in snapshot.manifests(table.io)
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False)
        }
    finally:
        catalog.engine.dispose()
    root = Path(urlparse(table.metadata.location).path) / "data"
    return {str(p) for p in root.rglob("*.parquet")} - referenced
