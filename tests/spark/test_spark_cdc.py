"""Issue 16's acceptance: a Debezium-shaped change stream through a real broker (Apache Kafka)
into real ``icespool run`` processes with an upsert table and ``changes = "debezium"``,
and Spark's view of the table equals the final state computed independently from the
produced bytes (`support.cdc_stream.final_state`), key by key:

1. 100,000 changes over 10,000 keys (inserts, snapshot reads, updates, deletes,
   tombstones after deletes, re-inserts), with kill -9 rounds of the daemon mid-stream.
2. Replicas and rebalances: three daemons in one consumer group on one PostgreSQL catalog;
   one joins mid-stream, one is killed -9 mid-stream (its partitions move; it comes back
   and recovers its spool, which the offset claims keep from applying twice).
3. Spark's compaction (``rewrite_data_files`` with delete-file-threshold 1, and
   ``rewrite_position_delete_files``) running again and again while the daemon ingests.

The merged state is also read without Spark (`merged_rows`: data files minus equality
and position deletes by sequence number) so a difference says which reader disagrees.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pyiceberg.catalog import load_catalog
from support.cdc_stream import (
    COLUMNS,
    Message,
    compare,
    debezium_stream,
    final_state,
    merged_rows,
    produce_messages,
    upsert_table_toml,
)
from support.daemon_harness import Daemon, DaemonDir
from support.kafka_harness import SESSION_TIMEOUT, Broker, create_topic, unique_name

from icespool.config import Config, load_config
from icespool.kafka._offsets import offsets_key

TABLE = "cdc.items"
PARTITIONS = 4
SLICES = 3  # slices of the compaction test's second half, each after a Spark rewrite
_SELECT = f"SELECT {', '.join(COLUMNS)} FROM {{}}"


def _group(topic: str) -> str:
    return f"cdc-{topic}"


def _config_text(home: DaemonDir, catalog_name: str, broker: Broker, topic: str) -> str:
    catalog = "\n".join(
        f"{json.dumps(k)} = {json.dumps(v)}" for k, v in home.catalog_properties.items()
    )
    return f"""\
[catalog]
name = "{catalog_name}"
{catalog}

[spool]
dir = {json.dumps(str(home.spool_dir))}

[http]
listen = "127.0.0.1:0"

[defaults]
batch_timeout = "1s"

[encode]
workers = 1

[log]
level = "info"
format = "text"

[[kafka]]
bootstrap_servers = "{broker.bootstrap}"
group_id = "{_group(topic)}"
topics = ["{topic}"]
table = "{TABLE}"
format = "json"
changes = "debezium"
session_timeout = "{SESSION_TIMEOUT}"
offset_commit_interval = "1s"
{upsert_table_toml(TABLE)}"""


def _daemon(home: DaemonDir, catalog_name: str, broker: Broker, topic: str) -> Daemon:
    home.root.mkdir(parents=True, exist_ok=True)
    home.warehouse.mkdir(parents=True, exist_ok=True)
    home.config_path.write_text(_config_text(home, catalog_name, broker, topic))
    return Daemon(home)


async def _wait_committed(
    config: Config,
    topic: str,
    messages: Sequence[Message],
    daemons: Sequence[Daemon],
    within: float,
) -> None:
    """Until the table's offset properties cover every produced message (read through
    pyiceberg, so Spark's catalog connection stays out of it)."""
    counts = Counter(m.partition for m in messages)
    wanted = {offsets_key(_group(topic), topic, p): f"0-{n - 1}" for p, n in counts.items()}
    catalog = load_catalog(config.catalog.name, **config.catalog.properties())
    seen: dict[str, str | None] = {}
    try:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            try:
                table = await asyncio.to_thread(catalog.load_table, TABLE)
                seen = {k: table.metadata.properties.get(k) for k in wanted}
            except Exception as exc:  # the table may not exist yet
                seen = {"error": repr(exc)}
            if seen == wanted:
                return
            await asyncio.sleep(0.5)
    finally:
        catalog.engine.dispose()  # type: ignore[attr-defined]
    tails = "\n".join(d.tail(15) for d in daemons)
    raise AssertionError(f"after {within:.0f} s the table holds {seen}, not {wanted}\n{tails}")


def _merged(config: Config) -> list[tuple[Any, ...]]:
    catalog = load_catalog(config.catalog.name, **config.catalog.properties())
    try:
        return merged_rows(catalog.load_table(TABLE))
    finally:
        catalog.engine.dispose()  # type: ignore[attr-defined]


def _check(spark: Any, name: str, config: Config, expected: dict[int, tuple[Any, ...]]) -> None:
    spark_rows = [tuple(r) for r in spark.sql(_SELECT.format(f"{name}.{TABLE}")).collect()]
    compare(spark_rows, expected)
    compare(_merged(config), expected)
    files = spark.sql(f"SELECT content, count(*) FROM {name}.{TABLE}.files GROUP BY content")
    print("live files by content (0 data, 1 position, 2 equality deletes):", files.collect())
    _no_dead_letters(config)


def _no_dead_letters(config: Config) -> None:
    """Every change of the stream applies: the dead-letter table is absent or empty."""
    catalog = load_catalog(config.catalog.name, **config.catalog.properties())
    try:
        if catalog.table_exists(f"{TABLE}_dead_letter"):
            dead = catalog.load_table(f"{TABLE}_dead_letter").scan().to_arrow()
            assert dead.num_rows == 0, dead.slice(0, 3).to_pylist()
    finally:
        catalog.engine.dispose()  # type: ignore[attr-defined]


class _Clock:
    """Phase timings, printed with the test's output (what the time budget goes to)."""

    def __init__(self) -> None:
        self.began = self.last = time.monotonic()
        self.laps: list[str] = []

    def lap(self, what: str) -> None:
        now = time.monotonic()
        self.laps.append(f"{what} {now - self.last:.1f}s")
        self.last = now

    def __str__(self) -> str:
        return f"{time.monotonic() - self.began:.1f}s: " + ", ".join(self.laps)


async def _start(daemon: Daemon) -> None:
    daemon.start()
    await daemon.wait_ready()


async def test_debezium_stream_with_kill_9_rounds_equals_the_final_state_in_spark(
    broker: Broker, spark: Any, register: Any, catalog_name: str, tmp_path: Path
) -> None:
    topic = unique_name("cdc-kill")
    clock = _Clock()
    messages = debezium_stream(100_000, 10_000, partitions=PARTITIONS, seed=1)
    expected = final_state(messages)
    clock.lap("stream")
    await create_topic(broker.bootstrap, topic, PARTITIONS)
    daemon = _daemon(DaemonDir(tmp_path / "d"), catalog_name, broker, topic)
    config = load_config(daemon.home.config_path)
    rng = random.Random(7)
    rounds = 4
    chunk = -(-len(messages) // rounds)
    try:
        await _start(daemon)
        clock.lap("start")
        for i in range(rounds):
            await produce_messages(broker.bootstrap, topic, messages[i * chunk : (i + 1) * chunk])
            clock.lap(f"produce {i}")
            if i == rounds - 1:
                break
            # kill -9 at a random moment while this chunk is consumed, spooled, committed.
            await asyncio.sleep(rng.uniform(0.5, 2.5))
            assert daemon.kill() == -9
            await _start(daemon)
            clock.lap(f"kill+start {i}")
        await _wait_committed(config, topic, messages, [daemon], 120)
        clock.lap("committed")
        assert daemon.starts == rounds
    finally:
        daemon.kill()
        daemon.cleanup()
    name = register(config)
    _check(spark, name, config, expected)
    clock.lap("checked")
    print(clock)


async def test_replicas_joining_and_killed_mid_stream_equal_the_final_state(
    broker: Broker,
    spark: Any,
    register: Any,
    catalog_name: str,
    postgres_uri: str,
    tmp_path: Path,
) -> None:
    topic = unique_name("cdc-replicas")
    clock = _Clock()
    messages = debezium_stream(40_000, 4_000, partitions=PARTITIONS, seed=2)
    expected = final_state(messages)
    await create_topic(broker.bootstrap, topic, PARTITIONS)
    warehouse = tmp_path / "warehouse"
    daemons = [
        _daemon(
            DaemonDir(tmp_path / f"r{i}", catalog_uri=postgres_uri, shared_warehouse=warehouse),
            catalog_name,
            broker,
            topic,
        )
        for i in range(3)
    ]
    config = load_config(daemons[0].home.config_path)
    chunk = len(messages) // 4
    parts = [messages[i * chunk : (i + 1) * chunk] for i in range(3)] + [messages[3 * chunk :]]
    a, b, c = daemons
    try:
        await asyncio.gather(_start(a), _start(b))
        await produce_messages(broker.bootstrap, topic, parts[0])
        await asyncio.sleep(1.0)
        # c joins mid-stream: a rebalance moves partitions while a and b hold spooled changes.
        producing = asyncio.ensure_future(produce_messages(broker.bootstrap, topic, parts[1]))
        await _start(c)
        await producing
        await asyncio.sleep(1.5)
        # b dies mid-stream with changes in its spool: its partitions move to a and c after
        # its session times out; they re-read from the table's offsets.
        producing = asyncio.ensure_future(produce_messages(broker.bootstrap, topic, parts[2]))
        await asyncio.sleep(0.5)
        assert b.kill() == -9
        await producing
        await asyncio.sleep(2.0)
        # b comes back: it recovers its spool (the claims keep anything another replica
        # committed since from applying twice) and rejoins the group.
        await _start(b)
        clock.lap("phases")
        await produce_messages(broker.bootstrap, topic, parts[3])
        await _wait_committed(config, topic, messages, daemons, 120)
        clock.lap("committed")
    finally:
        for daemon in daemons:
            daemon.kill()
            daemon.cleanup()
    name = register(config)
    _check(spark, name, config, expected)
    clock.lap("checked")
    print(clock)


async def test_spark_compaction_alongside_ingest_keeps_the_final_state(
    broker: Broker,
    spark: Any,
    register: Any,
    catalog_name: str,
    postgres_uri: str,
    tmp_path: Path,
) -> None:
    topic = unique_name("cdc-compact")
    clock = _Clock()
    messages = debezium_stream(40_000, 4_000, partitions=PARTITIONS, seed=3)
    expected = final_state(messages)
    await create_topic(broker.bootstrap, topic, PARTITIONS)
    daemon = _daemon(
        DaemonDir(tmp_path / "d", catalog_uri=postgres_uri), catalog_name, broker, topic
    )
    config = load_config(daemon.home.config_path)
    name = register(config)
    stop = threading.Event()
    done: Counter[str] = Counter()
    lost: list[str] = []

    def compact() -> None:
        # Spark's maintenance job, again and again while the daemon commits changes: a
        # rewrite that loses a race with a daemon commit fails and is tried again.
        procedures = [
            f"CALL {name}.system.rewrite_data_files(table => '{TABLE}', options => "
            "map('rewrite-all', 'true'))",
            f"CALL {name}.system.rewrite_position_delete_files(table => '{TABLE}', "
            "options => map('rewrite-all', 'true'))",
        ]
        while not stop.is_set():
            for sql in procedures:
                try:
                    spark.sql(sql).collect()
                    done[sql.split("(")[0].rsplit(".", 1)[1]] += 1
                except Exception as exc:
                    lost.append(str(exc).splitlines()[0][:200])
            stop.wait(0.5)

    spark_thread = threading.Thread(target=compact, daemon=True)
    try:
        await _start(daemon)
        half = len(messages) // 2
        await produce_messages(broker.bootstrap, topic, messages[:half])
        await _wait_committed(config, topic, messages[:half], [daemon], 90)
        spark_thread.start()
        # The second half in slices, each produced once Spark finished another rewrite
        # since the last one: Spark's rewrites and the daemon's change commits interleave
        # (whichever is faster), and the daemon commits on top of rewritten files.
        step = -(-(len(messages) - half) // SLICES)
        for start in range(half, len(messages), step):
            rewrites = done["rewrite_data_files"]
            await produce_messages(broker.bootstrap, topic, messages[start : start + step])
            await _wait_committed(config, topic, messages[: start + step], [daemon], 90)
            deadline = time.monotonic() + 90
            while done["rewrite_data_files"] == rewrites and spark_thread.is_alive():
                assert time.monotonic() < deadline, f"no Spark rewrite in 90 s: {lost[-3:]}"
                await asyncio.sleep(0.2)
    finally:
        stop.set()
        await asyncio.to_thread(spark_thread.join, 120)
        daemon.kill()
        daemon.cleanup()
    clock.lap("ingested")
    print(f"Spark compaction runs {dict(done)}, lost races {len(lost)}: {lost[:3]}")
    assert done["rewrite_data_files"] >= 1, lost
    # Alongside, not after: the daemon committed changes on top of a Spark rewrite.
    operations = [
        r.operation
        for r in spark.sql(
            f"SELECT operation FROM {name}.{TABLE}.snapshots ORDER BY committed_at"
        ).collect()
    ]
    first_rewrite = operations.index("replace")
    assert set(operations[first_rewrite:]) - {"replace"}, operations
    _check(spark, name, config, expected)
    clock.lap("checked")
    print(clock)
