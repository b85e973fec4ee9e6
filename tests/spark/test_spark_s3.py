"""Spark on S3: a real ``icespool run`` writes through an Iceberg REST catalog to SeaweedFS
(tests/support/object_store.py), and the shared SparkSession reads the same tables through
Iceberg's S3FileIO and AWS bundle, with exactly the catalog settings ``icespool spark-conf``
prints (registered on the running session under a name of the test's own).

1. Exactly once: kill -9 rounds during concurrent HTTP ingest; Spark sees every acked id
   once, and of the requests the kills cut each is wholly in the table or wholly out.
2. An upsert table: keyed upserts and deletes over several commits; Spark's rows equal the
   state computed from the changes sent.
3. Structured Streaming: ``readStream`` of the table with ``trigger(availableNow=True)``
   into a Parquet file sink, run again after more commits; every row lands once.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import signal
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from support.daemon_harness import NDJSON, TABLE, Daemon, DaemonDir, ndjson
from support.object_store import SeaweedFS
from support.spark_helpers import rows, unique_catalog_name

from icespool.config import load_config
from icespool.spark.conf import S3_COMPATIBLE_JAVA_OPTIONS, spark_settings
from icespool.spark.session import register_catalog

_TIMEOUT = aiohttp.ClientTimeout(total=30)
# A REST catalog cannot hold the maintenance lease: one daemon maintains without it.
_MAINTENANCE = '[maintenance]\nlease = "none"\n'
UPSERT_TABLE = "t.users"
_UPSERT_TABLE_TOML = f"""
[[tables]]
name = "{UPSERT_TABLE}"
create = true
key = ["id"]
schema = [
  {{ name = "id", type = "long", required = true }},
  {{ name = "name", type = "string" }},
  {{ name = "score", type = "long" }},
]
"""

MakeDaemon = Callable[..., tuple[DaemonDir, Daemon]]


@pytest.fixture
def make_daemon(tmp_path: Path, object_store: SeaweedFS) -> Iterator[MakeDaemon]:
    """Daemons on a REST catalog + S3 warehouse of their own (SeaweedFS); every child is
    SIGKILLed and reaped at teardown."""
    made: list[Daemon] = []

    def make(extra: str = "", **config: Any) -> tuple[DaemonDir, Daemon]:
        catalog = object_store.catalog_properties(object_store.warehouse())
        home = DaemonDir(tmp_path / f"d{len(made)}", catalog=catalog)
        home.write_config(extra=_MAINTENANCE + extra, **config)
        daemon = Daemon(home)
        made.append(daemon)
        return home, daemon

    yield make
    for daemon in made:
        daemon.cleanup()


def _spark_catalog(spark: Any, home: DaemonDir) -> str:
    """Register the daemon's catalog on the session as `icespool spark-conf` maps it."""
    config = load_config(home.config_path)
    settings = spark_settings(config)
    # What spark-conf prints for SeaweedFS (a custom endpoint): the session runs with it.
    assert settings.conf["spark.driver.defaultJavaOptions"] == S3_COMPATIBLE_JAVA_OPTIONS
    system = spark._jvm.java.lang.System
    assert [
        system.getProperty(f"aws.{key}")
        for key in ("requestChecksumCalculation", "responseChecksumValidation")
    ] == ["when_required", "when_required"]
    name = register_catalog(spark, config, catalog_name=unique_catalog_name())
    prefix = f"spark.sql.catalog.{name}"
    assert spark.conf.get(f"{prefix}.io-impl") == "org.apache.iceberg.aws.s3.S3FileIO"
    assert spark.conf.get(f"{prefix}.s3.path-style-access") == "true"
    return name


def _records(ids: list[int]) -> list[dict[str, Any]]:
    return [{"id": i, "v": f"v{i}"} for i in ids]


async def _stop(daemon: Daemon, session: aiohttp.ClientSession) -> None:
    await daemon.flush(session)
    daemon.signal(signal.SIGTERM)
    assert await daemon.wait_exit(35) == 0, daemon.tail()


async def test_spark_reads_every_acked_id_once_after_kill_9_rounds(
    make_daemon: MakeDaemon, spark: Any
) -> None:
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    home, daemon = make_daemon(batch_timeout="200ms")
    next_id = itertools.count(1)
    acked: set[int] = set()
    cut: list[list[int]] = []  # requests a kill interrupted: unacked, maybe committed
    unexpected: list[str] = []

    async def client(session: aiohttp.ClientSession, killed: asyncio.Event) -> None:
        while not killed.is_set():
            ids = [next(next_id) for _ in range(rng.randint(1, 300))]
            try:
                async with session.post(
                    daemon.records_url(),
                    data=ndjson(_records(ids)),
                    headers={"Content-Type": NDJSON},
                ) as resp:
                    status, text = resp.status, await resp.text()
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                cut.append(ids)
                if not killed.is_set():
                    unexpected.append(f"{exc!r} before the kill")
                return
            if status == 200 and json.loads(text).get("accepted") == len(ids):
                acked.update(ids)
            else:
                unexpected.append(f"answered {status} {text!r}")
                return

    for _ in range(3):
        daemon.start()
        await daemon.wait_ready()
        killed = asyncio.Event()
        async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
            clients = [asyncio.create_task(client(session, killed)) for _ in range(3)]
            # Commits every ~200 ms to S3: a kill after 0.4-1.2 s often cuts one.
            await asyncio.sleep(rng.uniform(0.4, 1.2))
            killed.set()
            assert daemon.kill() == -signal.SIGKILL, daemon.tail()
            await asyncio.gather(*clients)
        assert not unexpected, f"seed={seed}: {unexpected[:3]}\n{daemon.tail()}"
    daemon.start()
    await daemon.wait_ready()
    async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
        await _stop(daemon, session)

    name = _spark_catalog(spark, home)
    table = f"{name}.{TABLE}"
    [(count, distinct)] = rows(spark.sql(f"SELECT count(*), count(DISTINCT id) FROM {table}"))
    spark_ids = Counter(r[0] for r in rows(spark.sql(f"SELECT id FROM {table}")))
    wrong_v = rows(spark.sql(f"SELECT id, v FROM {table} WHERE v <> concat('v', id)"))
    where = f"seed={seed}, {len(acked)} acked, {len(cut)} requests cut"
    assert len(acked) > 1_000, f"too little was acked for the test to mean anything ({where})"
    assert count == distinct == len(spark_ids), f"ids read more than once ({where})"
    assert acked <= spark_ids.keys(), f"{len(acked - spark_ids.keys())} acked ids missing ({where})"
    # Ingest is all-or-nothing per request: a cut request is wholly committed or absent.
    partial = [ids for ids in cut if 0 < len(spark_ids.keys() & set(ids)) < len(ids)]
    assert partial == [], f"requests committed in part ({where})"
    landed = {i for ids in cut if set(ids) <= spark_ids.keys() for i in ids}
    assert spark_ids.keys() == acked | landed, f"ids never sent in the table ({where})"
    assert wrong_v == []
    # pyiceberg, reading the same S3 files through pyarrow, agrees row for row.
    py_rows, _ = home.read_rows()
    assert Counter(r["id"] for r in py_rows) == spark_ids
    print(f"kill-9 on S3, Spark read: {where}, {len(landed)} cut ids landed")


async def test_spark_reads_an_upsert_tables_merged_state_from_s3(
    make_daemon: MakeDaemon, spark: Any
) -> None:
    home, daemon = make_daemon(extra=_UPSERT_TABLE_TOML)
    rng = random.Random(7)
    state: dict[int, tuple[str, int]] = {}
    daemon.start()
    await daemon.wait_ready()
    url = f"{daemon.url}/v1/tables/{UPSERT_TABLE}"
    async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
        for commit in range(5):  # each flush commits data files plus equality deletes
            changes: list[dict[str, Any]] = []
            for _ in range(200):
                key = rng.randrange(150)
                if rng.random() < 0.25:
                    changes.append({"id": key, "_op": "delete"})
                    state.pop(key, None)
                else:
                    row = (f"c{commit}-{rng.randrange(10**6)}", rng.randrange(1000))
                    changes.append({"id": key, "name": row[0], "score": row[1], "_op": "upsert"})
                    state[key] = row
            async with session.post(
                f"{url}/changes", data=ndjson(changes), headers={"Content-Type": NDJSON}
            ) as resp:
                body = await resp.text()
                assert (resp.status, json.loads(body).get("accepted")) == (200, 200), body
            async with session.post(f"{url}/flush") as resp:
                assert resp.status == 200, await resp.text()
        daemon.signal(signal.SIGTERM)
        assert await daemon.wait_exit(35) == 0, daemon.tail()

    name = _spark_catalog(spark, home)
    got = rows(spark.sql(f"SELECT id, name, score FROM {name}.{UPSERT_TABLE} ORDER BY id"))
    assert got == [(k, *state[k]) for k in sorted(state)]
    # A table this small keeps its rows in tails the commits rewrite (no delete file
    # lives long): every commit after the first replaced rows.
    replaced = rows(
        spark.sql(
            f"SELECT count(*) FROM {name}.{UPSERT_TABLE}.snapshots WHERE operation != 'append'"
        )
    )
    assert replaced[0][0] >= 1, "no commit replaced a row: the test read no merged state"


async def test_structured_streaming_reads_every_row_once_from_s3(
    make_daemon: MakeDaemon, spark: Any, tmp_path: Path
) -> None:
    home, daemon = make_daemon()
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
    name: str | None = None
    sent: list[int] = []

    def stream_once() -> None:
        assert name is not None
        query = (
            spark.readStream.format("iceberg")
            .load(f"{name}.{TABLE}")
            .writeStream.format("parquet")
            .option("path", str(sink))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert not query.isActive, "the availableNow query did not finish within 120 s"
        assert query.exception() is None, query.exception()

    daemon.start()
    await daemon.wait_ready()
    async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
        for run in range(2):
            for _ in range(3):  # three commits per run: the stream reads several snapshots
                ids = list(range(len(sent) + 1, len(sent) + 501))
                await daemon.ingest(session, _records(ids))
                await daemon.flush(session)
                sent += ids
            if name is None:
                name = _spark_catalog(spark, home)
            # On this thread: Iceberg's streaming source resolves SparkSession.active(),
            # which a py4j call from another Python thread (another JVM thread) lacks
            # (it then fails on an undefined catalog 'default_iceberg').
            stream_once()
            got = Counter(r[0] for r in rows(spark.read.parquet(str(sink)).select("id")))
            assert got == Counter(sent), (
                f"run {run}: {sum(got.values())} rows in the sink for {len(sent)} sent, "
                f"{sorted(i for i, c in got.items() if c > 1)[:10]} twice, "
                f"{sorted(set(sent) - got.keys())[:10]} missing"
            )
        await _stop(daemon, session)
    snapshots = rows(spark.sql(f"SELECT operation FROM {name}.{TABLE}.snapshots"))
    assert [op for (op,) in snapshots].count("append") == 6
