"""Real processes: SIGKILL at random moments, and the one-daemon-per-directory lock."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from icespool.spool import Spool, SpoolLockedError

HERE = Path(__file__).parent
SUPPORT = HERE.parent / "support"
REPO = HERE.parent.parent
TABLE = "ns.kill"


def _spawn(script: str, *args: str) -> subprocess.Popen[str]:
    env = dict(os.environ)
    return subprocess.Popen(
        [sys.executable, str(SUPPORT / script), *args],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


class _AckReader:
    """Collects the child's stdout lines on a thread, so the parent can kill at any time."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        assert proc.stdout is not None
        self._thread = threading.Thread(target=self._run, args=(proc.stdout,), daemon=True)
        self._thread.start()

    def _run(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self.lines.append(line.strip())

    def join(self) -> None:
        self._thread.join(timeout=10)


async def _recovered_ids(directory: Path) -> list[int]:
    async with Spool(directory) as spool:
        assert spool.recovered.quarantined == []
        ids: list[int] = []
        for info in spool.segments(TABLE):
            data = await spool.read(info.id)
            for batch, meta in zip(data.batches, data.metas, strict=True):
                assert isinstance(meta, dict)
                batch_id = int(meta["id"])  # type: ignore[call-overload]
                assert batch.num_rows == meta["rows"]
                assert set(batch.column("id").to_pylist()) == {batch_id}
                ids.append(batch_id)
        return ids


@pytest.mark.parametrize("durability", ["page-cache", "fsync"])
async def test_kill_9_never_loses_an_acked_batch(tmp_path: Path, durability: str) -> None:
    rng = random.Random(hash(durability) & 0xFFFF)
    acked_max = -1
    rounds = 20
    for round_no in range(rounds):
        proc = _spawn("spool_appender.py", str(tmp_path), durability)
        reader = _AckReader(proc)
        deadline = time.monotonic() + 20
        while not any(line.startswith("START") for line in reader.lines):
            assert proc.poll() is None, "appender died before starting"
            assert time.monotonic() < deadline
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.25))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        reader.join()
        assert proc.stdout is not None
        proc.stdout.close()
        acks = [int(line.split()[1]) for line in reader.lines if line.startswith("ACK")]
        if acks:
            acked_max = max(acked_max, acks[-1])
        ids = await _recovered_ids(tmp_path)
        # In order, no gap, no duplicate, nothing that was never appended, and
        # every acknowledged batch of every round so far.
        assert ids == list(range(len(ids))), f"round {round_no}"
        assert len(ids) > acked_max, f"round {round_no}: acked {acked_max}, have {len(ids)}"
    assert acked_max > rounds  # the kills really landed mid-stream


def test_second_opener_fails_fast_naming_the_pid_until_holder_dies(tmp_path: Path) -> None:
    proc = _spawn("spool_holder.py", str(tmp_path))
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "READY"

    async def try_open() -> None:
        async with Spool(tmp_path):
            pass

    try:
        started = time.monotonic()
        with pytest.raises(SpoolLockedError) as err:
            asyncio.run(try_open())
        assert time.monotonic() - started < 1.0
        assert err.value.pid == proc.pid
        assert f"locked by pid {proc.pid}" in str(err.value)
        assert str(tmp_path) in str(err.value)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    # The kernel dropped the lock with the process.
    asyncio.run(try_open())


async def test_second_opener_in_same_process_fails(tmp_path: Path) -> None:
    async with Spool(tmp_path):
        with pytest.raises(SpoolLockedError, match=f"pid {os.getpid()}"):
            await Spool(tmp_path).open()
