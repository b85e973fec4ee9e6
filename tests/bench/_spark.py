"""The benches' local[2] Spark settings (bench_spark_read, bench_spark_maintained,
bench_cdc, bench_compaction_deletes, bench_vs_connect)."""

from __future__ import annotations

__all__ = ["BENCH_CONF"]

#: No UI or progress bars, two shuffle partitions (two cores), a 2 GiB driver.
BENCH_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.memory": "2g",
}
