"""Spark's maintenance beside the daemon ingesting keyed changes into an upsert table and
compacting it with its own scheduled maintenance.

A real `Icespool` service owns an upsert table (key (region, id), identity partitions on
region): a feeder appends change batches (upserts and deletes by key, at random) and
flushes, each flush one snapshot of data files plus equality deletes. Maintenance runs
every second; its compaction is held at its first read by a gate the test holds (the
scheduler's I/O budget), so Spark certainly wins the race:

1. the daemon's compaction planned and waits in its rewrite; Spark's merge-on-read
   ``DELETE`` (position deletes), ``rewrite_data_files`` with ``delete-file-threshold = 1``
   and ``rewrite_position_delete_files`` run while changes keep committing;
2. the gate opens: the daemon's run reports ``conflict`` (its inputs were rewritten), and
   a later run compacts what Spark left and commits;
3. changes stop: Spark's view equals the state the test computed itself, key by key (no
   change lost, none applied twice, no key live twice), and so does the daemon's merged
   read; on the quiet table maintenance leaves no delete file.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from typing import Any

from support.cdc_tables import feed_change_set
from support.spark_helpers import land

from icespool.cdc import DELETE, UPSERT, read_merged
from icespool.iceberg._catalog import load_catalog
from icespool.lifecycle.service import Icespool
from icespool.maintenance import IoBudget

TABLE = "m.upserts"
SCHEMA = [
    {"name": "region", "type": "string", "required": True},
    {"name": "id", "type": "long", "required": True},
    {"name": "payload", "type": "string"},
    {"name": "version", "type": "long"},
]
KEY = ["region", "id"]
REGIONS = ("eu", "us")
KEYS = 400

State = dict[tuple[Any, ...], dict[str, Any]]


class _GatedBudget(IoBudget):
    """The scheduler's I/O budget with a gate: a compaction's rewrite waits at its first
    read while the gate is shut (``entered`` says one got there)."""

    def __init__(self) -> None:
        super().__init__(None)
        self.open = threading.Event()
        self.entered = threading.Event()

    def acquire(self, nbytes: int, *, deadline: float | None = None) -> float:
        if not self.open.is_set():
            self.entered.set()
            self.open.wait()
        return super().acquire(nbytes, deadline=deadline)

    def close(self) -> None:
        self.open.set()
        super().close()


class _Feeder:
    """Random change batches over ``KEYS`` keys per region, a flush each; ``state``
    follows every flushed batch (the last change per key wins)."""

    def __init__(self, service: Icespool) -> None:
        self.writer = service.writer(TABLE)
        self.rng = random.Random(16)
        self.state: State = {}
        self.commits = 0
        self.running = asyncio.Event()
        self.running.set()
        self.idle = asyncio.Event()

    async def once(self) -> None:
        universe = [(r, i) for r in REGIONS for i in range(KEYS)]
        touched = self.rng.sample(universe, 40)
        ops = [DELETE if self.rng.random() < 0.3 else UPSERT for _ in touched]
        await feed_change_set(self.writer, touched, ops, self.commits + 1, self.state)
        self.commits += 1

    async def run(self, done: asyncio.Event) -> None:
        while not done.is_set():
            if not self.running.is_set():
                self.idle.set()
                await self.running.wait()
                self.idle.clear()
            await self.once()
            # A commit a second (the default flush interval is a minute): Spark's commit
            # retries must get a chance to land between the daemon's commits.
            await asyncio.sleep(1.0)


def _spark_state(spark: Any, name: str) -> State:
    rows = spark.sql(f"SELECT region, id, payload, version FROM {name}").collect()
    state: State = {}
    for row in rows:
        key = (row.region, row.id)
        assert key not in state, f"key {key} is live twice in Spark's view"
        state[key] = row.asDict()
    return state


def _runs(service: Icespool, outcome: str) -> float:
    value = service.metrics.registry.get_sample_value(
        "icespool_maintenance_runs_total", {"table": TABLE, "task": "compact", "outcome": outcome}
    )
    return value or 0.0


async def _eventually(check: Any, what: Any, within: float) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, what()
        await asyncio.sleep(0.1)


async def test_spark_rewrites_beside_changes_and_the_daemons_compaction(
    make_config: Any, run_daemon: Any, spark: Any, register: Any, catalog_name: str
) -> None:
    config = make_config(
        catalog={"name": catalog_name},
        tables=[
            {
                "name": TABLE,
                "create": True,
                "schema": SCHEMA,
                "key": KEY,
                "partition_by": ["region"],
                # Spark's commits retry on the daemon's (4 retries run out beside
                # commits every fraction of a second).
                "properties": {
                    "write.delete.mode": "merge-on-read",
                    "commit.retry.num-retries": "30",
                },
            }
        ],
        maintenance={"interval": "1s", "lease_ttl": "120s", "compaction_min_files": 2},
    )
    catalog = register(config)
    name = f"{catalog}.{TABLE}"
    procedures = f"{catalog}.system"

    async with run_daemon(config) as (service, _):
        gate = _GatedBudget()
        service.maintenance.budget = gate
        feeder = _Feeder(service)
        done = asyncio.Event()
        feeding = asyncio.create_task(feeder.run(done))
        try:
            # 1. The daemon's compaction waits in its rewrite; Spark goes first.
            await _eventually(gate.entered.is_set, lambda: "no compaction started", 60)
            feeder.running.clear()
            await feeder.idle.wait()
            await asyncio.to_thread(spark.sql, f"DELETE FROM {name} WHERE id % 37 = 0")
            for key in [k for k in feeder.state if k[1] % 37 == 0]:
                feeder.state.pop(key)
            feeder.running.set()
            before_spark = feeder.commits
            # The daemon's upserts delete by position: a rewrite whose inputs gained
            # position deletes meanwhile is refused by Spark's validation, and retried.
            # Spark goes again until the feeder committed beside it at least once (a
            # quick rewrite on a loaded machine can fall between two daemon commits).
            deadline = time.monotonic() + 120
            while True:
                await asyncio.to_thread(
                    land,
                    spark,
                    f"CALL {procedures}.rewrite_data_files(table => '{TABLE}', "
                    "options => map('delete-file-threshold', '1', 'min-input-files', '2'))",
                )
                await asyncio.to_thread(
                    land,
                    spark,
                    f"CALL {procedures}.rewrite_position_delete_files(table => '{TABLE}')",
                )
                if feeder.commits > before_spark or time.monotonic() > deadline:
                    break
            during_spark = feeder.commits - before_spark
            # 2. The daemon's run gives up; a later one compacts what Spark left.
            gate.open.set()
            await _eventually(
                lambda: _runs(service, "conflict") >= 1,
                lambda: service.maintenance.status(TABLE),
                60,
            )
            committed = _runs(service, "ok")
            await _eventually(
                lambda: (
                    _runs(service, "ok") > committed
                    and "replaced" in str(service.maintenance.status(TABLE))
                ),
                lambda: service.maintenance.status(TABLE),
                60,
            )
        finally:
            done.set()
            await feeding
        assert during_spark >= 1  # changes kept committing while Spark rewrote
        assert _runs(service, "failed") == 0, service.maintenance.status(TABLE)

        # 3. Spark's view, the daemon's merged read and the test's state agree.
        await asyncio.to_thread(spark.sql, f"REFRESH TABLE {name}")
        assert await asyncio.to_thread(_spark_state, spark, name) == feeder.state
        table = load_catalog(config.catalog.name, config.catalog.properties()).load_table(TABLE)
        merged = read_merged(table).to_pylist()
        assert {(r["region"], r["id"]): r for r in merged} == feeder.state
        assert len(merged) == len(feeder.state)

        # The quiet table: maintenance leaves no delete file, and a few data files.
        def deletes() -> int:
            return int(spark.sql(f"SELECT count(*) AS n FROM {name}.delete_files").first().n)

        deadline = time.monotonic() + 60
        while await asyncio.to_thread(deletes):
            assert time.monotonic() < deadline, service.maintenance.status(TABLE)
            await asyncio.sleep(1)
            await asyncio.to_thread(spark.sql, f"REFRESH TABLE {name}")
        assert await asyncio.to_thread(_spark_state, spark, name) == feeder.state
