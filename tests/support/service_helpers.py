"""Reading an in-process daemon's tables and metrics back in tests."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from pyiceberg.exceptions import NoSuchTableError

from icespool.lifecycle.service import Icespool

__all__ = ["key_index_ready", "metric", "table_rows", "wait_rows"]


def table_rows(service: Icespool, table: str) -> list[dict[str, Any]]:
    """Every row of ``table`` as the service's catalog holds it now (blocking)."""
    assert service._catalog is not None
    rows: list[dict[str, Any]] = service._catalog.load_table(table).scan().to_arrow().to_pylist()
    return rows


async def wait_rows(
    service: Icespool, table: str, count: int, within: float = 60
) -> list[dict[str, Any]]:
    """Poll until ``table`` has at least ``count`` rows; fail naming what it had."""
    deadline = time.monotonic() + within
    rows: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        try:
            rows = await asyncio.to_thread(table_rows, service, table)
        except NoSuchTableError:  # created by the daemon when its first records come
            rows = []
        if len(rows) >= count:
            return rows
        await asyncio.sleep(0.3)
    raise AssertionError(f"{table}: {len(rows)} rows after {within}s, expected {count}")


def metric(service: Icespool, name: str, **labels: str) -> float:
    value = service.metrics.registry.get_sample_value(name, labels)
    return value or 0.0


async def key_index_ready(service: Icespool, table: str, within: float = 60) -> int | None:
    """Poll /v1/status until ``table``'s key index is ready (its commits then delete by
    position); return the snapshot it is at."""
    deadline = time.monotonic() + within
    state: Any = None
    while time.monotonic() < deadline:
        state = service.status()["tables"][table]["key_index"]
        if state is not None and state["ready"]:
            snapshot: int | None = state["snapshot_id"]
            return snapshot
        await asyncio.sleep(0.05)
    raise AssertionError(f"{table}: key index not ready after {within}s: {state}")
