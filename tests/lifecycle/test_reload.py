"""SIGHUP reload: the pure diff, and a real `icespool run` that reloads its config file."""

from __future__ import annotations

import asyncio
import copy
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
from support.daemon_harness import TABLE, Daemon, DaemonDir

from icespool.config import Config, embedded_default, validate_config
from icespool.lifecycle.reload import plan_reload


def _raw(tmp_path: Path) -> dict[str, Any]:
    raw = embedded_default(tmp_path / "data")
    raw["tables"].append(
        {"name": "demo.other", "create": True, "schema": [{"name": "id", "type": "long"}]}
    )
    return raw


def _pair(tmp_path: Path, change: Any) -> tuple[Config, Config]:
    raw = _raw(tmp_path)
    new = copy.deepcopy(raw)
    change(new)
    return validate_config(raw), validate_config(new)


def test_unchanged_config_plans_nothing(tmp_path: Path) -> None:
    old, new = _pair(tmp_path, lambda raw: None)
    plan = plan_reload(old, new, ["demo.events", "demo.other"])
    assert (plan.applied, plan.not_applied, dict(plan.settings)) == ((), (), {})
    assert not plan.changed


def test_batch_settings_and_log_level_are_applied(tmp_path: Path) -> None:
    def change(raw: dict[str, Any]) -> None:
        raw["defaults"] = {"batch_timeout": "5s", "compression": "snappy"}
        raw["tables"][0]["max_batch_records"] = 1000
        raw["log"] = {"level": "debug"}

    old, new = _pair(tmp_path, change)
    plan = plan_reload(old, new, ["demo.events", "demo.other"])
    assert plan.applied == (
        "defaults.batch_timeout: 1m -> 5s",
        "defaults.compression: zstd -> snappy",
        "log.level: info -> debug",
        "tables['demo.events'].max_batch_records: (default) -> 1000",
    )
    assert plan.not_applied == ()
    events, other = plan.settings["demo.events"], plan.settings["demo.other"]
    assert (events.batch_timeout, events.compression, events.max_batch_records) == (
        5.0,
        "snappy",
        1000,
    )
    assert (other.batch_timeout, other.max_batch_records) == (5.0, 500_000)
    assert plan.config.table_settings("demo.events") == events
    assert plan.config.log.level == "debug"


def test_restart_only_changes_are_named_and_not_applied(tmp_path: Path) -> None:
    def change(raw: dict[str, Any]) -> None:
        raw["catalog"]["uri"] = "postgresql+psycopg2://icespool:hunter2@db/lake"
        raw["spool"]["durability"] = "fsync"
        raw["http"]["listen"] = "0.0.0.0:9000"
        raw["encode"] = {"workers": 3}
        raw["tables"][0]["partition_by"] = []
        raw["tables"][1]["batch_timeout"] = "2s"
        raw["tables"].append({"name": "demo.added"})
        del raw["tables"][1]  # demo.other removed, so its batch_timeout is moot

    old, new = _pair(tmp_path, change)
    plan = plan_reload(old, new, ["demo.events", "demo.other"])
    assert plan.applied == ()
    assert plan.not_applied == (
        "catalog.uri",
        "encode.workers",
        "http.listen",
        "spool.durability",
        "tables['demo.added'] added (created and served after a restart)",
        "tables['demo.events'].partition_by",
        "tables['demo.other'] removed (its writer runs until restart)",
    )
    assert "hunter2" not in repr(plan.not_applied)  # keys only, never secret values
    assert dict(plan.settings) == {}
    # The running config keeps what was not applied.
    assert plan.config.catalog == old.catalog and plan.config.spool == old.spool
    assert [t.name for t in plan.config.tables] == ["demo.events", "demo.other"]
    assert plan.config.tables[0].partition_by == ["day(ts)"]


def test_kafka_changes_are_not_applied(tmp_path: Path) -> None:
    def change(raw: dict[str, Any]) -> None:
        raw["kafka"] = [
            {"bootstrap_servers": "127.0.0.1:9092", "topics": ["e"], "table": "demo.events"}
        ]

    old, new = _pair(tmp_path, change)
    plan = plan_reload(old, new, ["demo.events"])
    assert plan.applied == ()
    assert "kafka[0].topics" in plan.not_applied
    assert all(key.startswith("kafka[0].") for key in plan.not_applied)


async def test_sighup_applies_batch_timeout_and_reports_what_it_could_not(tmp_path: Path) -> None:
    home = DaemonDir(tmp_path / "d")
    home.write_config(batch_timeout="60s")
    daemon = Daemon(home)
    daemon.start()
    try:
        await daemon.wait_ready()
        async with aiohttp.ClientSession() as session:
            await daemon.ingest(session, [{"id": i, "v": "x"} for i in range(3)])
            # Lower batch_timeout (applied), switch durability and add a table (restart).
            home.write_config(
                batch_timeout="1s",
                durability="fsync",
                extra='\n[[tables]]\nname = "t.more"\n',
            )
            text = home.config_path.read_text()
            home.config_path.write_text(text.replace('level = "info"', 'level = "debug"'))
            sighup_at = time.monotonic()
            daemon.signal(signal.SIGHUP)
            await daemon.wait_log("SIGHUP: applied", within=10)
            log = daemon.log()
            assert (
                "SIGHUP: applied defaults.batch_timeout: 1m -> 1s; log.level: info -> debug" in log
            )
            assert "-> 200 in" not in log  # per-request lines are debug-level
            assert (
                "SIGHUP: not applied (needs a restart): spool.durability; "
                "tables['t.more'] added (created and served after a restart)"
            ) in log
            # The 3 records were acked under a 60 s timeout; they now commit by age.
            status: dict[str, Any] = {}
            while time.monotonic() - sighup_at < 10:
                async with session.get(f"{daemon.url}/v1/status") as resp:
                    status = await resp.json()
                if status["tables"][TABLE]["last_commit"] is not None:
                    break
                await asyncio.sleep(0.05)
            commit = status["tables"][TABLE]["last_commit"]
            assert commit is not None, daemon.tail()
            assert (commit["reason"], commit["records"]) == ("age", 3)
            assert time.monotonic() - sighup_at < 4.0
            # The new log level is live: requests are now logged at debug.
            assert "GET /v1/status -> 200 in" in daemon.log()

            # A broken file changes nothing and names the key; the daemon keeps serving.
            home.write_config(batch_timeout="soon")
            daemon.signal(signal.SIGHUP)
            await daemon.wait_log("SIGHUP: config not reloaded", within=10)
            assert "config key 'defaults.batch_timeout'" in daemon.log()
            assert daemon.running
            await daemon.ingest(session, [{"id": 9, "v": "y"}])
        daemon.signal(signal.SIGTERM)
        assert await daemon.wait_exit(30) == 0
        rows, _ = home.read_rows()
        assert sorted(r["id"] for r in rows) == [0, 1, 2, 9]
    finally:
        daemon.cleanup()
