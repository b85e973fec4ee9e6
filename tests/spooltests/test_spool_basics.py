"""Append, seal, read, delete, rotation, accounting and limits on a real directory."""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from support.spool_helpers import SCHEMA, batch, read_all

from icespool.spool import (
    SegmentCorruptError,
    Spool,
    SpoolClosedError,
    SpoolError,
    SpoolFullError,
    UnknownSegmentError,
)


def _segment_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.suffix == ".arrow")


async def test_round_trip_keeps_order_values_and_metadata(tmp_path: Path) -> None:
    async with Spool(tmp_path) as spool:
        acks = [await spool.append("ns.t", batch(i), {"offset": i}) for i in range(5)]
        assert [a.batch_index for a in acks] == [0, 1, 2, 3, 4]
        assert len({a.segment_id for a in acks}) == 1
        info = await spool.seal("ns.t")
        assert info is not None and info.batches == 5 and info.rows == 15
        data = await spool.read(info.id)
        assert [b.equals(batch(i)) for i, b in enumerate(data.batches)] == [True] * 5
        assert data.metas == [{"offset": i} for i in range(5)]
        assert data.batches[0].schema.equals(SCHEMA, check_metadata=True)


async def test_a_schema_message_bigger_than_the_buffer_round_trips(tmp_path: Path) -> None:
    """The encoder sized its buffer for the batch only; the schema message it writes
    first is megabytes for a record with 100,000 fields (an inferred table), and the
    append failed with "Write out of bounds" (HTTP 500)."""
    # 1,200 fields with 1,000-character names: a 1.2 MB schema, a small batch.
    names = [f"{i:04d}".ljust(1_000, "x") for i in range(1_200)]
    wide = pa.record_batch([pa.array([i], pa.int64()) for i in range(1_200)], names=names)
    async with Spool(tmp_path) as spool:
        await spool.append("ns.wide", wide)
        await spool.append("ns.wide", wide)
    async with Spool(tmp_path) as spool:
        assert spool.recovered.quarantined == []
        assert [b.equals(wide) for b, _ in await read_all(spool, "ns.wide")] == [True, True]


async def test_clean_stop_with_nothing_appended_leaves_no_file(tmp_path: Path) -> None:
    async with Spool(tmp_path) as spool:
        assert await spool.seal("ns.t") is None
    assert _segment_files(tmp_path) == []


async def test_open_segment_is_sealed_on_close_and_recovered(tmp_path: Path) -> None:
    async with Spool(tmp_path) as spool:
        await spool.append("ns.t", batch(1))
    async with Spool(tmp_path) as spool:
        report = spool.recovered
        assert [s.rows for s in report.segments] == [3]
        assert report.truncated == [] and report.quarantined == []
        assert [b.equals(batch(1)) for b, _ in await read_all(spool, "ns.t")] == [True]


async def test_schema_change_rotates_segment(tmp_path: Path) -> None:
    other = pa.record_batch([pa.array([7], pa.int32())], names=["x"])
    async with Spool(tmp_path) as spool:
        first = await spool.append("ns.t", batch(1))
        second = await spool.append("ns.t", other)
        third = await spool.append("ns.t", batch(2))
        assert len({first.segment_id, second.segment_id, third.segment_id}) == 3
        await spool.seal("ns.t")
        ids = [s.id for s in spool.segments("ns.t")]
        assert ids == [first.segment_id, second.segment_id, third.segment_id]
        got = await read_all(spool, "ns.t")
        assert [b.num_columns for b, _ in got] == [3, 1, 3]


async def test_size_limit_rotates_segment(tmp_path: Path) -> None:
    async with Spool(tmp_path, segment_max_bytes=2000) as spool:
        acks = [await spool.append("ns.t", batch(i, rows=20)) for i in range(6)]
        # Rotations seal in the background; seal() also waits for those.
        last = await spool.seal("ns.t")
        sealed = spool.segments("ns.t")
        assert len(sealed) >= 2
        assert last is None or sealed[-1] == last
        # Every segment but an explicitly sealed tail reached the size limit.
        assert all(s.bytes >= 2000 for s in sealed if s != last)
        got = await read_all(spool, "ns.t")
        assert [b.equals(batch(i, rows=20)) for i, (b, _) in enumerate(got)] == [True] * 6
        assert len({a.segment_id for a in acks}) == len(spool.segments("ns.t"))


async def test_delete_frees_accounting_and_max_bytes_is_retriable(tmp_path: Path) -> None:
    big = batch(1, rows=200)
    async with Spool(tmp_path, max_bytes=big.nbytes * 3) as spool:
        await spool.append("ns.t", big)
        await spool.append("ns.t", big)
        with pytest.raises(SpoolFullError) as err:
            await spool.append("ns.t", big)
        assert err.value.retriable and "max_bytes" in str(err.value)
        info = await spool.seal("ns.t")
        assert info is not None
        assert spool.stats().bytes == info.bytes == os.path.getsize(info.path)
        await spool.delete(info.id)
        assert spool.stats().bytes == 0 and spool.stats().segments == 0
        assert not info.path.exists()
        await spool.append("ns.t", big)  # room again
        with pytest.raises(UnknownSegmentError):
            await spool.delete(info.id)
        with pytest.raises(SpoolError, match="can never fit"):
            await spool.append("ns.t", batch(2, rows=5000))


async def test_stats_per_table(tmp_path: Path) -> None:
    async with Spool(tmp_path) as spool:
        await spool.append("a.one", batch(1))
        await spool.append("a.two", batch(2))
        await spool.seal("a.one")
        stats = spool.stats()
        assert set(stats.tables) == {"a.one", "a.two"}
        assert stats.segments == 2 and stats.appends == 2
        assert stats.bytes == sum(t.bytes for t in stats.tables.values())
        assert stats.tables["a.one"].bytes == spool.segments("a.one")[0].bytes


async def test_concurrent_appends_to_one_table_keep_call_order(tmp_path: Path) -> None:
    async with Spool(tmp_path) as spool:
        acks = await asyncio.gather(*(spool.append("ns.t", batch(i), {"i": i}) for i in range(64)))
        assert [a.batch_index for a in acks] == list(range(64))
        await spool.seal("ns.t")
        assert [m for _, m in await read_all(spool, "ns.t")] == [{"i": i} for i in range(64)]


async def test_closed_spool_refuses_appends_and_bad_arguments(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    await spool.open()
    with pytest.raises(TypeError, match="RecordBatch"):
        await spool.append("ns.t", pa.table({"a": [1]}))
    await spool.close()
    await spool.close()  # idempotent
    with pytest.raises(SpoolClosedError):
        await spool.append("ns.t", batch(1))
    with pytest.raises(ValueError, match="durability"):
        Spool(tmp_path, durability="sometimes")  # type: ignore[arg-type]


async def test_segment_damaged_after_seal_is_quarantined_on_read(tmp_path: Path) -> None:
    async with Spool(tmp_path) as spool:
        await spool.append("ns.t", batch(1, rows=50))
        info = await spool.seal("ns.t")
        assert info is not None
        raw = bytearray(info.path.read_bytes())
        raw[len(raw) // 2] ^= 0x10
        info.path.write_bytes(bytes(raw))
        with pytest.raises(SegmentCorruptError, match="checksum"):
            await spool.read(info.id)
        assert (tmp_path / "quarantine" / info.path.name).read_bytes() == bytes(raw)
        assert spool.segments("ns.t") == [] and spool.stats().bytes == 0


async def test_nested_extension_types_seal_and_recover(tmp_path: Path) -> None:
    """A uuid inside a struct, list and map (pyarrow cannot build an empty array of
    those with pa.array([]); the seal batch must still be written)."""
    ids = pa.ExtensionArray.from_storage(
        pa.uuid(), pa.array([uuid.UUID(int=i).bytes for i in range(3)], pa.binary(16))
    )
    offsets = pa.array([0, 1, 2, 3], pa.int32())
    nested = pa.RecordBatch.from_pydict(
        {
            "s": pa.StructArray.from_arrays([ids], names=["u"]),
            "l": pa.ListArray.from_arrays(offsets, ids),
            "m": pa.MapArray.from_arrays(offsets, pa.array(["k"] * 3), ids),
        }
    )
    async with Spool(tmp_path) as spool:
        await spool.append("ns.t", nested)
        info = await spool.seal("ns.t")
        assert info is not None and info.rows == 3
    async with Spool(tmp_path) as spool:
        data = await spool.read(spool.recovered.segments[0].id)
        assert [b.equals(nested) for b in data.batches] == [True]
