"""Spark and the daemon's compaction on one table: Spark reads the compacted table exactly,
sees a `replace` snapshot, and a Spark rewrite or merge-on-read delete of the inputs between
the daemon's rewrite and its commit ends the compaction as a conflict with nothing lost,
while a position delete naming only its inputs is carried to the new files; the next
compaction applies that delete and drops its file."""

from __future__ import annotations

from typing import Any

from pyiceberg.table import Table
from support.maintenance_helpers import (
    ENCODE,
    INCARNATION,
    append_daemon_files,
    local_path,
    rows,
    table_ids,
)

from icespool.iceberg._catalog import ensure_table, load_catalog
from icespool.maintenance import IoBudget, commit_rewrite, plan_compaction, rewrite
from icespool.runtime.retry import Backoff
from icespool.schema import parse_partition_spec, parse_schema

TARGET = 1 << 20
WRITER = {
    "row_group_records": ENCODE["row_group_records"],
    "compression": "zstd",
    "incarnation": INCARNATION,
}
FAST = Backoff(attempts=4, base=0.001, cap=0.01)


def _append(table: Table, start: int) -> None:
    append_daemon_files(
        table, [rows(range(start + 10 * n, start + 10 * n + 10)) for n in range(12)]
    )


def _spark_ids(spark: Any, name: str) -> list[int]:
    return sorted(row.id for row in spark.sql(f"SELECT id FROM {name}").collect())


def test_spark_reads_a_compacted_table_and_its_rewrites_and_deletes_win_over_ours(
    make_config: Any, spark: Any, register: Any, catalog_name: str
) -> None:
    config = make_config(catalog={"name": catalog_name})
    catalog = load_catalog(config.catalog.name, config.catalog.properties())
    schema = parse_schema(
        [{"name": "id", "type": "long", "required": True}, {"name": "payload", "type": "string"}]
    )
    table = ensure_table(catalog, "m.events", schema, parse_partition_spec(schema, []), {}, True)
    name = f"{register(config)}.m.events"
    budget = IoBudget(None)

    # 1. Compacted: Spark reads every row once, from the new files, under a replace snapshot.
    _append(table, 0)
    table.refresh()
    (plan,) = plan_compaction(table, target_file_size=TARGET, max_bytes=1 << 30)
    new = rewrite(table, plan, budget=budget, **WRITER)
    assert commit_rewrite(table, plan, new, retry=FAST).outcome == "committed"
    assert _spark_ids(spark, name) == list(range(120))
    operations = spark.sql(f"SELECT operation FROM {name}.snapshots ORDER BY committed_at")
    assert [row.operation for row in operations.collect()] == ["append", "replace"]
    files = {row.file_path for row in spark.sql(f"SELECT file_path FROM {name}.files").collect()}
    assert files == {f.file_path for f in new}

    # 2. Spark's rewrite_data_files between our rewrite and our commit: ours gives up.
    _append(table, 1_000)
    table.refresh()
    (plan,) = plan_compaction(table, target_file_size=TARGET, max_bytes=1 << 30)
    new = rewrite(table, plan, budget=budget, **WRITER)
    spark.sql(
        f"CALL {name.rsplit('.', 2)[0]}.system.rewrite_data_files("
        "table => 'm.events', options => map('min-input-files', '2'))"
    ).collect()
    result = commit_rewrite(table, plan, new, retry=FAST)
    assert result.outcome == "conflict"
    assert not any(local_path(f.file_path).exists() for f in new)
    expected = [*range(120), *range(1_000, 1_120)]
    assert _spark_ids(spark, name) == expected == table_ids(table)

    # 3. A merge-on-read delete (a position delete file) naming only our inputs, committed
    #    after we planned: ours carries it to the new files (its positions mapped through
    #    the rewrite) and commits. The next plan applies the delete and drops its file.
    _append(table, 2_000)
    table.refresh()
    (plan,) = plan_compaction(table, target_file_size=TARGET, max_bytes=1 << 30)
    new = rewrite(table, plan, budget=budget, **WRITER)
    spark.sql(f"ALTER TABLE {name} SET TBLPROPERTIES ('write.delete.mode' = 'merge-on-read')")
    spark.sql(f"DELETE FROM {name} WHERE id = 2005")
    result = commit_rewrite(table, plan, new, retry=FAST)
    assert result.outcome == "committed", result
    expected += [i for i in range(2_000, 2_120) if i != 2005]
    assert _spark_ids(spark, name) == expected == table_ids(table)
    table.refresh()
    (plan,) = plan_compaction(table, target_file_size=TARGET, max_bytes=1 << 30)
    assert plan.applies_deletes
    new = rewrite(table, plan, budget=budget, **WRITER)
    result = commit_rewrite(table, plan, new, retry=FAST)
    assert result.outcome == "committed" and result.rows_removed == 1
    assert result.delete_files_removed == 1
    assert _spark_ids(spark, name) == expected == table_ids(table)
    deletes = spark.sql(f"SELECT count(*) AS n FROM {name}.delete_files").collect()[0].n
    assert deletes == 0
