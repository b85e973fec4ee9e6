"""The daemon's maintenance beside Spark on one table while the daemon ingests.

1. Spark's ``rewrite_data_files`` and ``expire_snapshots`` run while the daemon commits,
   compacts and expires the same table (shared PostgreSQL catalog): once while the
   daemon's compaction of the same files waits in its rewrite (Spark wins for sure), then
   freely. Every acked id once through Spark and pyiceberg, every daemon flush committed,
   and where Spark won the daemon's task says ``conflict`` and maintenance goes on (no
   failed task).
2. A Spark Structured Streaming query (file sink, checkpoint) reads every acked id exactly
   once while the daemon ingests, compacts (``replace`` snapshots, which the stream skips)
   and expires, across a stop and a restart from its checkpoint. Then the trade-off: with a
   retention of one snapshot, a stream stopped while the table moves on cannot resume (its
   snapshot was expired), which is why the defaults keep hours of snapshots.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyiceberg.catalog import load_catalog

from icespool.lifecycle.service import Icespool
from icespool.maintenance import IoBudget

TABLE = "m.events"
SCHEMA = [{"name": "id", "type": "long", "required": True}, {"name": "v", "type": "string"}]
ROWS = 20


def _batch(ids: list[int]) -> pa.RecordBatch:
    return pa.record_batch(
        {"id": pa.array(ids, pa.int64()), "v": pa.array([f"r{i}" for i in ids], pa.string())}
    )


class _Feeder:
    """Appends ``ROWS`` ids and flushes, again and again: the ids acked and committed."""

    def __init__(self, service: Icespool) -> None:
        self.service = service
        self.counter = itertools.count()
        self.acked: list[int] = []
        self.snapshots: list[int] = []

    async def once(self) -> None:
        ids = [next(self.counter) for _ in range(ROWS)]
        await self.service.writer(TABLE).append(_batch(ids))
        self.acked += ids
        result = await self.service.flush(TABLE)
        assert result.records == ROWS and result.snapshot_id is not None, result
        self.snapshots.append(result.snapshot_id)

    async def run_until(self, done: threading.Event | asyncio.Event, pause: float) -> None:
        while not done.is_set():
            await self.once()
            await asyncio.sleep(pause)


async def _eventually(check: Callable[[], Any], what: Callable[[], object], within: float) -> None:
    """Wait until ``check()`` (a value or an awaitable) is true; fail with ``what()``."""
    deadline = time.monotonic() + within
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return
        assert time.monotonic() < deadline, what()
        await asyncio.sleep(0.05)


def _runs(service: Icespool, task: str, outcome: str) -> float:
    value = service.metrics.registry.get_sample_value(
        "icespool_maintenance_runs_total", {"table": TABLE, "task": task, "outcome": outcome}
    )
    return value or 0.0


def _removed(service: Icespool, kind: str) -> float:
    return _metric(
        service, "icespool_maintenance_files_removed_total", {"table": TABLE, "kind": kind}
    )


def _metric(service: Icespool, name: str, labels: dict[str, str]) -> float:
    return service.metrics.registry.get_sample_value(name, labels) or 0.0


def _pyiceberg_ids(config: Any) -> Counter[int]:
    catalog = load_catalog(config.catalog.name, **config.catalog.properties())
    try:
        return Counter(catalog.load_table(TABLE).scan().to_arrow().column("id").to_pylist())
    finally:
        catalog.engine.dispose()  # type: ignore[attr-defined]


# Spark's side of a race it lost: its commit validation, or a file the daemon's expiry
# removed (after the daemon's compaction replaced it) before Spark's rewrite read it.
_SPARK_LOST = (
    "ValidationException",
    "CommitFailedException",
    "Cannot commit",
    "Missing required files",
    "FileNotFoundException",
    "NotFoundException",
    "Cannot determine history",
)


def _java_error(exc: Exception) -> str:
    """The Java exception line of a Py4J error (its first line says only "o59.sql")."""
    lines = str(exc).splitlines()
    return next((line for line in lines if "Exception" in line), lines[0])[:400]


class _GatedBudget(IoBudget):
    """The scheduler's I/O budget with a gate the test holds: a compaction's rewrite
    waits at its first read while the gate is shut (``entered`` says it got there)."""

    def __init__(self) -> None:
        super().__init__(None)
        self.open = threading.Event()
        self.open.set()
        self.entered = threading.Event()

    def acquire(self, nbytes: int, *, deadline: float | None = None) -> float:
        if not self.open.is_set():
            self.entered.set()
            self.open.wait()
        return super().acquire(nbytes, deadline=deadline)

    def close(self) -> None:
        self.open.set()
        super().close()


async def test_spark_rewrite_and_expire_beside_the_daemons_maintenance(
    make_config: Any,
    run_daemon: Any,
    spark: Any,
    register: Any,
    catalog_name: str,
    postgres_uri: str,
    tmp_path: Path,
) -> None:
    config = make_config(
        catalog={
            "name": catalog_name,
            "uri": postgres_uri,
            "warehouse": (tmp_path / "warehouse").as_uri(),
        },
        tables=[{"name": TABLE, "create": True, "schema": SCHEMA}],
        maintenance={
            "interval": "1s",
            "lease_ttl": "120s",  # the run's deadline: past the gated wait
            "compaction_min_files": 2,
            "min_snapshots": 2,
            "max_snapshot_age": "2s",
        },
    )
    name = register(config)
    spark_table = f"{name}.{TABLE}"
    spark_won: list[int] = []
    spark_lost: list[str] = []

    def spark_rewrite_and_expire() -> None:
        try:
            row = spark.sql(
                f"CALL {name}.system.rewrite_data_files(table => '{TABLE}', "
                "options => map('min-input-files', '2'))"
            ).first()
            spark_won.append(row.rewritten_data_files_count)
        except Exception as exc:
            spark_lost.append(_java_error(exc))
        try:
            spark.sql(
                f"CALL {name}.system.expire_snapshots(table => '{TABLE}', "
                "older_than => TIMESTAMP '2999-01-01 00:00:00', retain_last => 3)"
            ).collect()
        except Exception as exc:
            spark_lost.append(_java_error(exc))

    async with run_daemon(config) as (service, _):
        gate = _GatedBudget()
        service.maintenance.budget = gate
        feeder = _Feeder(service)

        def status() -> object:
            return service.status()["tables"][TABLE]

        stop = asyncio.Event()
        feeding = asyncio.ensure_future(feeder.run_until(stop, 0.2))
        try:
            # 1. Spark wins: its rewrite and expiry commit while the daemon's compaction
            #    of the same files waits in its rewrite; the daemon's replace then
            #    conflicts, commits nothing, and the run goes on (expiry, orphans).
            gate.open.clear()
            assert await asyncio.to_thread(gate.entered.wait, 30), "no compaction started"
            await asyncio.to_thread(spark_rewrite_and_expire)
            assert spark_won and spark_won[0] >= 2, (spark_won, spark_lost)
            gate.open.set()
            await _eventually(lambda: _runs(service, "compact", "conflict"), status, 60)
            # 2. Free-running: Spark's rewrite and expiry beside the daemon's compaction
            #    and expiry, each side winning some races.
            await asyncio.to_thread(spark_rewrite_and_expire)
            await _eventually(
                lambda: _runs(service, "compact", "ok") and _removed(service, "data_file"),
                status,
                60,
            )
        finally:
            gate.open.set()
            stop.set()
            await feeding
        await feeder.once()
        commit_failures = _metric(service, "icespool_commit_failures_total", {"table": TABLE})
        status = service.status()["tables"][TABLE]
        outcomes = {
            (task, outcome): _runs(service, task, outcome)
            for task in ("compact", "expire", "orphans")
            for outcome in ("ok", "conflict", "failed")
        }
        removed = {kind: _removed(service, kind) for kind in ("data_file", "manifest")}

    print(
        f"{len(feeder.snapshots)} daemon commits; Spark rewrote {spark_won}, lost "
        f"{len(spark_lost)} races; daemon runs {outcomes}; removed {removed}"
    )
    for line in spark_lost:
        assert any(kind in line for kind in _SPARK_LOST), line
    assert commit_failures == 0 and status["pending_records"] == 0, status
    assert not any(outcomes[task, "failed"] for task in ("compact", "expire", "orphans")), status
    assert len(feeder.snapshots) == len(feeder.acked) // ROWS

    expected = sorted(feeder.acked)
    spark_ids = sorted(row.id for row in spark.table(spark_table).select("id").collect())
    assert spark_ids == expected
    by_pyiceberg = await asyncio.to_thread(_pyiceberg_ids, config)
    assert sorted(by_pyiceberg.elements()) == expected
    operations = {
        row.operation
        for row in spark.sql(f"SELECT operation FROM {spark_table}.snapshots").collect()
    }
    assert operations <= {"append", "replace"}, operations


async def _expired(config: Any, snapshot_id: int) -> bool:
    def load() -> set[int]:
        catalog = load_catalog(config.catalog.name, **config.catalog.properties())
        try:
            return {s.snapshot_id for s in catalog.load_table(TABLE).metadata.snapshots}
        finally:
            catalog.engine.dispose()  # type: ignore[attr-defined]

    return snapshot_id not in await asyncio.to_thread(load)


def _set_retention(config: Any, properties: dict[str, str]) -> None:
    catalog = load_catalog(config.catalog.name, **config.catalog.properties())
    try:
        table = catalog.load_table(TABLE)
        with table.transaction() as transaction:
            transaction.set_properties(properties)
    finally:
        catalog.engine.dispose()  # type: ignore[attr-defined]


KEEP = 12  # min_snapshots: what a stopped stream may fall behind by, in snapshots


async def test_a_spark_stream_reads_exactly_once_while_the_daemon_maintains(
    make_config: Any,
    run_daemon: Any,
    spark: Any,
    register: Any,
    catalog_name: str,
    tmp_path: Path,
) -> None:
    config = make_config(
        catalog={"name": catalog_name},
        tables=[{"name": TABLE, "create": True, "schema": SCHEMA}],
        # Retention by count, so what the test stops the stream for is exact: the newest
        # KEEP snapshots stay whatever their age (the age alone would let everything go).
        maintenance={
            "interval": "1s",
            "lease_ttl": "60s",
            "compaction_min_files": 2,
            "min_snapshots": KEEP,
            "max_snapshot_age": "1s",
        },
    )
    name = register(config)
    out, checkpoint = tmp_path / "stream-out", tmp_path / "stream-checkpoint"

    def start() -> Any:
        return (
            spark.readStream.table(f"{name}.{TABLE}")
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="500 milliseconds")
            .start()
        )

    def streamed() -> Counter[int]:
        # The file sink's own log says which files are committed: exactly-once output.
        return Counter(row.id for row in spark.read.parquet(str(out)).select("id").collect())

    async with run_daemon(config) as (service, _):
        feeder = _Feeder(service)
        await feeder.once()
        query = await asyncio.to_thread(start)
        try:
            # 1. The stream reads while the daemon ingests, compacts and expires. The
            #    stream is let catch up every few commits: a stream that lags by more
            #    than the retention fails just as a stopped one does (step 3).
            deadline = time.monotonic() + 60
            while not (_runs(service, "compact", "ok") >= 2 and _removed(service, "manifest_list")):
                assert time.monotonic() < deadline, service.status()["tables"][TABLE]
                for _ in range(KEEP // 3):
                    await feeder.once()
                await asyncio.to_thread(query.processAllAvailable)
            # 2. Stopped, the table moves on by fewer than KEEP snapshots (appends and
            #    compactions); restarted from its checkpoint, it goes on exactly once.
            await asyncio.to_thread(query.stop)
            before = _runs(service, "expire", "ok")
            for _ in range(4):
                await feeder.once()
            await _eventually(
                lambda: _runs(service, "expire", "ok") >= before + 2,
                lambda: service.status()["tables"][TABLE],
                60,
            )
            query = await asyncio.to_thread(start)
            for _ in range(4):
                await feeder.once()
            await asyncio.to_thread(query.processAllAvailable)
            assert sorted(streamed().elements()) == sorted(feeder.acked)
            replaced = int(_runs(service, "compact", "ok"))
            expired_runs = _removed(service, "manifest_list")

            # 3. The trade-off: a retention of one snapshot (the table's own properties,
            #    which win over [maintenance]) expires the snapshot a stopped stream
            #    stands on, and the stream cannot resume from its checkpoint.
            await asyncio.to_thread(query.stop)
            stood_on = feeder.snapshots[-1]
            await asyncio.to_thread(
                _set_retention,
                config,
                {
                    "history.expire.min-snapshots-to-keep": "1",
                    "history.expire.max-snapshot-age-ms": "1",
                },
            )
            await feeder.once()
            await _eventually(
                lambda: _expired(config, stood_on),
                lambda: service.status()["tables"][TABLE],
                60,
            )
            query = await asyncio.to_thread(start)
            try:
                await asyncio.to_thread(query.processAllAvailable)
            except Exception as exc:
                error = str(exc)
            else:
                error = ""
            assert "expired" in error, error[:2000]
        finally:
            await asyncio.to_thread(query.stop)

    print(
        f"streamed {len(feeder.acked)} ids over {len(feeder.snapshots)} commits, "
        f"{replaced} compactions, {expired_runs:g} manifest lists expired; "
        f"resume after expiry: {error.splitlines()[0][:300]}"
    )
