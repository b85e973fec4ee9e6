"""Status survives a spool directory made unreadable under a running daemon: a real
`icespool run` child whose spool directory (or its ``quarantine/``) is chmod 000.

The tests run as root, for whom chmod does not bite: the daemon runs under `setpriv`
without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH, so the kernel applies the owner's
permission bits to it as to any other user. /v1/status, /metrics and `icespool status`
answer 200 naming the path and the errno; once the directory is readable again the
problem clears and every acked record is committed exactly once.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from collections import Counter
from pathlib import Path

import aiohttp
import pytest
from support.daemon_harness import TABLE, Daemon, DaemonDir, daemon_command

# Root without the capabilities that skip permission checks: chmod 000 denies it.
_NO_DAC = [
    "setpriv",
    "--inh-caps=-dac_override,-dac_read_search",
    "--bounding-set=-dac_override,-dac_read_search",
]


@pytest.fixture(autouse=True)
def _setpriv() -> None:
    """setpriv comes with util-linux (essential on Debian): missing means a broken
    machine, which must fail here rather than leave these tests unrun."""
    assert shutil.which("setpriv") is not None, "setpriv (util-linux) is missing"


async def _cli_status(url: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ICESPOOL")}
    proc = await asyncio.create_subprocess_exec(
        *daemon_command(),
        "status",
        "--url",
        url,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.parametrize("broken", ["spool", "quarantine"])
async def test_status_metrics_and_cli_name_an_unreadable_spool_directory(
    tmp_path: Path, broken: str
) -> None:
    home = DaemonDir(tmp_path / "d")
    home.write_config(batch_timeout="1h")
    daemon = Daemon(home)
    quarantine = home.spool_dir / "quarantine"
    target = home.spool_dir if broken == "spool" else quarantine
    problem = f"cannot read the spool directory {quarantine}: Permission denied (EACCES)"
    try:
        daemon.start(wrapper=_NO_DAC)
        await daemon.wait_ready()
        quarantine.mkdir(exist_ok=True)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            ids = list(range(100))
            await daemon.ingest(session, [{"id": i, "v": f"v{i}"} for i in ids])

            target.chmod(0)
            try:
                for _ in range(3):  # several scrapes: the problem is logged once
                    async with session.get(f"{daemon.url}/v1/status") as resp:
                        assert resp.status == 200, await resp.text()
                        state = await resp.json()
                    metrics = await daemon.metrics(session)
                assert state["spool"]["problem"] == problem, state["spool"]
                assert state["tables"][TABLE]["pending_records"] == 100
                assert state["quarantine"]["segments"] == 0
                series = f'icespool_spool_unreadable{{error="EACCES",path="{quarantine}"}} 1.0'
                assert series in metrics.splitlines(), metrics

                code, out, err = await _cli_status(daemon.url)
                assert (code, err) == (0, ""), out
                assert out.splitlines()[2] == f"SPOOL PROBLEM: {problem}", out
            finally:
                target.chmod(0o755)

            log = daemon.log()
            assert [problem in line for line in log.splitlines()].count(True) == 1, log
            assert "Traceback" not in log and "PermissionError" not in log, daemon.tail()
            assert " 500" not in log, daemon.tail()

            async with session.get(f"{daemon.url}/v1/status") as resp:
                assert resp.status == 200
                assert (await resp.json())["spool"]["problem"] is None
            assert "icespool_spool_unreadable{" not in await daemon.metrics(session)
            await daemon.wait_log("the spool can be read again", within=5)
            code, out, _ = await _cli_status(daemon.url)
            assert code == 0 and "SPOOL PROBLEM" not in out, out

        daemon.signal(signal.SIGTERM)
        assert await daemon.wait_exit(within=40) == 0, daemon.tail()
        rows, _ = home.read_rows()
        counts = Counter(row["id"] for row in rows)
        assert sorted(counts) == ids and set(counts.values()) == {1}
        assert home.spool_files() == []
    finally:
        if target.exists():
            target.chmod(0o755)
        daemon.cleanup()
