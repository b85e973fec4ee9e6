"""The last schema of each table outlives its segments (``table-schemas``): recorded at
close, newer in a leftover segment, harmless when damaged. Real directories."""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa
import pytest

from icespool.spool import Spool

_IDS = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": b"1"}),
        pa.field("v", pa.string(), metadata={b"PARQUET:field_id": b"2"}),
    ]
)
# The same names, other field ids (a table re-created elsewhere): a schema of its own.
_RENUMBERED = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": b"7"}),
        pa.field("v", pa.string(), metadata={b"PARQUET:field_id": b"8"}),
    ]
)
_WIDER = _IDS.append(pa.field("w", pa.float64(), metadata={b"PARQUET:field_id": b"3"}))


def _batch(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([{"id": 1, "v": "a", "w": 0.5}], schema=schema)


async def _spool_and_commit(directory: Path, table: str, schema: pa.Schema) -> None:
    """Append, seal and delete (as a commit does): no segment is left."""
    async with Spool(directory) as spool:
        await spool.append(table, _batch(schema))
        info = await spool.seal(table)
        assert info is not None
        await spool.delete(info.id)


def _same(found: pa.Schema | None, expected: pa.Schema) -> bool:
    return found is not None and found.equals(expected, check_metadata=True)


async def test_the_last_schemas_outlive_their_committed_segments(tmp_path: Path) -> None:
    await _spool_and_commit(tmp_path, "ns.a", _IDS)
    await _spool_and_commit(tmp_path, "ns.b", _WIDER)
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".arrow") == []
    async with Spool(tmp_path) as spool:
        assert sorted(spool.schemas) == ["ns.a", "ns.b"]
        assert _same(spool.schemas["ns.a"], _IDS)
        assert _same(spool.schemas["ns.b"], _WIDER)
    # Field ids count: a renumbered table replaces the record.
    await _spool_and_commit(tmp_path, "ns.a", _RENUMBERED)
    async with Spool(tmp_path) as spool:
        assert _same(spool.schemas["ns.a"], _RENUMBERED)
        assert _same(spool.schemas["ns.b"], _WIDER)


async def test_a_leftover_segment_is_newer_than_the_record(tmp_path: Path) -> None:
    """A process that dies never records its schemas; its leftover segment says them."""
    await _spool_and_commit(tmp_path, "ns.a", _IDS)
    record = (tmp_path / "table-schemas").read_bytes()
    async with Spool(tmp_path) as spool:
        await spool.append("ns.a", _batch(_WIDER))
    # As if it had died before its close: the record as the earlier run left it.
    (tmp_path / "table-schemas").write_bytes(record)
    async with Spool(tmp_path) as spool:
        assert len(spool.recovered.segments) == 1
        assert _same(spool.schemas["ns.a"], _WIDER)


@pytest.mark.parametrize("damage", [b"", b"{not json", b'{"ns.a": "AAAA"}', b"[1, 2]"])
async def test_a_damaged_record_is_no_record(
    tmp_path: Path, damage: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    await _spool_and_commit(tmp_path, "ns.a", _IDS)
    (tmp_path / "table-schemas").write_bytes(damage)
    with caplog.at_level(logging.WARNING, logger="icespool.spool"):
        async with Spool(tmp_path) as spool:
            assert dict(spool.schemas) == {}
            await spool.append("ns.a", _batch(_IDS))
    assert f"{tmp_path / 'table-schemas'} cannot be read (" in caplog.text
    # Written again at the close: the next start knows the table again.
    async with Spool(tmp_path) as spool:
        assert _same(spool.schemas["ns.a"], _IDS)
