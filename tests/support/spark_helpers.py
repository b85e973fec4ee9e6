"""Helpers of the Spark tests: catalog names, scan metrics, rows as plain values."""

from __future__ import annotations

import uuid
from typing import Any

__all__ = ["rows", "scan_metrics", "unique_catalog_name"]


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
