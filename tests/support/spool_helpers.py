"""Shared helpers for spool tests: deterministic batches and a spool reader."""

from __future__ import annotations

import pyarrow as pa

from icespool.spool import Spool

SCHEMA = pa.schema([("id", pa.int64()), ("label", pa.string()), ("ok", pa.bool_())])


def batch(batch_id: int, rows: int = 3) -> pa.RecordBatch:
    """Rows carry ids batch_id*1000 + j so content can be checked, not just counts."""
    ids = [batch_id * 1000 + j for j in range(rows)]
    return pa.record_batch(
        [
            pa.array(ids, pa.int64()),
            pa.array([f"b{batch_id}r{j}" for j in range(rows)]),
            pa.array([j % 2 == 0 for j in range(rows)]),
        ],
        schema=SCHEMA,
    )


async def read_all(spool: Spool, table: str) -> list[tuple[pa.RecordBatch, object]]:
    out: list[tuple[pa.RecordBatch, object]] = []
    for info in spool.segments(table):
        data = await spool.read(info.id)
        out.extend(zip(data.batches, data.metas, strict=True))
    return out
