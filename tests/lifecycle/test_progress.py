"""Progress of start-up recovery and `icespool replay`: exact counts, bounded log rate.

The real-process tests spool records in many small segments through a real daemon,
kill -9 it, and read the progress lines of the next start (or of `icespool replay`).
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
import pty
import re
import subprocess
from pathlib import Path

import aiohttp
import pytest
from support.daemon_harness import Daemon, DaemonDir, daemon_command

from icespool.config import human_bytes, human_seconds
from icespool.lifecycle.progress import Progress

# Every POST below is ~1.5 KiB in the spool: with 1 KiB segments each one is a segment.
SMALL_SEGMENTS = 'segment_max_bytes = "1KiB"'
POSTS = 12
PER_POST = 25
_FIELDS = re.compile(r"(\w+)=(\S+)")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_progress_logs_at_a_bounded_rate_with_rate_and_eta(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    progress = Progress("recovery", records=800, nbytes=8 * 2**20, segments=80, clock=clock)
    caplog.set_level(logging.INFO, logger="icespool.progress")

    for _ in range(79):  # 80 segments of 10 records, one every 0.125 s: 10 s in all
        clock.now += 0.125
        progress.advance(10, 2**20 // 10)
    clock.now += 0.0625  # the last one half-way into the last step
    progress.advance(10, 2**20 // 10)
    progress.finish()
    progress.finish()  # idempotent

    messages = [r.getMessage() for r in caplog.records]
    # At 5 s (the interval) and at the end: not one line per segment.
    assert messages == [
        "recovery: 400 of 800 records (50.0%), 4.0 MiB of 8.0 MiB, 40 of 80 segments, "
        "80 records/s, ETA 5.0s",
        "recovery: 800 of 800 records (100.0%), 8.0 MiB of 8.0 MiB, 80 of 80 segments, "
        "81 records/s, done in 9.9s",
    ]
    last = caplog.records[-1].__dict__
    assert {k: last[k] for k in ("progress_records", "progress_total_records")} == {
        "progress_records": 800,
        "progress_total_records": 800,
    }
    assert last["progress_percent"] == 100.0 and last["progress_finished"] is True


def test_progress_redraws_one_terminal_line() -> None:
    clock, screen = Clock(), io.StringIO()
    progress = Progress("replay", records=4, nbytes=4096, segments=4, line=screen, clock=clock)
    progress.draw()
    for _ in range(4):
        clock.now += 0.25  # each one past the redraw interval
        progress.advance(1, 1024)
    progress.finish()

    drawn = screen.getvalue()
    assert "\n" not in drawn  # one line, redrawn; the final state goes to the log
    frames = drawn.split("\r\x1b[K")
    assert frames[0] == ""
    assert (
        frames[1]
        == "replay: 0 of 4 records (0.0%), 0 B of 4.0 KiB, 0 of 4 segments, 0 records/s, ETA ?\r"
    )
    assert frames[-2].startswith("replay: 4 of 4 records (100.0%), 4.0 KiB of 4.0 KiB, 4 of 4")
    assert frames[-1] == ""  # cleared at the end


def test_progress_of_nothing_is_complete() -> None:
    progress = Progress("recovery", records=0, nbytes=0, segments=0)
    assert (progress.percent, progress.eta()) == (100.0, 0.0)


@pytest.mark.parametrize(
    ("value", "text"),
    [(0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"), (10 * 2**30, "10.0 GiB")],
)
def test_human_bytes(value: int, text: str) -> None:
    assert human_bytes(value) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [(None, "-"), (4.25, "4.2s"), (42, "42s"), (75, "1m15s"), (4000, "1h06m"), (200000, "2d07h")],
)
def test_human_seconds(value: float | None, text: str) -> None:
    assert human_seconds(value) == text


# ------------------------------------------------------------------ real processes


async def spool_and_kill(daemon: Daemon, first_id: int) -> tuple[int, int]:
    """Ingest POSTS x PER_POST records, kill -9: returns (records, spooled segments)."""
    daemon.start()
    await daemon.wait_ready()
    async with aiohttp.ClientSession() as session:
        for post in range(POSTS):
            start = first_id + post * PER_POST
            await daemon.ingest(
                session, [{"id": i, "v": "x" * 40} for i in range(start, start + PER_POST)]
            )
    daemon.kill()
    return POSTS * PER_POST, len(daemon.home.spool_files())


def progress_fields(log: str) -> list[dict[str, str]]:
    return [
        dict(_FIELDS.findall(line)) for line in log.splitlines() if "[icespool.progress]" in line
    ]


def check_progress(log: str, records: int, segments: int) -> None:
    """The start line, and the last progress line at 100% with the same totals."""
    match = re.search(
        rf"replaying {segments} spooled segments of 1 tables: {records} records, (\d+) bytes",
        log,
    )
    assert match, log
    total_bytes = match.group(1)
    lines = progress_fields(log)
    assert lines, log
    assert lines[-1] == {
        "progress": "recovery",
        "progress_records": str(records),
        "progress_total_records": str(records),
        "progress_bytes": total_bytes,
        "progress_total_bytes": total_bytes,
        "progress_segments": str(segments),
        "progress_total_segments": str(segments),
        "progress_percent": "100.0",
        "progress_eta_seconds": "0.0",
        "progress_finished": "True",
        "progress_elapsed_seconds": lines[-1]["progress_elapsed_seconds"],
        "progress_records_per_second": lines[-1]["progress_records_per_second"],
    }
    assert re.search(
        rf"recovery: {records} of {records} records \(100\.0%\), .* {segments} of {segments} "
        r"segments, \d+ records/s, done in ",
        log,
    ), log


@pytest.mark.slow
async def test_restart_reports_recovery_progress(tmp_path: Path) -> None:
    home = DaemonDir(tmp_path)
    home.write_config(spool_extra=SMALL_SEGMENTS)
    daemon = Daemon(home)
    try:
        records, segments = await spool_and_kill(daemon, 0)
        assert segments >= POSTS - 1  # many segments, not one

        daemon.start()
        await daemon.wait_ready()
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{daemon.url}/v1/status") as resp,
        ):
            status = await resp.json()
    finally:
        daemon.cleanup()

    check_progress(daemon.log(), records, segments)
    recovery = status["recovery"]
    assert {k: recovery[k] for k in ("records", "total_records", "segments", "percent")} == {
        "records": records,
        "total_records": records,
        "segments": segments,
        "percent": 100.0,
    }
    assert recovery["bytes"] == recovery["total_bytes"] and recovery["finished"] is True
    rows, _ = home.read_rows()
    assert sorted(r["id"] for r in rows) == list(range(records))


@pytest.mark.slow
async def test_replay_reports_progress_in_the_log_and_on_a_terminal(tmp_path: Path) -> None:
    home = DaemonDir(tmp_path)
    config = home.write_config(spool_extra=SMALL_SEGMENTS)
    daemon = Daemon(home)
    replay = [*daemon_command(), "replay", "--config", str(config)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ICESPOOL")}
    try:
        records, segments = await spool_and_kill(daemon, 0)

        piped = await asyncio.to_thread(
            subprocess.run, replay, capture_output=True, text=True, timeout=120, env=env
        )

        assert piped.returncode == 0, piped.stderr
        assert "\r" not in piped.stderr  # not a terminal: log lines only
        check_progress(piped.stderr, records, segments)
        assert home.spool_files() == []

        more, segments = await spool_and_kill(daemon, records)
        master, slave = pty.openpty()
        try:
            proc = await asyncio.to_thread(
                subprocess.run, replay, stderr=slave, stdout=slave, timeout=120, env=env
            )
            os.close(slave)
            slave = -1
            screen = b""
            while True:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the child's side is closed and drained
                    break
                if not chunk:
                    break
                screen += chunk
        finally:
            if slave >= 0:
                os.close(slave)
            os.close(master)
    finally:
        daemon.cleanup()

    text = screen.decode()
    assert proc.returncode == 0, text
    # The terminal line: drawn at 0% first, cleared before the final log line.
    assert f"\r\x1b[Krecovery: 0 of {more} records (0.0%)" in text
    check_progress(text.replace("\r\n", "\n"), more, segments)
    rows, _ = home.read_rows()
    assert sorted(r["id"] for r in rows) == list(range(records + more))
