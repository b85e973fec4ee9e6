"""Spark's maintenance and the daemon's compaction on an upsert table with equality deletes,
while change sets keep committing.

The table (key (region, id), identity partitions on region, format v2) gets change sets
committed as an upsert commit commits them (support/cdc_tables.py: data files plus
equality deletes for every touched key, one snapshot each), and a Spark merge-on-read
DELETE adds position deletes. Then, while a thread keeps committing change sets:

1. the daemon plans and rewrites its compaction; Spark's ``rewrite_data_files`` with
   ``delete-file-threshold = 1`` and ``rewrite_position_delete_files`` run; the daemon's
   commit reports ``conflict`` (Spark rewrote its inputs first) with its files deleted;
2. the daemon compacts again on the table Spark left and commits.

After each step Spark's view equals the state the test computed itself, key by key:
no change lost, none applied twice, no key live twice.
"""

from __future__ import annotations

import random
import threading
from typing import Any

import pyarrow as pa
from pyiceberg.table import Table
from support.cdc_tables import commit_changes, delete_files, merged_rows
from support.maintenance_helpers import ENCODE, local_path

from daemon.iceberg._catalog import ensure_table, load_catalog
from daemon.maintenance import IoBudget, commit_rewrite, plan_compaction, rewrite
from daemon.retry import Backoff
from daemon.schema import parse_partition_spec, parse_schema

TARGET = 1 << 20
WRITER = {"row_group_records": ENCODE["row_group_records"], "compression": "zstd"}
FAST = Backoff(attempts=6, base=0.01, cap=0.1)
KEY = ("region", "id")
REGIONS = ("eu", "us")
KEYS = 400

State = dict[tuple[Any, ...], dict[str, Any]]


class _Changes:
    """Random change sets over ``KEYS`` keys per region; ``state`` follows them."""

    def __init__(self, table: Table, seed: int) -> None:
        self.table = table
        self.rng = random.Random(seed)
        self.state: State = {}
        self.version = 0
        self.lock = threading.Lock()

    def commit_one(self) -> None:
        universe = [(r, i) for r in REGIONS for i in range(KEYS)]
        touched = self.rng.sample(universe, 40)
        cut = self.rng.randrange(len(touched) + 1)
        upserts, deletes = touched[:cut], touched[cut:]
        with self.lock:
            self.version += 1
            n = self.version
            commit_changes(
                self.table,
                pa.table(
                    {
                        "region": [r for r, _ in upserts],
                        "id": [i for _, i in upserts],
                        "payload": [f"{r}-{i}-v{n}" for r, i in upserts],
                        "version": [n] * len(upserts),
                    }
                )
                if upserts
                else None,
                pa.table({"region": [r for r, _ in deletes], "id": [i for _, i in deletes]})
                if deletes
                else None,
                KEY,
            )
            for r, i in upserts:
                self.state[(r, i)] = {
                    "region": r,
                    "id": i,
                    "payload": f"{r}-{i}-v{n}",
                    "version": n,
                }
            for k in deletes:
                self.state.pop(k, None)

    def run_until(self, done: threading.Event, errors: list[BaseException]) -> None:
        try:
            while not done.wait(0.3):
                self.commit_one()
        except BaseException as exc:  # surfaced by the test
            errors.append(exc)


def _spark_state(spark: Any, name: str) -> State:
    rows = spark.sql(f"SELECT region, id, payload, version FROM {name}").collect()
    state: State = {}
    for row in rows:
        key = (row.region, row.id)
        assert key not in state, f"key {key} is live twice in Spark's view"
        state[key] = row.asDict()
    return state


def test_spark_rewrites_beside_changes_and_the_daemons_compaction(
    make_config: Any, spark: Any, register: Any, catalog_name: str
) -> None:
    config = make_config(catalog={"name": catalog_name})
    catalog = load_catalog(config.catalog.name, config.catalog.properties())
    schema = parse_schema(
        [
            {"name": "region", "type": "string", "required": True},
            {"name": "id", "type": "long", "required": True},
            {"name": "payload", "type": "string"},
            {"name": "version", "type": "long"},
        ]
    )
    spec = parse_partition_spec(schema, ["region"])
    table = ensure_table(catalog, "m.upserts", schema, spec, {}, True)
    ingest_table = load_catalog(config.catalog.name, config.catalog.properties()).load_table(
        "m.upserts"
    )
    name = f"{register(config)}.m.upserts"
    procedures = f"{name.rsplit('.', 2)[0]}.system"
    changes = _Changes(ingest_table, seed=11)
    for _ in range(30):
        changes.commit_one()
    assert _spark_state(spark, name) == changes.state

    # Position deletes from Spark (merge-on-read DELETE), folded into the state.
    # Spark's commits retry on the daemon's concurrent ones (4 retries by default are
    # too few beside commits every fraction of a second).
    spark.sql(
        f"ALTER TABLE {name} SET TBLPROPERTIES ('write.delete.mode' = 'merge-on-read', "
        "'commit.retry.num-retries' = '30')"
    )
    spark.sql(f"DELETE FROM {name} WHERE id % 37 = 0")
    for key in [k for k in changes.state if k[1] % 37 == 0]:
        changes.state.pop(key)
    assert _spark_state(spark, name) == changes.state == merged_rows(table, KEY)

    done = threading.Event()
    errors: list[BaseException] = []
    feeder = threading.Thread(target=changes.run_until, args=(done, errors), daemon=True)
    feeder.start()
    try:
        # 1. The daemon's rewrite is done; Spark rewrites the same files first.
        table.refresh()
        (plan,) = plan_compaction(table, target_file_size=TARGET, max_bytes=1 << 30)
        assert plan.applies_deletes
        new = rewrite(table, plan, budget=IoBudget(None), **WRITER)
        spark.sql(
            f"CALL {procedures}.rewrite_data_files(table => 'm.upserts', "
            "options => map('delete-file-threshold', '1', 'min-input-files', '2'))"
        ).collect()
        spark.sql(
            f"CALL {procedures}.rewrite_position_delete_files(table => 'm.upserts')"
        ).collect()
        result = commit_rewrite(table, plan, new, retry=FAST)
        assert result.outcome == "conflict", result
        assert not any(local_path(f.file_path).exists() for f in new)

        # 2. The daemon compacts what Spark left, changes still arriving.
        table.refresh()
        plans = plan_compaction(table, target_file_size=TARGET, max_bytes=1 << 30)
        if plans:
            new = rewrite(table, plans[0], budget=IoBudget(None), **WRITER)
            assert commit_rewrite(table, plans[0], new, retry=FAST).outcome == "committed"
    finally:
        done.set()
        feeder.join(timeout=60)
    assert not errors, errors
    assert changes.version > 30  # changes kept committing all along

    with changes.lock:
        expected = dict(changes.state)
    spark.sql(f"REFRESH TABLE {name}")
    assert _spark_state(spark, name) == expected == merged_rows(table, KEY)

    # Quiet table: one more daemon run leaves no delete file and few data files.
    table.refresh()
    plans = plan_compaction(table, target_file_size=TARGET, max_bytes=1 << 30)
    if plans:
        new = rewrite(table, plans[0], budget=IoBudget(None), **WRITER)
        assert commit_rewrite(table, plans[0], new, retry=FAST).outcome == "committed"
    assert delete_files(table) == []
    files = spark.sql(f"SELECT count(*) AS n FROM {name}.data_files").collect()[0].n
    assert files <= 2 * len(REGIONS)
    assert _spark_state(spark, name) == expected
