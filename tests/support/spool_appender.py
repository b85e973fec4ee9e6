"""Child process for the kill -9 tests: appends numbered batches, prints each ack.

Usage: python spool_appender.py SPOOL_DIR DURABILITY
Resumes numbering after whatever the spool already holds, so ids stay unique
across rounds. Also rotates and seals now and then, so kills land in every phase.
"""

from __future__ import annotations

import asyncio
import random
import sys

import pyarrow as pa

from icespool.spool import Spool

SCHEMA = pa.schema([("id", pa.int64()), ("payload", pa.string())])
TABLE = "ns.kill"


def make_batch(batch_id: int, rows: int) -> pa.RecordBatch:
    return pa.record_batch(
        [pa.array([batch_id] * rows, pa.int64()), pa.array(["x" * (batch_id % 97)] * rows)],
        schema=SCHEMA,
    )


async def main(directory: str, durability: str) -> None:
    rng = random.Random()
    async with Spool(directory, durability=durability, segment_max_bytes=64 << 10) as spool:  # type: ignore[arg-type]
        next_id = 0
        for info in spool.segments(TABLE):
            data = await spool.read(info.id)
            for meta in data.metas:
                assert isinstance(meta, dict)
                next_id = max(next_id, int(meta["id"]) + 1)  # type: ignore[call-overload]
        print(f"START {next_id}", flush=True)
        while True:
            rows = rng.choice([1, 10, 200, 2000])
            await spool.append(TABLE, make_batch(next_id, rows), {"id": next_id, "rows": rows})
            print(f"ACK {next_id}", flush=True)
            next_id += 1
            if rng.random() < 0.05:
                await spool.seal(TABLE)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
