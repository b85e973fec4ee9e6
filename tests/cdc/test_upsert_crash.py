"""kill -9 of a real `icespool run` child while keyed changes stream in: after every
restart the table's merged state is exactly the acked changes applied in order, each
once (a segment committed twice, or an older one after a newer, would change a key).
Then keyed changes left spooled for a table whose key was removed are quarantined."""

from __future__ import annotations

import asyncio
import random
import signal
from pathlib import Path
from typing import Any

import aiohttp
import pyarrow as pa
import pyarrow.ipc as ipc
from support.daemon_harness import Daemon, DaemonDir

from icespool.cdc import DELETE, OP_COLUMN, UPSERT, read_merged

_ARROW = {"Content-Type": "application/vnd.apache.arrow.stream"}
_TIMEOUT = aiohttp.ClientTimeout(total=20)
_SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("v", pa.string()),
        pa.field(OP_COLUMN, pa.int8(), nullable=False),
    ]
)
_KEYS = 400
_CHANGES = 120


def _body(rng: random.Random, tag: str) -> tuple[bytes, list[tuple[int, int, str | None]]]:
    changes: list[tuple[int, int, str | None]] = []
    for i in range(_CHANGES):
        key = rng.randrange(_KEYS)
        if rng.random() < 0.3:
            changes.append((key, DELETE, None))
        else:
            changes.append((key, UPSERT, f"{tag}-{i}"))
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array([c[0] for c in changes], pa.int64()),
            pa.array([c[2] for c in changes], pa.string()),
            pa.array([c[1] for c in changes], pa.int8()),
        ],
        schema=_SCHEMA,
    )
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, _SCHEMA) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes(), changes


async def _post(session: aiohttp.ClientSession, daemon: Daemon, body: bytes) -> bool:
    """True once the daemon acked the body; False when the kill cut the request."""
    try:
        async with session.post(daemon.records_url(), data=body, headers=_ARROW) as resp:
            text = await resp.text()
            assert resp.status == 200, f"{resp.status} {text}\n{daemon.tail()}"
            return True
    except (aiohttp.ClientError, OSError, TimeoutError):
        return False


async def test_kill_9_mid_ingest_of_changes_leaves_exactly_the_acked_state_once(
    tmp_path: Path,
) -> None:
    home = DaemonDir(tmp_path / "d")
    # Small age trigger: commits run all the time, so kills land inside them too.
    home.write_config(batch_timeout="0.3s", extra='key = ["id"]\n')
    daemon = Daemon(home)
    rng = random.Random(1616)
    expected: dict[int, str] = {}
    acked = 0
    uncertain: tuple[bytes, list[tuple[int, int, str | None]]] | None = None

    def apply(changes: list[tuple[int, int, str | None]]) -> None:
        for key, op, value in changes:
            if op == DELETE:
                expected.pop(key, None)
            else:
                assert value is not None
                expected[key] = value

    try:
        for round_no in range(3):
            daemon.start()
            await daemon.wait_ready()
            async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
                if uncertain is not None:
                    # Cut by the kill: spooled or not. Sending it again is the same as
                    # once (its last change per key wins either way).
                    assert await _post(session, daemon, uncertain[0])
                    apply(uncertain[1])
                    acked += 1
                    uncertain = None
                stop = asyncio.get_running_loop().time() + rng.uniform(0.8, 2.0)
                sent = 0
                while True:
                    body, changes = _body(rng, f"r{round_no}b{sent}")
                    sent += 1
                    if asyncio.get_running_loop().time() >= stop:
                        # The request the kill cuts: started, then SIGKILL meanwhile.
                        post = asyncio.create_task(_post(session, daemon, body))
                        await asyncio.sleep(rng.uniform(0.0, 0.01))
                        assert daemon.kill() == -signal.SIGKILL
                        if await post:
                            apply(changes)
                            acked += 1
                        else:
                            uncertain = (body, changes)
                        break
                    assert await _post(session, daemon, body)
                    apply(changes)
                    acked += 1
        daemon.start()
        await daemon.wait_ready()
        async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
            if uncertain is not None:
                assert await _post(session, daemon, uncertain[0])
                apply(uncertain[1])
                acked += 1
            await daemon.flush(session)
            # Then one more batch, spooled but not committed (the age trigger is 0.3 s
            # away) when the daemon dies ...
            assert await _post(session, daemon, _body(rng, "last")[0])
        assert daemon.kill() == -signal.SIGKILL
        # Restarts found spooled changes to recover: the kills hit uncommitted data.
        recovered = [daemon.log(start) for start in range(2, daemon.starts + 1)]
        assert any("replaying" in log for log in recovered), daemon.all_logs()[-3000:]
        # ... and the table's key is removed meanwhile: the keyed changes are struck and
        # quarantined naming the fix, never appended with their deletes turned into rows.
        home.write_config(batch_timeout="3600s")
        daemon.start()
        await daemon.wait_ready()
        await daemon.wait_log("quarantined after 3 attempts", within=30)
        assert "has no key now; restore its [[tables]] key and replay" in daemon.log()
        assert len(home.quarantined()) >= 1
    finally:
        daemon.cleanup()

    table, catalog = home.load_table()
    try:
        rows: list[dict[str, Any]] = read_merged(table).to_pylist()
    finally:
        catalog.engine.dispose()
    got = {r["id"]: r["v"] for r in rows}
    assert len(rows) == len(got), "a key appears twice in the merged state"
    assert got == expected
    assert acked >= 8 and len(expected) > 100
