"""Spark 3.5 still reads what the daemon writes: the suite runs on Spark 4.1, and this one
check runs on Spark 3.5 with Iceberg's Spark 3.5 runtime (the Makefile's spark35 target:
a venv holding only pyspark 3.5, and the jars of deploy/spark/pom.xml's spark-3.5 profile,
in .test-tools/spark35/). The settings are exactly what ``icespool spark-conf --spark 3.5
--runtime-dir`` prints; a Spark 3.5 process (support/spark35/run_queries.py in that venv)
reads every id of an append table once, time travels to an earlier snapshot and reads
exactly that snapshot's ids, and reads an upsert table's merged state.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from support.spark_helpers import unique_catalog_name

from icespool.config import Config
from icespool.spark.conf import spark_settings
from icespool.spark.session import DEFAULT_SESSION_CONF

REPO = Path(__file__).resolve().parents[2]
SPARK35 = REPO / ".test-tools" / "spark35"
SPARK35_PYTHON = SPARK35 / "venv" / "bin" / "python"
SPARK35_RUNTIME = SPARK35 / "runtime"
SCRIPT = REPO / "tests" / "support" / "spark35" / "run_queries.py"
_PYSPARK_ENV = frozenset({"PYTHONPATH", "SPARK_HOME", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"})
# A Spark 3.5 JVM start and three small queries take about 20 s on two cores.
_TIMEOUT = 300

EVENTS = "t.events"
USERS = "t.users"
TABLES = [
    {
        "name": EVENTS,
        "create": True,
        "schema": [
            {"name": "id", "type": "long", "required": True},
            {"name": "v", "type": "string"},
        ],
    },
    {
        "name": USERS,
        "create": True,
        "key": ["id"],
        "schema": [
            {"name": "id", "type": "long", "required": True},
            {"name": "name", "type": "string"},
            {"name": "score", "type": "long"},
        ],
    },
]
_SESSION_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "1",
    "spark.driver.memory": "512m",
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
}


def _events(ids: range) -> pa.RecordBatch:
    return pa.record_batch(
        {"id": pa.array(ids, pa.int64()), "v": pa.array([f"v{i}" for i in ids], pa.string())}
    )


def _run_spark35(config: Config, queries: dict[str, str]) -> dict[str, Any]:
    """The results of ``queries`` run by a Spark 3.5 process on the daemon's catalog."""
    if not SPARK35_PYTHON.exists() or not SPARK35_RUNTIME.is_dir():
        pytest.fail(
            f"the Spark 3.5 venv and runtime are missing under {SPARK35}: run 'make spark35'",
            pytrace=False,
        )
    settings = spark_settings(
        config, runtime_dir=SPARK35_RUNTIME, include_secrets=True, spark="3.5"
    )
    request = {
        "conf": {**DEFAULT_SESSION_CONF, **_SESSION_CONF, **settings.conf},
        "queries": queries,
    }
    proc = subprocess.run(
        [str(SPARK35_PYTHON), str(SCRIPT)],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        timeout=_TIMEOUT,
        cwd=REPO,
        # This venv's pyspark must not leak in: the child imports the 3.5 venv's own.
        env={k: v for k, v in os.environ.items() if k not in _PYSPARK_ENV},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    answer: dict[str, Any] = json.loads(proc.stdout)
    return answer


async def test_spark_35_reads_time_travels_and_merges_what_the_daemon_wrote(
    make_config: Any, run_daemon: Any
) -> None:
    config = make_config(catalog={"name": unique_catalog_name()}, tables=TABLES)
    rng = random.Random(35)
    state: dict[int, list[Any]] = {}
    async with run_daemon(config) as (service, _):
        await service.writer(EVENTS).append(_events(range(120)))
        earlier = await service.flush(EVENTS)
        assert (earlier.records, earlier.snapshot_id is not None) == (120, True), earlier
        await service.writer(EVENTS).append(_events(range(120, 300)))
        later = await service.flush(EVENTS)
        assert later.records == 180, later

        users = service.writer(USERS)
        for commit in range(4):
            ups = [
                {"id": i, "name": f"n{commit}-{i}", "score": rng.randrange(1000)}
                for i in rng.sample(range(80), 30)
            ]
            dels = [{"id": i} for i in rng.sample(range(80), 10)]
            await users.upsert(ups)
            state.update({row["id"]: [row["id"], row["name"], row["score"]] for row in ups})
            await users.delete(dels)
            for row in dels:
                state.pop(row["id"], None)
            assert (await users.flush()).snapshot_id is not None

    name = config.catalog.name
    answer = _run_spark35(
        config,
        {
            "ids": f"SELECT id, v FROM {name}.{EVENTS}",
            "earlier": f"SELECT id FROM {name}.{EVENTS} VERSION AS OF {earlier.snapshot_id}",
            "users": f"SELECT id, name, score FROM {name}.{USERS}",
        },
    )

    assert answer["spark"].startswith("3.5."), answer["spark"]
    results = answer["results"]
    ids = Counter(row[0] for row in results["ids"])
    assert ids == Counter(range(300)), sorted(i for i, n in ids.items() if n != 1)
    assert sorted(results["ids"]) == [[i, f"v{i}"] for i in range(300)]
    assert sorted(row[0] for row in results["earlier"]) == list(range(120))
    assert {row[0]: row for row in results["users"]} == state
    assert len(results["users"]) == len(state)
