"""The orphan sweep removes exactly the daemon's old, never-committed, unspooled files.

Real SQLite SQL catalog and local warehouse. Ages are real: files are aged with
``os.utime`` and named with uuid7s made hours ago (``uuid7_at``).
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from pathlib import Path

import pytest
from pyiceberg.expressions import EqualTo
from pyiceberg.table import Table
from support.maintenance_helpers import (
    encode_daemon_files,
    local_path,
    rows,
    sql_catalog,
    table_ids,
    uuid7_at,
)

from daemon.iceberg._catalog import ensure_table
from daemon.iceberg._commit import commit_files
from daemon.maintenance import (
    daemon_file_id,
    daemon_file_time,
    is_daemon_file,
    remove_orphans,
)
from daemon.maintenance._orphans import compaction_file_prefix
from daemon.schema import parse_partition_spec, parse_schema

HOUR = 3600.0
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


def _write(table: Table, ids: range, *, named_at: float, prefix: str | None = None) -> Path:
    """One daemon-named file (not committed) whose name was made at ``named_at``."""
    data = rows(ids, kind=["k"] * len(ids))
    _, files = encode_daemon_files(table, data, prefix=prefix or uuid7_at(named_at))
    (data_file,) = files
    return local_path(data_file.file_path)


def _commit(table: Table, ids: range, *, named_at: float) -> tuple[Path, int]:
    segment = uuid7_at(named_at)
    data = rows(ids, kind=["k"] * len(ids))
    _, files = encode_daemon_files(table, data, prefix=segment)
    result = commit_files(table, files, segment_ids=[segment], summary={})
    return local_path(files[0].file_path), result.snapshot_id


def test_only_old_unreferenced_unspooled_daemon_files_are_removed(tmp_path: Path) -> None:
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
        table, range(110, 120), named_at=old, prefix=compaction_file_prefix(uuid7_at(old))
    )
    young_mtime = _write(table, range(120, 130), named_at=old)
    young_name = _write(table, range(130, 140), named_at=time.time())
    spooled = _write(table, range(140, 150), named_at=old)
    foreign = orphan.with_name(f"00000-0-{uuid.uuid4()}.parquet")
    shutil.copyfile(orphan, foreign)
    for path in orphan.parent.rglob("*.parquet"):
        if path != young_mtime:
            _age(path, 2 * HOUR)
    doomed_bytes = orphan.stat().st_size + compaction.stat().st_size
    spooled_id = daemon_file_id(str(spooled))
    asked: list[str] = []

    def is_spooled(file_id: str) -> bool:
        asked.append(file_id)
        return file_id == spooled_id

    result = remove_orphans(table, older_than_s=HOUR, is_spooled=is_spooled)

    assert not orphan.exists() and not compaction.exists()
    for kept in (live, replaced, branched, young_mtime, young_name, spooled, foreign):
        assert kept.exists(), kept
    assert result.removed == 2 and result.failed == 0
    assert result.bytes_removed == doomed_bytes
    assert result.referenced == 3
    assert result.spooled == 1
    assert result.young == 2
    assert result.foreign == 2  # the copy and the row delete's pyiceberg-written file
    assert result.listed == 10
    assert spooled_id in asked and daemon_file_id(str(young_name)) not in asked
    assert table_ids(table) == list(range(10)) + [i for i in range(10, 20) if i != 15]

    # A second sweep finds nothing more to remove.
    again = remove_orphans(table, older_than_s=HOUR, is_spooled=is_spooled)
    assert again.removed == 0 and again.listed == 8 and again.referenced == 3


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
        path = directories[n % 100] / f"{file_id}-00000-00000.parquet"
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
    result = remove_orphans(table, older_than_s=HOUR, is_spooled=spooled.__contains__)
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

    result = remove_orphans(table, older_than_s=HOUR, is_spooled=lambda _: False)

    assert result.skipped is not None and "outside the table location" in result.skipped
    assert result.removed == 0 and orphan.exists()


def test_daemon_file_names_and_their_times() -> None:
    at = 1_714_521_600.123
    segment = uuid7_at(at)
    assert daemon_file_id(f"s3://b/t/data/kind=a/{segment}-00003-00012.parquet") == segment
    assert daemon_file_id(f"/w/t/data/c-{segment}-00000-00000.parquet") == segment
    assert daemon_file_id(f"/w/{segment}-123456-00000.parquet") == segment  # > 99,999 parts
    assert daemon_file_id(f"/w/t/data/{segment}-eq-00001-00000.parquet") == segment  # deletes
    assert daemon_file_time(f"/w/c-{segment}-00000-00001.parquet") == pytest.approx(at, abs=0.001)
    for foreign in (
        f"/w/00000-0-{uuid.uuid4()}.parquet",  # Spark / pyiceberg
        f"/w/{uuid.uuid4()}-00000-00000.parquet",  # a uuid4, not a uuid7
        f"/w/{segment}-00000-00000.parquet.crc",
        f"/w/{segment}.parquet",
        f"/w/x-{segment}-00000-00000.parquet",
        f"/w/{segment}-00000-00000.avro",
    ):
        assert not is_daemon_file(foreign), foreign
        assert daemon_file_time(foreign) is None
