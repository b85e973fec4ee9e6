"""The README's example, end to end, run as written: its shell blocks in order, in a
directory laid out as a clone after `make run` and `make spark-runtime` (.venv and
.spark-runtime), against `icespool run` on the embedded default. Only the port differs
(a free one for localhost:8080, which another test may hold). Each block's printed result
is the one the README shows."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from support.jvm import free_ports

from icespool.spark.conf import RUNTIME_DIR_ENV

REPO = Path(__file__).resolve().parents[2]


def _example_blocks() -> list[str]:
    """The ```sh blocks of the README's "One example, end to end" section."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## One example, end to end", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.DOTALL)
    assert len(blocks) == 3, blocks
    return blocks


def _bash(block: str, cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, f"{block}\n{done.stdout}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.mark.slow
def test_the_readme_example_runs_as_written(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    clone.mkdir()
    (clone / ".venv").symlink_to(Path(sys.executable).parent.parent)
    runtime = os.environ.get(RUNTIME_DIR_ENV) or str(REPO / ".spark-runtime")
    (clone / ".spark-runtime").symlink_to(runtime)
    port = free_ports(1)[0]
    # Not the test run's own: the README's commands find the runtime as written.
    env = {k: v for k, v in os.environ.items() if not k.startswith("ICESPOOL")}
    # One small query: the JIT's C1 tier only, as the demo's Spark (a third of the time).
    env["SPARK_SUBMIT_OPTS"] = "-XX:TieredStopAtLevel=1"
    send, pyiceberg, spark = (
        block.replace("localhost:8080", f"localhost:{port}") for block in _example_blocks()
    )
    log_path = tmp_path / "icespool.log"
    with log_path.open("wb") as log:
        daemon = subprocess.Popen(
            [str(clone / ".venv/bin/icespool"), "run"],
            cwd=clone,
            env={**env, "ICESPOOL__HTTP__LISTEN": f"127.0.0.1:{port}"},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert daemon.poll() is None, log_path.read_text()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, "icespool run not ready within 60 s"
                time.sleep(0.3)

        # curl prints the answers one after another (they end without a newline).
        sent = _bash(send, clone, env)
        assert sent.startswith('{"accepted":2}{"table":"demo.events","snapshot_id":'), sent
        assert '"records":2,' in sent, sent

        rows = _bash(pyiceberg, clone, env)
        assert "'event_id': 1" in rows and "'kind': 'click'" in rows, rows
        assert "'event_id': 2" in rows and "'kind': 'view'" in rows, rows

        counted = _bash(spark, clone, env)
        assert sorted(counted.splitlines()) == ["click\t1", "view\t1"], counted
        # The output the README shows under the command.
        shown = [line.removeprefix("# ") for line in spark.splitlines() if line.startswith("# ")]
        assert sorted(shown) == ["click\t1", "view\t1"]
    finally:
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(60)
