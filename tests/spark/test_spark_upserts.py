"""Spark reads an upsert table's merged state: the daemon's equality deletes and data
files, committed over several flushes with updates and deletes across commits."""

from __future__ import annotations

import random
from typing import Any

from support.spark_helpers import rows

TABLE = "cdc.users"
SCHEMA = [
    {"name": "id", "type": "long", "required": True},
    {"name": "region", "type": "string", "required": True},
    {"name": "name", "type": "string", "required": True},
    {"name": "score", "type": "long"},
]


async def test_spark_sees_the_merged_state_of_upserts_and_deletes_across_commits(
    make_config: Any, run_daemon: Any, spark: Any, register: Any, catalog_name: str
) -> None:
    config = make_config(
        catalog={"name": catalog_name},
        tables=[
            {
                "name": TABLE,
                "create": True,
                "schema": SCHEMA,
                "key": ["id", "region"],
                "partition_by": ["bucket(4, id)", "region"],
                # Merged data manifests must keep every file's sequence number.
                "properties": {"commit.manifest.min-count-to-merge": "2"},
            }
        ],
    )
    rng = random.Random(16)
    state: dict[tuple[int, str], tuple[str, int | None]] = {}
    async with run_daemon(config) as (service, _):
        table = service.writer(TABLE)
        for flush_no in range(6):
            for _ in range(3):  # several spooled batches per commit
                ups: list[dict[str, Any]] = []
                dels: list[dict[str, Any]] = []
                for _ in range(60):
                    key = (rng.randrange(120), rng.choice(["eu", "us"]))
                    if rng.random() < 0.3:
                        dels.append({"id": key[0], "region": key[1]})
                    else:
                        value = (f"n{flush_no}-{rng.randrange(10**6)}", rng.randrange(100))
                        ups.append(
                            {"id": key[0], "region": key[1], "name": value[0], "score": value[1]}
                        )
                # Deletes after upserts of one round: a key upserted then deleted is gone.
                await table.upsert(ups)
                for row in ups:
                    state[(row["id"], row["region"])] = (row["name"], row["score"])
                await table.delete(dels)
                for row in dels:
                    state.pop((row["id"], row["region"]), None)
            result = await table.flush()
            assert result.snapshot_id is not None

    name = register(config)
    got = rows(spark.sql(f"SELECT id, region, name, score FROM {name}.{TABLE}"))
    assert len(got) == len(state)
    assert {(i, r): (n, s) for i, r, n, s in got} == state
    assert spark.sql(f"SELECT count(*) FROM {name}.{TABLE}").first()[0] == len(state)
    # Deleted keys are absent, not merely shadowed.
    for key in {(i, r) for i in range(120) for r in ("eu", "us")} - state.keys():
        assert key not in {(i, r) for i, r, _, _ in got}
