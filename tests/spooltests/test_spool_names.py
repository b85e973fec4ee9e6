"""Table names can neither escape the spool directory nor collide."""

from __future__ import annotations

from pathlib import Path

from support.spool_helpers import batch, read_all

from icespool.spool import Spool, segment_file_name

NASTY = [
    "../x",
    "../../etc.passwd",
    "/",
    "ns./abs",
    "a\x00b.c",
    "ns." + "x" * 400,
    "ns." + "x" * 399 + "y",
    "ünï.cødé_表",
    "a__b.c",
    "a_.b",
    "a._b",
    "a.b.c",
    "a_2Eb.c",
    "a.b_2Ec",
    ".",
    "..",
    "\udcff.lone-surrogate",
]


def test_file_names_are_single_safe_components_and_distinct() -> None:
    names = [segment_file_name(t, "01a1fcf0-ba32-72a1-9116-351bc16fd19b") for t in NASTY]
    assert len(set(names)) == len(NASTY)
    for name in names:
        assert "/" not in name and "\x00" not in name and name not in (".", "..")
        assert not name.startswith(".")
        assert len(name.encode()) <= 255
        assert name.endswith("__01a1fcf0-ba32-72a1-9116-351bc16fd19b.arrow")


async def test_nasty_names_round_trip_inside_the_directory(tmp_path: Path) -> None:
    spool_dir = tmp_path / "spool"
    async with Spool(spool_dir) as spool:
        for i, table in enumerate(NASTY):
            await spool.append(table, batch(i))
    assert sorted(p.parent for p in spool_dir.rglob("*.arrow")) == [spool_dir] * len(NASTY)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spool"]
    async with Spool(spool_dir) as spool:
        assert sorted(spool.tables()) == sorted(NASTY)
        for i, table in enumerate(NASTY):
            got = await read_all(spool, table)
            assert [b.equals(batch(i)) for b, _ in got] == [True]
