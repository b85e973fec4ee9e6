"""Torn tails are cut and the complete prefix kept; any flipped bit is quarantined."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
from support.spool_helpers import batch, read_all

from icespool.spool import Spool

TABLE = "ns.events"
OTHER = "ns.other"


async def _write_segment(directory: Path, batches: int) -> tuple[Path, list[int]]:
    """A sealed segment plus the file size after each acknowledged append."""
    boundaries: list[int] = []
    size = 0
    async with Spool(directory) as spool:
        for i in range(batches):
            ack = await spool.append(TABLE, batch(i, rows=2 + i), {"n": i})
            size += ack.bytes
            boundaries.append(size)
        info = await spool.seal(TABLE)
    assert info is not None
    return info.path, boundaries


async def test_truncation_at_every_byte_offset(tmp_path: Path) -> None:
    source, boundaries = await _write_segment(tmp_path / "src", batches=3)
    raw = source.read_bytes()
    assert len(raw) > boundaries[-1]  # seal and end-of-stream follow the last batch
    schema_end = 8 + int.from_bytes(raw[4:8], "little")  # the schema message has no body
    for cut in range(len(raw) + 1):
        directory = tmp_path / f"cut{cut}"
        directory.mkdir()
        (directory / source.name).write_bytes(raw[:cut])
        expected = sum(1 for b in boundaries if b <= cut)
        async with Spool(directory) as spool:
            report = spool.recovered
            assert report.quarantined == [], f"cut at {cut}"
            got = await read_all(spool, TABLE)
            assert [m for _, m in got] == [{"n": i} for i in range(expected)], f"cut at {cut}"
            assert all(b.equals(batch(i, rows=2 + i)) for i, (b, _) in enumerate(got))
            cut_bytes = sum(n for _, n in report.truncated)
            if expected == 0:
                assert report.segments == [] and not any(directory.glob("*.arrow"))
                # A torn first batch is still reported as a cut, not silently dropped.
                assert (cut_bytes > 0) == (cut > 0 and cut != schema_end), f"cut at {cut}"
            else:
                # Bytes past the last complete message are cut: a torn batch or
                # seal, or part of the end-of-stream marker after the seal.
                seal_end = len(raw) - 8
                last_whole = seal_end if cut >= seal_end else boundaries[expected - 1]
                assert cut_bytes == (cut - last_whole if cut < len(raw) else 0), f"cut at {cut}"
        shutil.rmtree(directory)


def _flip_positions(size: int, count: int) -> list[int]:
    rng = random.Random(20261121)
    # Always include the framing at both ends, where a flip could mimic a torn write.
    edges = list(range(16)) + list(range(size - 24, size))
    return edges + [rng.randrange(size) for _ in range(count)]


@pytest.mark.parametrize("batches", [1, 4])
async def test_any_flipped_bit_is_quarantined_and_others_survive(
    tmp_path: Path, batches: int
) -> None:
    source, _ = await _write_segment(tmp_path / "src", batches=batches)
    raw = source.read_bytes()
    async with Spool(tmp_path / "other") as spool:
        await spool.append(OTHER, batch(99))
    (other_file,) = (tmp_path / "other").glob("*.arrow")
    rng = random.Random(batches)
    for position in _flip_positions(len(raw), 150):
        damaged = bytearray(raw)
        damaged[position] ^= 1 << rng.randrange(8)
        directory = tmp_path / "run"
        directory.mkdir()
        (directory / source.name).write_bytes(bytes(damaged))
        shutil.copy(other_file, directory / other_file.name)
        async with Spool(directory) as spool:
            report = spool.recovered
            assert [p.name for p, _ in report.quarantined] == [source.name], position
            assert (directory / "quarantine" / source.name).read_bytes() == bytes(damaged)
            assert spool.segments(TABLE) == []
            got = await read_all(spool, OTHER)
            assert [b.equals(batch(99)) for b, _ in got] == [True]
        shutil.rmtree(directory)
