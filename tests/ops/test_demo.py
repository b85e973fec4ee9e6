"""`make demo` end to end: deploy/demo/demo.py as a real subprocess in a temp directory.

It starts its own Apache Kafka broker, an `icespool run` child and a local Spark. The test checks
exact outcomes, not that it merely exited 0: every produced order id is in the table once
(with the produced kind and amount), the Spark table the demo printed has exactly the
produced count and sum per kind, and the by-hand spark-sql commands it printed run and
print the same numbers.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from decimal import Decimal
from pathlib import Path
from types import ModuleType

import pytest
from support.jvm import free_ports

from icespool.spark.conf import RUNTIME_DIR_ENV

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "deploy" / "demo" / "demo.py"
EVENTS = 10_000
DEMO_TIMEOUT_S = 240  # typically ~25 s: broker + daemon + produce + commit + Spark
SPARK_SQL_TIMEOUT_S = 180


def _demo_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("icespool_demo", DEMO)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _env() -> dict[str, str]:
    """The test's environment; the runtime as the Spark tests find it (make test sets it)."""
    env = dict(os.environ)
    env.setdefault(RUNTIME_DIR_ENV, str(REPO / ".spark-runtime"))
    return env


def _by_hand_env() -> dict[str, str]:
    """`_env`, and spark-sql's JVM on the JIT's C1 tier only (as the demo's own Spark):
    one small query runs in a third of the time of the default tiered compilation. The
    printed commands stay as they are."""
    return {**_env(), "SPARK_SUBMIT_OPTS": "-XX:TieredStopAtLevel=1"}


def _shown_table(stdout: str) -> dict[str, tuple[int, Decimal]]:
    """kind -> (orders, revenue) from the `DataFrame.show()` table the demo printed."""
    lines = stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.replace(" ", "").startswith("|kind|"))
    assert [c.strip() for c in lines[header].strip("|").split("|")] == [
        "kind",
        "orders",
        "revenue",
    ]
    shown = {}
    for line in lines[header + 2 :]:
        if not line.startswith("|"):
            break
        kind, orders, revenue = (c.strip() for c in line.strip("|").split("|"))
        assert kind not in shown, f"kind {kind} shown twice:\n{stdout}"
        shown[kind] = (int(orders), Decimal(revenue))
    return shown


def _daemon_command(stdout: str) -> str:
    """The printed command that starts a daemon on the demo's tables."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("The daemon on the demo"))
    commands = [line.strip() for line in lines[start:] if line.startswith("  icespool run ")]
    assert len(commands) == 1, stdout
    return commands[0]


def _by_hand_block(stdout: str) -> str:
    """The printed shell lines that run the query by hand (activate + spark-sql)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("The same query by hand"))
    end = next(i for i, line in enumerate(lines) if line.startswith("The daemon on the demo"))
    block = "\n".join(lines[start + 1 : end]).strip()
    assert "spark-sql" in block and "icespool spark-conf" in block, stdout
    return block


@pytest.mark.slow
def test_demo_end_to_end(tmp_path: Path) -> None:
    demo = _demo_module()
    orders = demo.sample_orders(EVENTS)
    expected = demo.expected_by_kind(orders)
    assert len(expected) == len(demo.KINDS)  # every kind is produced, with its own count
    root = tmp_path / "icespool-demo"

    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, str(DEMO), "--dir", str(root), "--events", str(EVENTS)],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )
    took = time.monotonic() - started
    report = f"status {result.returncode} after {took:.1f} s\n{result.stdout}\n{result.stderr}"
    assert result.returncode == 0, report
    assert "[demo] done" in result.stdout, report

    # The Spark result the demo printed: exactly the produced count and sum per kind.
    assert _shown_table(result.stdout) == expected, report

    # The table itself: every produced order exactly once, with its kind and amount.
    table = demo.load_table(root)
    assert table is not None, report
    rows = table.scan(selected_fields=("order_id", "kind", "amount")).to_arrow().to_pylist()
    ids = Counter(row["order_id"] for row in rows)
    assert [i for i, n in ids.items() if n > 1] == [], "order ids committed more than once"
    assert sorted(ids) == list(range(1, EVENTS + 1))
    assert {(r["order_id"], r["kind"], r["amount"]) for r in rows} == {
        (o["order_id"], o["kind"], Decimal(o["amount"])) for o in orders
    }
    # (The demo itself fails on dead letters, quarantine or a degraded table.)
    assert not list((root / "spool").glob("*.arrow")), report
    assert "stopped cleanly" in (root / "logs" / "icespool.log").read_text()

    # The by-hand commands it printed work as printed (from the same directory).
    block = _by_hand_block(result.stdout)
    by_hand = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block],
        cwd=tmp_path,
        env=_by_hand_env(),
        capture_output=True,
        text=True,
        timeout=SPARK_SQL_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )
    assert by_hand.returncode == 0, f"{block}\n{by_hand.stdout}\n{by_hand.stderr[-3000:]}"
    printed = {}
    for line in by_hand.stdout.splitlines():
        if line.startswith("--conf "):  # what the first line, icespool spark-conf, prints
            continue
        kind, count, revenue = line.split("\t")
        printed[kind] = (int(count), Decimal(revenue))
    assert printed == expected, f"{block}\n{by_hand.stdout}"

    # The printed daemon command gets ready (on a free port: 8080 may be taken here).
    _daemon_gets_ready(_daemon_command(result.stdout), tmp_path)


def _daemon_gets_ready(command: str, cwd: Path) -> None:
    port = free_ports(1)[0]
    env = {**_env(), "ICESPOOL__HTTP__LISTEN": f"127.0.0.1:{port}"}
    log_path = cwd / "by-hand-daemon.log"
    with log_path.open("wb") as log:
        daemon = subprocess.Popen(
            ["bash", "-c", f". {Path(sys.executable).parent / 'activate'} && exec {command}"],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert daemon.poll() is None, f"{command} exited:\n{log_path.read_text()}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, f"{command} not ready within 60 s"
                time.sleep(0.3)
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(60) == 0, log_path.read_text()
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(10)
