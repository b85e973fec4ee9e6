"""Dead-letter replay against a real broker (Apache Kafka) and a real catalog: records
dead-lettered because the table lacked a column land exactly once after the column
is added, are removed from the dead-letter table, a second replay changes nothing,
records that still fail stay (with their new error), and a kill -9 between the
target's commit and the dead-letter removal never lands one twice.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.types import StringType
from support.daemon_harness import (
    CATALOG_NAME,
    TABLE,
    Daemon,
    DaemonDir,
    crash_seam_env,
    daemon_command,
)
from support.fixture_types import MakeConfig, RunDaemon
from support.kafka_harness import (
    SESSION_TIMEOUT,
    Broker,
    create_topic,
    produce_values,
    unique_name,
)
from support.service_helpers import table_rows, wait_rows

from icespool.config import Config
from icespool.errors import ConfigError
from icespool.kafka import replay_group
from icespool.kafka._offsets import offsets_key
from icespool.lifecycle.service import Icespool

EVENTS = "replay.events"
DEAD = f"{EVENTS}_dead_letter"
SCHEMA = [
    {"name": "id", "type": "long", "required": True},
    {"name": "v", "type": "string"},
    {"name": "_kafka_offset", "type": "long"},
]


def _good(i: int) -> bytes:
    return json.dumps({"id": i, "v": f"v{i}"}).encode()


def _new_column(i: int) -> bytes:
    """Poison until the table gets column ``extra`` (evolve = "none" refuses it)."""
    return json.dumps({"id": i, "v": f"v{i}", "extra": f"x{i}"}).encode()


def _bad_id(i: int) -> bytes:
    """Poison for good: ``id`` is not a number."""
    return json.dumps({"id": f"not-a-number-{i}", "v": "v"}).encode()


def _config(make_config: MakeConfig, broker: Broker, topic: str) -> Config:
    return make_config(
        tables=[{"name": EVENTS, "create": True, "schema": SCHEMA}],
        defaults={"batch_timeout": "1s"},
        kafka=[
            {
                "bootstrap_servers": broker.bootstrap,
                "topics": [topic],
                "group_id": f"g-{topic}",
                "session_timeout": SESSION_TIMEOUT,
                "offset_commit_interval": "1s",
                "table": EVENTS,
                "metadata_columns": ["_kafka_offset"],
            }
        ],
    )


async def _replay(url: str, table: str, body: Any) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/v1/tables/{table}/replay", json=body) as resp,
    ):
        return resp.status, await resp.json()


def _add_column(service: Icespool, table: str) -> None:
    """The operator's fix: the column the dead letters carried (blocking)."""
    assert service._catalog is not None
    with service._catalog.load_table(table).update_schema() as update:
        update.add_column("extra", StringType())


async def test_replay_by_reason_and_offset_range_lands_each_record_once(
    make_config: MakeConfig, run_daemon: RunDaemon, broker: Broker
) -> None:
    topic = unique_name("replay-reason")
    await create_topic(broker.bootstrap, topic, 1)
    # Offsets 0..59: every 3rd record has a new column, every 10th a bad id, 59 is empty.
    values: list[bytes] = []
    for i in range(60):
        if i == 59:
            values.append(b"")
        elif i % 10 == 5:
            values.append(_bad_id(i))
        elif i % 3 == 0:
            values.append(_new_column(i))
        else:
            values.append(_good(i))
    await produce_values(broker.bootstrap, topic, values, partition_of=lambda i: 0)
    column = [i for i in range(59) if i % 10 != 5 and i % 3 == 0]
    bad = [i for i in range(59) if i % 10 == 5]
    good = [i for i in range(59) if i not in column and i not in bad]

    async with run_daemon(_config(make_config, broker, topic)) as (service, url):
        await wait_rows(service, EVENTS, len(good))
        dead = await wait_rows(service, DEAD, len(column) + len(bad) + 1)
        reasons = {d["offset"]: d["reason"] for d in dead}
        assert {reasons[i] for i in column} == {"invalid"}, reasons
        assert reasons[59] == "empty"
        assert all("extra" in d["error"] for d in dead if d["offset"] in column)

        # Before the fix: the records fail again, nothing moves.
        status, result = await _replay(url, DEAD, {"reason": "invalid"})
        assert status == 200, result
        assert (result["replayed"], result["removed"]) == (0, 0)
        assert result["still_failing"] == len(column) + len(bad)

        await asyncio.to_thread(_add_column, service, EVENTS)

        # An offset range first: only the records in it.
        status, result = await _replay(
            url, DEAD, {"reason": "invalid", "partition": 0, "from_offset": 0, "to_offset": 20}
        )
        assert status == 200, result
        first = [i for i in column if i <= 20]
        failing = [i for i in bad if i <= 20]
        assert result["replayed"] == len(first)
        assert result["removed"] == len(first)
        assert result["already_present"] == 0
        assert result["still_failing"] == len(failing)
        assert result["targets"] == {EVENTS: len(first)}
        assert sorted(f["offset"] for f in result["failures"]) == failing
        assert all(f["reason"] == "invalid" and "'id'" in f["error"] for f in result["failures"])

        # Then by reason: the rest of them.
        status, result = await _replay(url, DEAD, {"reason": "invalid"})
        assert status == 200, result
        assert result["replayed"] == len(column) - len(first)
        assert result["still_failing"] == len(bad)

        rows = await asyncio.to_thread(table_rows, service, EVENTS)
        ids = Counter(r["id"] for r in rows)
        assert sorted(ids) == sorted(good + column)
        assert set(ids.values()) == {1}  # every id exactly once
        by_id = {r["id"]: r for r in rows}
        assert all(by_id[i]["extra"] == f"x{i}" for i in column)
        assert all(by_id[i]["_kafka_offset"] == i for i in column)  # the original offset
        left = await asyncio.to_thread(table_rows, service, DEAD)
        assert sorted(d["offset"] for d in left) == sorted([*bad, 59])

        # A second replay changes nothing.
        status, again = await _replay(url, DEAD, {})
        assert status == 200, again
        assert (again["replayed"], again["already_present"], again["removed"]) == (0, 0, 0)
        assert again["still_failing"] == len(bad) + 1
        assert len(await asyncio.to_thread(table_rows, service, EVENTS)) == len(good + column)

        # The target holds the replayed offsets under the replay's own key.
        props = (await asyncio.to_thread(service._load_properties, EVENTS)).copy()
        key = offsets_key(replay_group(DEAD), topic, 0)
        assert key in props
        assert props[offsets_key(f"g-{topic}", topic, 0)] == "0-59"


# ---------------------------------------------------------------------- a real daemon

DLT = f"{TABLE}_dead_letter"


def _rows(home: DaemonDir, table: str) -> list[dict[str, Any]]:
    catalog = load_catalog(CATALOG_NAME, **home.catalog_properties)
    try:
        rows: list[dict[str, Any]] = catalog.load_table(table).scan().to_arrow().to_pylist()
        return rows
    finally:
        catalog.engine.dispose()  # type: ignore[attr-defined]


async def _wait_count(home: DaemonDir, daemon: Daemon, table: str, count: int) -> None:
    deadline = asyncio.get_running_loop().time() + 60
    rows: list[dict[str, Any]] = []
    while asyncio.get_running_loop().time() < deadline:
        try:
            rows = await asyncio.to_thread(_rows, home, table)
        except NoSuchTableError:  # created by the daemon at its start
            rows = []
        if len(rows) >= count:
            return
        await asyncio.sleep(0.3)
    raise AssertionError(f"{table}: {len(rows)} rows, expected {count}\n{daemon.tail()}")


def _evolve(home: DaemonDir) -> None:
    catalog = load_catalog(CATALOG_NAME, **home.catalog_properties)
    try:
        with catalog.load_table(TABLE).update_schema() as update:
            update.add_column("extra", StringType())
    finally:
        catalog.engine.dispose()  # type: ignore[attr-defined]


async def _cli_replay(home: DaemonDir, url: str, *filters: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        *daemon_command(),
        "dead-letters",
        "replay",
        "--config",
        str(home.config_path),
        "--url",
        url,
        *filters,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if not k.startswith("ICESPOOL")},
    )
    async with asyncio.timeout(120):
        out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


@pytest.mark.slow
@pytest.mark.parametrize("crash_at", ["before-dead-letter-removal", "before-replay-commit"])
async def test_kill_9_mid_replay_then_replay_again_lands_each_record_once(
    tmp_path: Path, broker: Broker, crash_at: str
) -> None:
    topic = unique_name(f"replay-crash-{crash_at}")
    await create_topic(broker.bootstrap, topic, 2)
    home = DaemonDir(tmp_path / "d")
    home.write_config(
        batch_timeout="1s",
        extra=f"""
[[kafka]]
bootstrap_servers = "{broker.bootstrap}"
topics = ["{topic}"]
group_id = "g-{topic}"
table = "{TABLE}"
offset_commit_interval = "1s"
session_timeout = "{SESSION_TIMEOUT}"
""",
    )
    # 400 records over two partitions; every 4th has a column the table lacks.
    values = [_new_column(i) if i % 4 == 0 else _good(i) for i in range(400)]
    await produce_values(broker.bootstrap, topic, values, partition_of=lambda i: i % 2)
    poison = [i for i in range(400) if i % 4 == 0]
    daemon = Daemon(home)
    seam = crash_seam_env(crash_at)
    try:
        daemon.start(env=seam)
        await daemon.wait_ready()
        await _wait_count(home, daemon, TABLE, 400 - len(poison))
        await _wait_count(home, daemon, DLT, len(poison))
        await asyncio.to_thread(_evolve, home)

        code, out, err = await _cli_replay(home, daemon.url, "--reason", "invalid")
        assert code == 1, (out, err)
        # The daemon died mid-request: the CLI says so in one line, no traceback.
        assert err.startswith("error: "), err
        assert "icespool daemon at " in err and "Traceback" not in err, err
        assert await daemon.wait_exit(30) == -9
        assert f"crash seam: SIGKILL at {crash_at}" in daemon.log()
        # The crash's state: nothing twice, every dead letter still there.
        ids = Counter(r["id"] for r in await asyncio.to_thread(_rows, home, TABLE))
        assert set(ids.values()) == {1}
        assert len(await asyncio.to_thread(_rows, home, DLT)) == len(poison)
        if crash_at == "before-dead-letter-removal":
            assert sorted(ids) == list(range(400))  # the targets had committed

        daemon.start()  # no seam
        await daemon.wait_ready()
        code, out, err = await _cli_replay(home, daemon.url, "--table", DLT)
        assert code == 0, (out, err, daemon.tail())
        result = json.loads(out)
        assert result["still_failing"] == 0, result
        assert result["removed"] == len(poison)
        assert result["replayed"] + result["already_present"] == len(poison)
        if crash_at == "before-dead-letter-removal":
            assert result["already_present"] == len(poison)
        rows = await asyncio.to_thread(_rows, home, TABLE)
        ids = Counter(r["id"] for r in rows)
        assert sorted(ids) == list(range(400)) and set(ids.values()) == {1}
        assert {r["id"]: r["extra"] for r in rows if r["id"] in poison} == {
            i: f"x{i}" for i in poison
        }
        assert await asyncio.to_thread(_rows, home, DLT) == []

        # Once more: nothing to do.
        code, out, err = await _cli_replay(home, daemon.url)
        assert code == 0, (out, err)
        assert json.loads(out)["scanned"] == 0
        assert len(await asyncio.to_thread(_rows, home, TABLE)) == 400
    finally:
        daemon.cleanup()


_BAD_REQUESTS = [
    (b"{not json", "the replay request is not JSON"),
    (b"[1]", "the replay request must be a JSON object of filters"),
    (b'{"offset": 3}', "unknown replay filter 'offset'; filters: reason, topic, partition"),
    (b'{"partition": -1}', "partition must be an integer >= 0, got -1"),
    (b'{"partition": "1"}', "partition must be an integer >= 0, got '1'"),
    (b'{"partition": true}', "partition must be an integer >= 0, got True"),
    (b'{"limit": 0}', "limit must be an integer >= 1, got 0"),
    (b'{"limit": 1000001}', "limit must be at most 1000000, got 1000001"),
    (b'{"reason": ""}', "reason must be a non-empty string, got ''"),
    (b'{"from_offset": 9, "to_offset": 3}', "from_offset 9 is after to_offset 3"),
    (b'{"since": "yesterday"}', "since 'yesterday' is not an ISO-8601 timestamp"),
    (b'{"since": "2024-02-01", "until": "2024-01-01"}', "is not before until"),
]


async def test_bad_replay_requests_get_400_naming_the_problem(
    daemon: tuple[Icespool, str],
) -> None:
    # The filters are checked before the table is: no Kafka source is needed.
    _, url = daemon
    async with aiohttp.ClientSession() as session:
        for body, message in _BAD_REQUESTS:
            async with session.post(f"{url}/v1/tables/{DEAD}/replay", data=body) as resp:
                error = (await resp.json())["error"]
                assert (resp.status, message in error) == (400, True), (body, error)
        # A valid request for a daemon without Kafka sources: no dead-letter tables.
        async with session.post(f"{url}/v1/tables/{DEAD}/replay", data=b"") as resp:
            assert resp.status == 404
            assert (await resp.json())["error"] == (
                f"table {DEAD!r} is not a dead-letter table of this daemon; "
                "dead-letter tables: (none)"
            )


async def test_replay_of_a_table_that_is_not_a_dead_letter_table_is_404(
    make_config: MakeConfig, run_daemon: RunDaemon, broker: Broker
) -> None:
    config = _config(make_config, broker, unique_name("replay-unused"))
    async with run_daemon(config, auth_token="s3cret") as (service, url):
        # Connected before it stops: a consumer stopped mid-connect leaks its socket.
        for _ in range(300):
            if service.not_ready_reason() is None:
                break
            await asyncio.sleep(0.1)
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{url}/v1/tables/{DEAD}/replay", json={}) as resp:
                assert resp.status == 401  # an admin operation: the token guards it
            auth = {"Authorization": "Bearer s3cret"}
            for table in (EVENTS, "nope.nothing"):
                async with session.post(
                    f"{url}/v1/tables/{table}/replay", json={}, headers=auth
                ) as resp:
                    assert resp.status == 404
                    assert (await resp.json())["error"] == (
                        f"table {table!r} is not a dead-letter table of this daemon; "
                        f"dead-letter tables: {DEAD}"
                    )


async def test_replay_by_time_and_limit_in_chunks_over_thousands_of_dead_letters(
    make_config: MakeConfig, run_daemon: RunDaemon, broker: Broker
) -> None:
    topic = unique_name("replay-many")
    await create_topic(broker.bootstrap, topic, 1)
    count = 2_500
    values = [_new_column(i) for i in range(count)]
    await produce_values(broker.bootstrap, topic, values, partition_of=lambda i: 0)
    async with run_daemon(_config(make_config, broker, topic)) as (service, url):
        await wait_rows(service, DEAD, count)
        await asyncio.to_thread(_add_column, service, EVENTS)
        # Dead-lettered before 2000-01-01: none of them.
        status, result = await _replay(url, DEAD, {"until": "2000-01-01T00:00:00Z"})
        assert status == 200, result
        assert result["scanned"] == 0
        # Since 2000, at most 1,200: two chunks (1,000 + 200).
        status, result = await _replay(url, DEAD, {"since": "2000-01-01", "limit": 1_200})
        assert status == 200, result
        assert (result["scanned"], result["replayed"], result["removed"]) == (1200, 1200, 1200)
        status, result = await _replay(url, DEAD, {"topic": topic})
        assert status == 200, result
        assert (result["replayed"], result["removed"]) == (count - 1200, count - 1200)
        rows = await asyncio.to_thread(table_rows, service, EVENTS)
        assert sorted(r["id"] for r in rows) == list(range(count))
        assert await asyncio.to_thread(table_rows, service, DEAD) == []


def test_a_consumer_group_cannot_take_the_replay_prefix(make_config: MakeConfig) -> None:
    with pytest.raises(ConfigError) as caught:
        make_config(
            tables=[{"name": EVENTS, "create": True, "schema": SCHEMA}],
            kafka=[
                {
                    "bootstrap_servers": "127.0.0.1:9",
                    "topics": ["t"],
                    "group_id": f"dead-letter-replay/{DEAD}",
                    "table": EVENTS,
                }
            ],
        )
    assert caught.value.key == "kafka[0].group_id"
    assert "starts with 'dead-letter-replay/', which dead-letter replay uses" in str(caught.value)
