"""Spark's row-level writes and rewrites on an upsert table while the daemon keeps
committing changes to it, deleting the older rows of its keys by position.

A real `Icespool` service owns the table (key (region, id), partitioned by region), its
maintenance every second. Every key is loaded once, so the daemon's data files hold all
of them; then, at the same time:

- the daemon's feeder changes keys with ``id % 5 != 0`` (upserts and deletes), a flush
  every 0.3-2 s;
- Spark works on the keys with ``id % 5 == 0``, which live in the same data files:
  merge-on-read ``MERGE INTO`` (updates and inserts), merge-on-read ``DELETE``,
  ``rewrite_data_files`` and ``rewrite_position_delete_files``. Each statement is
  retried until it lands: Spark refuses to commit deletes for rows of a file the
  daemon replaced or deleted from meanwhile (Iceberg's own validation, on Spark's side).

Whatever Spark committed, the daemon's next commit attempt syncs its key index to it
(Spark's new files, its position deletes, its rewritten files at their older sequence
numbers) and locates its keys again: a position is never applied to the wrong row. At
the end Spark's view, the daemon's merged read and the state the test computed agree key
by key, every daemon commit deleted by position, and the daemon's own key index names
exactly the live row of each key.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from support.cdc_tables import assert_index_exact, feed_change_set, versioned_row
from support.service_helpers import key_index_ready
from support.spark_helpers import land

from icespool.cdc import DELETE, UPSERT, KeyIndex, read_merged
from icespool.iceberg._catalog import load_catalog
from icespool.lifecycle.service import Icespool
from icespool.spool import table_file_stem
from icespool.write import KEY_INDEX_DIR

TABLE = "c.upserts"
SCHEMA = [
    {"name": "region", "type": "string", "required": True},
    {"name": "id", "type": "long", "required": True},
    {"name": "payload", "type": "string"},
    {"name": "version", "type": "long"},
]
KEY = ["region", "id"]
REGIONS = ("eu", "us")
KEYS = 300
#: Spark's own keys: the daemon's feeder never changes them.
SPARK_EVERY = 5

State = dict[tuple[str, int], dict[str, Any]]


class _Feeder:
    """Random change batches over the daemon's keys, a flush each; ``state`` follows
    every flushed batch (the last change per key wins)."""

    def __init__(self, service: Icespool, state: State) -> None:
        self.writer = service.writer(TABLE)
        self.rng = random.Random(34)
        self.state = state
        self.commits = 0
        self.universe = [(r, i) for r in REGIONS for i in range(KEYS) if i % SPARK_EVERY]

    async def once(self) -> None:
        touched = self.rng.sample(self.universe, 30)
        ops = [DELETE if self.rng.random() < 0.3 else UPSERT for _ in touched]
        await feed_change_set(self.writer, touched, ops, self.commits + 1, self.state)
        self.commits += 1

    async def run(self, done: asyncio.Event) -> None:
        while not done.is_set():
            await self.once()
            await asyncio.sleep(self.rng.uniform(0.3, 2.0))


def _spark_state(spark: Any, name: str) -> State:
    state: State = {}
    for row in spark.sql(f"SELECT region, id, payload, version FROM {name}").collect():
        key = (row.region, row.id)
        assert key not in state, f"key {key} is live twice in Spark's view"
        state[key] = row.asDict()
    return state


def _commits_by(service: Icespool, deletes: str) -> float:
    value = service.metrics.registry.get_sample_value(
        "icespool_upsert_commits_total", {"table": TABLE, "deletes": deletes}
    )
    return value or 0.0


async def _spark_rounds(spark: Any, name: str, procedures: str, state: State) -> int:
    """Spark's statements on its own keys, two rounds; the model follows each that
    landed. Returns how many times Spark was refused in all."""
    refused = 0
    spark_keys = [(r, i) for r in REGIONS for i in range(0, 2 * KEYS, SPARK_EVERY)]
    for round_no in (1, 2):
        version = 10_000 + round_no
        merged = [k for k in spark_keys if (k[1] // SPARK_EVERY) % 2 == round_no % 2]
        values = ", ".join(f"('{r}', {i}, '{r}-{i}-s{version}', {version})" for r, i in merged)
        refused += await asyncio.to_thread(
            land,
            spark,
            f"MERGE INTO {name} t USING (SELECT * FROM VALUES {values} "
            "AS s(region, id, payload, version)) s ON t.region = s.region AND t.id = s.id "
            "WHEN MATCHED THEN UPDATE SET t.payload = s.payload, t.version = s.version "
            "WHEN NOT MATCHED THEN INSERT *",
        )
        for r, i in merged:
            state[(r, i)] = {
                "region": r,
                "id": i,
                "payload": f"{r}-{i}-s{version}",
                "version": version,
            }
        gone = round_no % 3
        refused += await asyncio.to_thread(
            land, spark, f"DELETE FROM {name} WHERE id % {SPARK_EVERY} = 0 AND id % 3 = {gone}"
        )
        for key in [k for k in state if k[1] % SPARK_EVERY == 0 and k[1] % 3 == gone]:
            state.pop(key)
        refused += await asyncio.to_thread(
            land,
            spark,
            f"CALL {procedures}.rewrite_data_files(table => '{TABLE}', options => "
            "map('delete-file-threshold', '1', 'min-input-files', '1'))",
        )
        refused += await asyncio.to_thread(
            land,
            spark,
            f"CALL {procedures}.rewrite_position_delete_files(table => '{TABLE}', "
            "options => map('rewrite-all', 'true'))",
        )
    return refused


async def test_spark_merge_delete_and_rewrites_beside_position_upserts(
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
                "properties": {
                    "write.delete.mode": "merge-on-read",
                    "write.update.mode": "merge-on-read",
                    "write.merge.mode": "merge-on-read",
                    "commit.retry.num-retries": "10",
                },
            }
        ],
        maintenance={"interval": "1s", "lease_ttl": "120s", "compaction_min_files": 2},
    )
    catalog = register(config)
    name = f"{catalog}.{TABLE}"
    state: State = {}

    async with run_daemon(config) as (service, _):
        writer = service.writer(TABLE)
        await key_index_ready(service, TABLE)
        everything = [versioned_row(r, i, 0) for r in REGIONS for i in range(KEYS)]
        await writer.upsert(everything)
        await writer.flush()
        state.update({(r["region"], r["id"]): r for r in everything})
        feeder = _Feeder(service, state)
        done = asyncio.Event()
        feeding = asyncio.create_task(feeder.run(done))
        try:
            before = feeder.commits
            refused = await _spark_rounds(spark, name, f"{catalog}.system", state)
            during = feeder.commits - before
        finally:
            done.set()
            await feeding
        assert during >= 5, "the daemon kept committing while Spark worked"

        await asyncio.to_thread(spark.sql, f"REFRESH TABLE {name}")
        assert await asyncio.to_thread(_spark_state, spark, name) == state
        table = load_catalog(config.catalog.name, config.catalog.properties()).load_table(TABLE)
        merged = read_merged(table).to_pylist()
        assert {(r["region"], r["id"]): r for r in merged} == state
        assert len(merged) == len(state)
        # Every commit after the first (which deleted nothing) deleted by position: the
        # index followed each of Spark's commits instead of giving up on them.
        assert _commits_by(service, "equality") == 0
        assert _commits_by(service, "position") >= feeder.commits
    print(f"Spark refused {refused} times beside {feeder.commits} daemon commits")

    table = load_catalog(config.catalog.name, config.catalog.properties()).load_table(TABLE)
    index_file = config.spool.dir / KEY_INDEX_DIR / f"{table_file_stem(TABLE)}.sqlite3"
    schema = table.metadata.schema()
    index = KeyIndex(index_file, [schema.find_field(c).field_id for c in KEY], cache_bytes=1 << 20)
    try:
        assert_index_exact(index, table, KEY)
    finally:
        index.close()
