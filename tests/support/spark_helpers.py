"""Helpers of the Spark tests: catalog names, scan metrics, rows as plain values."""

from __future__ import annotations

import random
import time
import uuid
from typing import Any

__all__ = ["land", "rows", "scan_metrics", "unique_catalog_name"]

# Spark's validation refusing a commit over another writer's newer one (a rewrite whose
# inputs gained position deletes, a MERGE over rows deleted meanwhile).
_CONFLICT_MARKERS = (
    "ValidationException",
    "CommitFailedException",
    "Found conflicting",
    "Cannot commit",
    "Missing required files",
)


def unique_catalog_name() -> str:
    """A Spark catalog name no other test uses (Spark caches catalogs by name)."""
    return f"ice_{uuid.uuid4().hex[:10]}"


def rows(df: Any) -> list[tuple[Any, ...]]:
    return [tuple(row) for row in df.collect()]


def _seq(scala_seq: Any) -> list[Any]:
    return [scala_seq.apply(i) for i in range(scala_seq.size())]


def scan_metrics(df: Any) -> dict[str, int]:
    """Run ``df`` and return the Iceberg scan's metrics (resultDataFiles, skippedDataFiles,
    ...) from the executed plan's BatchScan node: what Spark really planned to read."""
    df.collect()
    plan = df._jdf.queryExecution().executedPlan()
    scans = [node for node in _seq(plan.collectLeaves()) if node.nodeName().startswith("BatchScan")]
    assert len(scans) == 1, f"expected one BatchScan in the plan, got {plan.toString()}"
    metrics = scans[0].metrics()
    return {name: int(metrics.get(name).get().value()) for name in _seq(metrics.keys().toSeq())}


def land(spark: Any, sql: str, patience: float = 120.0) -> int:
    """Run ``sql`` until Spark commits it beside another writer; how many times Spark
    refused it. Anything but a commit conflict, or conflicts past ``patience`` seconds,
    raises."""
    refused = 0
    deadline = time.monotonic() + patience
    while True:
        try:
            spark.sql(sql).collect()
            return refused
        except Exception as exc:
            if not any(m in str(exc) for m in _CONFLICT_MARKERS) or time.monotonic() > deadline:
                raise
            refused += 1
            time.sleep(random.uniform(0.1, 1.0))
