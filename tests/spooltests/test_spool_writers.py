"""A segment says which process wrote it and whether a copy can hold more of it: what a
table's segment ranges rely on (daemon/iceberg/_segment_ranges.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

from support.spool_helpers import batch

from icespool.spool import Spool, segment_writer


async def test_segment_ids_end_with_their_writers_tag(tmp_path: Path) -> None:
    async with Spool(tmp_path / "a") as first, Spool(tmp_path / "b") as second:
        ours = [(await first.append(t, batch(1))).segment_id for t in ("ns.t", "ns.u")]
        theirs = (await second.append("ns.t", batch(1))).segment_id
        assert [segment_writer(s) for s in ours] == [first.incarnation.tag] * 2
        assert segment_writer(theirs) == second.incarnation.tag != first.incarnation.tag
    async with Spool(tmp_path / "a") as again:
        later = (await again.append("ns.t", batch(2))).segment_id
        assert segment_writer(later) == again.incarnation.tag
        assert later > max(ours)  # a writer's ids still sort in the order they were made


async def test_only_a_seal_by_the_writer_makes_a_segment_whole(tmp_path: Path) -> None:
    """Sealed by its writer: whole, here and in every copy. Copied while its writer
    still appended: the copy's recovery seals it, and it stays a possible prefix in
    every copy of the copy too."""
    original, copy, copy_of_copy = tmp_path / "original", tmp_path / "copy", tmp_path / "cc"
    async with Spool(original) as spool:
        await spool.append("ns.t", batch(1))
        sealed = await spool.seal("ns.t")
        assert sealed is not None and sealed.whole
        await spool.append("ns.t", batch(2))  # open while the directory is copied
        shutil.copytree(original, copy)
        await spool.append("ns.t", batch(3))
    async with Spool(copy) as spool:
        found = {s.id: (s.rows, s.whole) for s in spool.recovered.segments}
        assert found.pop(sealed.id) == (3, True)
        assert list(found.values()) == [(3, False)]  # the open one: 3 of its 6 rows
        shutil.copytree(copy, copy_of_copy, ignore=shutil.ignore_patterns("LOCK"))
    async with Spool(copy_of_copy) as spool:
        assert sorted(s.whole for s in spool.recovered.segments) == [False, True]
    async with Spool(original) as spool:  # its writer closed it: sealed whole
        assert [(s.rows, s.whole) for s in spool.recovered.segments] == [(3, True), (6, True)]


async def test_held_ids_name_every_segment_of_the_table_the_directory_keeps(
    tmp_path: Path,
) -> None:
    async with Spool(tmp_path) as spool:
        first = (await spool.append("ns.t", batch(1))).segment_id
        await spool.seal("ns.t")
        bad = (await spool.append("ns.t", batch(2))).segment_id
        await spool.seal("ns.t")
        await spool.quarantine(bad, "its rows failed 3 flushes")
        sealed = (await spool.append("ns.t", batch(3))).segment_id
        await spool.seal("ns.t")
        open_one = (await spool.append("ns.t", batch(4))).segment_id
        other_table = (await spool.append("ns.u", batch(5))).segment_id
        await spool.delete(first)
        assert await spool.held_ids("ns.t") == {bad, sealed, open_one}
        assert await spool.held_ids("ns.u") == {other_table}
