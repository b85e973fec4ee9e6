"""`icespool dead-letters list`: a real daemon dead-letters Kafka records of two reasons;
the real CLI lists them by target table and reason, with the replay's filters."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from support.daemon_harness import TABLE, Daemon, DaemonDir, daemon_command
from support.kafka_harness import SESSION_TIMEOUT, Broker, create_topic, produce_values, unique_name

DEAD_TABLE = f"{TABLE}_dead_letter"
_PROMOTION = "which is not a legal Iceberg promotion"


def _cli(home: DaemonDir, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ICESPOOL")}
    return subprocess.run(
        [*daemon_command(), "dead-letters", "list", "--config", str(home.config_path), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _dead_rows(home: DaemonDir) -> list[dict[str, Any]]:
    from pyiceberg.catalog import load_catalog

    catalog = load_catalog("lake", **home.catalog_properties)
    try:
        table = catalog.load_table(DEAD_TABLE)
        return list(table.scan().to_arrow().to_pylist())
    except Exception:  # not created or nothing committed yet
        return []
    finally:
        catalog.engine.dispose()  # type: ignore[attr-defined]


async def test_list_counts_dead_letters_by_target_and_reason(
    broker: Broker, tmp_path: Path
) -> None:
    topic = unique_name("dl-list")
    await create_topic(broker.bootstrap, topic, 1)
    values = [
        b'{"id": 1, "v": "a"}',
        b"[1, 2]",  # invalid: not a JSON object
        b'{"id": "three", "v": "c"}',  # schema_change: text for the long column
        b"not json",
        b'{"id": 5, "v": "b"}',
        b'{"id": "six", "v": "d"}',
        b'"just text"',
    ]
    await produce_values(broker.bootstrap, topic, values)
    home = DaemonDir(tmp_path / "d")
    home.write_config(
        batch_timeout="1s",
        extra=f"""evolve = "add-columns"

[[kafka]]
bootstrap_servers = "{broker.bootstrap}"
group_id = "g-{topic}"
topics = ["{topic}"]
table = "{TABLE}"
session_timeout = "{SESSION_TIMEOUT}"
""",
    )
    daemon = Daemon(home)
    try:
        daemon.start()
        await daemon.wait_ready()
        for _ in range(600):
            dead = await asyncio.to_thread(_dead_rows, home)
            if len(dead) == 5:
                break
            await asyncio.sleep(0.1)
        assert len(dead) == 5, f"{len(dead)} dead letters\n{daemon.tail()}"
        assert sorted((d["offset"], d["reason"]) for d in dead) == [
            (1, "invalid"),
            (2, "schema_change"),
            (3, "invalid"),
            (5, "schema_change"),
            (6, "invalid"),
        ], [d["error"] for d in dead]
        at = {
            reason: sorted(d["dead_lettered_at"] for d in dead if d["reason"] == reason)
            for reason in ("invalid", "schema_change")
        }

        done = _cli(home)
        assert (done.returncode, done.stderr) == (0, ""), done.stdout
        iv, sc = at["invalid"], at["schema_change"]
        rows = [
            ("TARGET", "REASON", "COUNT", "FIRST", "LAST"),
            (
                TABLE,
                "invalid",
                "3",
                iv[0].isoformat(timespec="seconds"),
                iv[-1].isoformat(timespec="seconds"),
            ),
            (
                TABLE,
                "schema_change",
                "2",
                sc[0].isoformat(timespec="seconds"),
                sc[-1].isoformat(timespec="seconds"),
            ),
        ]
        expected = [f"{DEAD_TABLE}: 5 dead letters"]
        for r in rows:
            expected.append(
                "  ".join(
                    [r[0].ljust(8), r[1].ljust(13), r[2].rjust(5), r[3].ljust(25), r[4]]
                ).rstrip()
            )
        assert done.stdout.splitlines() == expected, done.stdout

        done = _cli(home, "--json")
        assert (done.returncode, done.stderr) == (0, ""), done.stdout
        assert json.loads(done.stdout) == {
            "table": DEAD_TABLE,
            "total": 5,
            "groups": [
                {
                    "target_table": TABLE,
                    "reason": "invalid",
                    "count": 3,
                    "first": iv[0].isoformat(),
                    "last": iv[-1].isoformat(),
                },
                {
                    "target_table": TABLE,
                    "reason": "schema_change",
                    "count": 2,
                    "first": sc[0].isoformat(),
                    "last": sc[-1].isoformat(),
                },
            ],
        }

        # The replay's filters select the same way.
        done = _cli(home, "--json", "--reason", "schema_change", "--from-offset", "3")
        [fifth] = [d["dead_lettered_at"].isoformat() for d in dead if d["offset"] == 5]
        assert json.loads(done.stdout)["groups"] == [
            {
                "target_table": TABLE,
                "reason": "schema_change",
                "count": 1,
                "first": fifth,
                "last": fifth,
            }
        ]
        done = _cli(home, "--topic", "other-topic")
        assert (done.returncode, done.stdout) == (0, f"{DEAD_TABLE}: no dead letters\n")
        done = _cli(home, "--since", "yesterday")
        assert done.returncode == 2 and done.stdout == "", done
        assert done.stderr == (
            "error: since 'yesterday' is not an ISO-8601 timestamp (e.g. 2024-05-01T12:00:00Z)\n"
        )
        done = _cli(home, "--table", "t.nothing_here")
        assert (done.returncode, done.stdout) == (1, ""), done
        assert done.stderr == (
            "error: the dead-letter table t.nothing_here does not exist in catalog 'lake' "
            "(the daemon creates it when it starts with the [[kafka]] section that names "
            "it)\n"
        ), done.stderr

        daemon.signal(signal.SIGTERM)
        assert await daemon.wait_exit(within=60) == 0, daemon.tail()
        assert any(
            f"column 'id': values are string but the column is long, {_PROMOTION}" in d["error"]
            for d in dead
        ), [d["error"] for d in dead]
    finally:
        daemon.cleanup()
