"""The orphan sweep removes exactly this spool's never-committed, unspooled files.

Ownership comes from the incarnation in a file's name, never from a clock: another
replica's files stay whatever their age. Real SQLite SQL catalog and local warehouse.
Ages are real: files are aged with ``os.utime`` and named with uuid7s made hours ago
(``uuid7_at``).
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from pathlib import Path

from pyiceberg.expressions import EqualTo
from pyiceberg.table import Table
from support.maintenance_helpers import (
    INCARNATION,
    encode_daemon_files,
    local_path,
    rows,
    sql_catalog,
    table_ids,
    uuid7_at,
)

from icespool.iceberg import commit_files
from icespool.iceberg._catalog import ensure_table
from icespool.maintenance import (
    FileOwner,
    daemon_file_id,
    daemon_file_incarnation,
    is_daemon_file,
    remove_orphans,
)
from icespool.maintenance._orphans import compaction_file_prefix
from icespool.schema import parse_partition_spec, parse_schema

HOUR = 3600.0
RUNNING = "aaaaaaaaaaaa"  # the sweeping process's incarnation
OTHER = "ffffffffffff"  # another replica's
#: The sweeping replica: running now, with INCARNATION among its spool's earlier ones.
OWNER = FileOwner(RUNNING, frozenset({INCARNATION, RUNNING}))
COLUMNS: list[dict[str, object]] = [
    {"name": "id", "type": "long", "required": True},
    {"name": "payload", "type": "string"},
    {"name": "kind", "type": "string"},
]


def _table(tmp_path: Path, properties: dict[str, str] | None = None) -> Table:
    schema = parse_schema(COLUMNS)
    spec = parse_partition_spec(schema, ["identity(kind)"])
    return ensure_table(
        sql_catalog(tmp_path), "m.events", schema, spec, properties or {}, create=True
    )


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def _write(
    table: Table,
    ids: range,
    *,
    named_at: float,
    prefix: str | None = None,
    incarnation: str = INCARNATION,
) -> Path:
    """One daemon-named file (not committed) whose name was made at ``named_at``."""
    data = rows(ids, kind=["k"] * len(ids))
    _, files = encode_daemon_files(
        table, data, prefix=prefix, segment=uuid7_at(named_at), incarnation=incarnation
    )
    (data_file,) = files
    return local_path(data_file.file_path)


def _commit(table: Table, ids: range, *, named_at: float) -> tuple[Path, int]:
    segment = uuid7_at(named_at)
    data = rows(ids, kind=["k"] * len(ids))
    _, files = encode_daemon_files(table, data, segment=segment)
    result = commit_files(table, files, segment_ids=[segment], summary={})
    return local_path(files[0].file_path), result.snapshot_id


def test_only_this_spools_unreferenced_unspooled_files_are_removed(tmp_path: Path) -> None:
    table = _table(tmp_path)
    old = time.time() - 3 * HOUR
    live, _ = _commit(table, range(10), named_at=old)
    # Referenced only by an older snapshot: a row delete rewrote the file out of main.
    replaced, _ = _commit(table, range(10, 20), named_at=old)
    table.delete(EqualTo("id", 15))
    # Referenced only by a branch: main was rolled back past the snapshot that added it.
    branched, snapshot = _commit(table, range(20, 30), named_at=old)
    parent = table.metadata.snapshot_by_id(snapshot)
    assert parent is not None and parent.parent_snapshot_id is not None
    with table.manage_snapshots() as manage:
        manage.create_branch(snapshot, "audit")
    with table.manage_snapshots() as manage:
        manage.rollback_to_snapshot(parent.parent_snapshot_id)

    orphan = _write(table, range(100, 110), named_at=old)
    compaction = _write(
        table,
        range(110, 120),
        named_at=old,
        prefix=compaction_file_prefix(uuid7_at(old), INCARNATION),
    )
    # An ended incarnation's files are removed whatever their age.
    young_mtime = _write(table, range(120, 130), named_at=old)
    young_name = _write(table, range(130, 140), named_at=time.time())
    spooled = _write(table, range(140, 150), named_at=old)
    foreign = orphan.with_name(f"00000-0-{uuid.uuid4()}.parquet")
    shutil.copyfile(orphan, foreign)
    # Another replica's file and one without an incarnation: never ours, however old.
    other = _write(table, range(150, 160), named_at=old - 48 * HOUR, incarnation=OTHER)
    legacy = _write(table, range(160, 170), named_at=old, prefix=uuid7_at(old))
    for path in orphan.parent.rglob("*.parquet"):
        if path != young_mtime:
            _age(path, 50 * HOUR if path == other else 2 * HOUR)
    # The running process's own files: its spool proves them, their age does not matter.
    running = _write(table, range(170, 180), named_at=time.time(), incarnation=RUNNING)
    running_spooled = _write(table, range(180, 190), named_at=time.time(), incarnation=RUNNING)
    doomed = (orphan, compaction, running, young_mtime, young_name)
    doomed_bytes = sum(p.stat().st_size for p in doomed)
    spooled_ids = {daemon_file_id(str(spooled)), daemon_file_id(str(running_spooled))}
    asked: list[str] = []

    def is_spooled(file_id: str) -> bool:
        asked.append(file_id)
        return file_id in spooled_ids

    result = remove_orphans(table, owner=OWNER, is_spooled=is_spooled)

    assert not any(path.exists() for path in doomed)
    for kept in (
        live,
        replaced,
        branched,
        spooled,
        foreign,
        other,
        legacy,
        running_spooled,
    ):
        assert kept.exists(), kept
    assert result.removed == 5 and result.failed == 0
    assert result.bytes_removed == doomed_bytes
    assert result.referenced == 3
    assert result.spooled == 2
    # The copy, the row delete's pyiceberg-written file, the other replica's, the legacy one.
    assert result.foreign == 4
    assert result.listed == 14
    assert spooled_ids <= set(asked)
    assert daemon_file_id(str(other)) not in asked
    assert table_ids(table) == list(range(10)) + [i for i in range(10, 20) if i != 15]

    # A second sweep finds nothing more to remove.
    again = remove_orphans(table, owner=OWNER, is_spooled=is_spooled)
    assert again.removed == 0 and again.listed == 9 and again.referenced == 3


def test_another_replicas_files_survive_any_clock(tmp_path: Path) -> None:
    """A sweeping replica whose clock runs days ahead sees every file as old: the other
    replica's fresh, not yet committed files stay, and commit afterwards."""
    table = _table(tmp_path)
    segment = uuid7_at(time.time())
    data = rows(range(50), kind=["k"] * 50)
    _, files = encode_daemon_files(table, data, segment=segment, incarnation=OTHER)
    path = local_path(files[0].file_path)
    _age(path, 30 * 24 * HOUR)  # an object store whose server clock is wrong, say

    result = remove_orphans(table, owner=OWNER, is_spooled=lambda _: False)

    assert path.exists() and result.removed == 0 and result.foreign == 1
    commit_files(table, files, segment_ids=[segment], summary={})
    assert table_ids(table) == list(range(50))


def test_ten_thousand_candidates_are_swept_in_bounded_time(tmp_path: Path) -> None:
    table = _table(tmp_path)
    old = time.time() - 3 * HOUR
    live, _ = _commit(table, range(10), named_at=old)
    _age(live, 2 * HOUR)
    data = live.parent.parent
    spooled: set[str] = set()
    doomed: list[Path] = []
    directories = [data / f"kind=p{n}" for n in range(100)]
    for directory in directories:
        directory.mkdir()
    then = time.time() - 2 * HOUR
    for n in range(10_000):
        file_id = uuid7_at(old)
        path = directories[n % 100] / f"{file_id}-{INCARNATION}-00000-00000.parquet"
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.write(descriptor, b"x" * 16)
            os.utime(descriptor, (then, then))
        finally:
            os.close(descriptor)
        if n % 2:
            spooled.add(file_id)
        else:
            doomed.append(path)

    started = time.monotonic()
    result = remove_orphans(table, owner=OWNER, is_spooled=spooled.__contains__)
    elapsed = time.monotonic() - started

    assert result.removed == 5_000 and result.bytes_removed == 5_000 * 16
    assert result.spooled == 5_000 and result.referenced == 1 and result.listed == 10_001
    assert not any(path.exists() for path in doomed)
    assert live.exists() and table_ids(table) == list(range(10))
    # 0.9 s on an idle 2-core machine; the bound is for a hang or a quadratic pass
    # (10,000 x 10,000 comparisons), with room for a machine shared with other work.
    assert elapsed < 30, f"sweeping 10,000 candidates took {elapsed:.1f} s"


def test_a_data_location_outside_the_table_is_never_swept(tmp_path: Path) -> None:
    shared = tmp_path / "shared-data"
    table = _table(tmp_path, {"write.data.path": shared.as_uri()})
    orphan = _write(table, range(10), named_at=time.time() - 3 * HOUR)
    assert shared in orphan.parents
    _age(orphan, 2 * HOUR)

    result = remove_orphans(table, owner=OWNER, is_spooled=lambda _: False)

    assert result.skipped is not None and "outside the table location" in result.skipped
    assert result.removed == 0 and orphan.exists()


def test_daemon_file_names() -> None:
    at = 1_714_521_600.123
    segment = uuid7_at(at)
    inc = INCARNATION
    assert daemon_file_id(f"s3://b/t/data/kind=a/{segment}-{inc}-00003-00012.parquet") == segment
    assert daemon_file_id(f"/w/t/data/c-{segment}-{inc}-00000-00000.parquet") == segment
    assert daemon_file_id(f"/w/{segment}-{inc}-123456-00000.parquet") == segment  # > 99,999
    assert daemon_file_id(f"/w/t/data/{segment}-{inc}-eq-00001-00000.parquet") == segment
    assert daemon_file_incarnation(f"/w/t/data/{segment}-{inc}-eq-00001-00000.parquet") == inc
    assert daemon_file_id(f"/w/t/data/{segment}-{inc}-pos-00001-00000.parquet") == segment
    assert daemon_file_id(f"/w/t/data/{segment}-{inc}-pos3-00001-00000.parquet") == segment
    assert daemon_file_id(f"/w/t/data/{segment}-{inc}-eq12-00000-00000.parquet") == segment
    assert daemon_file_incarnation(f"/w/c-{segment}-{inc}-00000-00000.parquet") == inc
    # Names written before incarnations: still the daemon's (compaction rewrites them),
    # but of no known incarnation (the sweep leaves them).
    assert daemon_file_id(f"/w/t/data/{segment}-eq-00001-00000.parquet") == segment
    assert daemon_file_incarnation(f"/w/{segment}-00003-00012.parquet") is None
    for foreign in (
        f"/w/00000-0-{uuid.uuid4()}.parquet",  # Spark / pyiceberg
        f"/w/{uuid.uuid4()}-00000-00000.parquet",  # a uuid4, not a uuid7
        f"/w/{segment}-{inc}-00000-00000.parquet.crc",
        f"/w/{segment}.parquet",
        f"/w/x-{segment}-00000-00000.parquet",
        f"/w/{segment}-{inc}-00000-00000.avro",
        f"/w/{segment}-{inc.upper()}-00000-00000.parquet",
    ):
        assert not is_daemon_file(foreign), foreign


def test_a_file_this_process_committed_is_kept_when_the_table_loses_it(tmp_path: Path) -> None:
    """The catalog went back to an older metadata file: a file this process committed
    is in no snapshot any more. It holds acked rows the table lost, so it stays (and is
    counted); a never-committed file beside it is removed."""
    table = _table(tmp_path)
    lost = _write(table, range(10), named_at=time.time(), incarnation=RUNNING)
    orphan = _write(table, range(10, 20), named_at=time.time(), incarnation=RUNNING)

    result = remove_orphans(
        table, owner=OWNER, is_spooled=lambda _: False, was_committed={lost.name}.__contains__
    )

    assert lost.exists() and not orphan.exists()
    assert (result.kept, result.removed, result.listed) == (1, 1, 2)
