"""What one attempt of an upsert commit adds and removes, decided on the table it builds
on (blocking; run in the flush's thread, inside the commit engine's attempt).

With the key index (`position_changes`):

- The older rows of the keys the commit changes are deleted by position. Every data
  file they are in gets ONE delete file naming every deleted row of it: the new
  positions merged with those of the delete files that named that file alone, which the
  snapshot removes. A reader applies one delete file per data file, and a file with one
  delete file shares a read task with others.
- The writer's last small data file of a partition (its "tail", under
  ``TAIL_BYTES``) is rewritten instead, with its live rows (minus the changed keys') and
  the commit's new rows of that partition, in place of the old one and its delete
  files: a table fed every second keeps one small file per partition and writer, not
  one per commit. A tail that grows past ``TAIL_BYTES`` is kept as it is, and the next
  commit starts a new one; maintenance compacts the kept ones.

Without it (`equality_changes`): the new rows as written, and equality deletes of every
key the commit touched, as Iceberg's upsert writers do.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyiceberg.typedef import Record

from icespool.cdc import Change, KeyIndex, KeyValue, Located, NewFile, read_positions
from icespool.config import WriterSettings
from icespool.iceberg import (
    DELETE_FILE_MARK,
    POSITION_DELETE_MARK,
    TAIL_FILE_MARK,
    AttemptChanges,
    EncodedFile,
    check_upsert_layout,
    encode_data_files_with_rows,
    encode_equality_deletes,
    encode_position_deletes,
    remove_files,
)
from icespool.schema import conform

__all__ = ["TAIL_BYTES", "Plan", "Tails", "equality_changes", "position_changes"]

#: A tail of at most this many bytes on disk is rewritten by the next commit; a larger
#: one is kept as it is (the cost of a commit stays bounded by it).
TAIL_BYTES: Final = 8 * 2**20

#: A partition of the table: its spec id and partition values.
Part = tuple[int, Record]
#: The writer's tail of each partition (the data file it would rewrite).
Tails = dict[Part, DataFile]


@dataclass(frozen=True)
class Plan:
    """What one flush's commit needs besides the table: encoded by the flush, used by
    every attempt."""

    prefix: str
    settings: WriterSettings
    key: tuple[str, ...]
    name: str
    keys: pa.Table  # the key columns of every key the changes touched, one row each
    values: Sequence[KeyValue]  # the same keys as index values
    upserts: pa.Table  # the surviving upserts, in the table's Arrow schema
    upsert_values: Sequence[KeyValue]  # their keys, row for row
    written: Sequence[EncodedFile]  # the upserts, encoded (one set per partition)
    spec_id: int
    attempts: Iterator[int] = field(default_factory=itertools.count)


@dataclass(frozen=True)
class Detail:
    """A position attempt's record (`AttemptChanges.detail`): what the key index takes
    once it landed, the writer's tails after it, and which encoded files it commits."""

    change: Change
    tails: Tails
    used: frozenset[str]


def equality_changes(table: Table, plan: Plan, attempt: int) -> AttemptChanges:
    """The new rows as encoded, and an equality delete of every key touched."""
    # Another writer may have repartitioned the table: deletes that would miss rows
    # hold the table back (retried, nothing quarantined) instead.
    check_upsert_layout(table, plan.key, plan.name)
    settings = plan.settings
    deletes = encode_equality_deletes(
        table,
        plan.keys.to_batches(),
        plan.key,
        target_file_size=settings.target_file_size,
        row_group_records=settings.row_group_records,
        compression=settings.compression,
        file_prefix=f"{plan.prefix}{DELETE_FILE_MARK}{attempt}",
    )
    return AttemptChanges([*(e.file for e in plan.written), *deletes], written=deletes)


def position_changes(
    table: Table, plan: Plan, attempt: int, index: KeyIndex, tails: Mapping[Part, str]
) -> AttemptChanges:
    """The attempt's changes with ``index`` synced to ``table`` (module doc)."""
    located = index.locate(plan.values)
    rewriting = _tails_to_rewrite(plan, index, tails)
    written: list[DataFile] = []
    try:
        return _position_changes(table, plan, attempt, index, located, rewriting, written)
    except BaseException:
        remove_files(table, written)
        raise


def _position_changes(
    table: Table,
    plan: Plan,
    attempt: int,
    index: KeyIndex,
    located: Located,
    rewriting: Mapping[Part, str],
    written: list[DataFile],
) -> AttemptChanges:
    added: list[DataFile] = []
    removed: list[DataFile] = []
    new_files: list[NewFile] = []
    dropped: list[str] = []
    next_tails: Tails = {}
    used: set[str] = set()
    for part, encoded in _by_part(plan.written).items():
        tail = rewriting.get(part)
        if tail is None:
            for e in encoded:
                added.append(e.file)
                used.add(e.file.file_path)
                keys = [plan.upsert_values[i] for i in e.rows.to_pylist()]
                new_files.append(NewFile(e.file, plan.spec_id, keys))
            next_tails[part] = encoded[-1].file
            continue
        files, keys = _rewrite_tail(table, plan, attempt, index, located, tail, encoded)
        written.extend(e.file for e in files)
        for e in files:
            added.append(e.file)
            new_files.append(NewFile(e.file, plan.spec_id, [keys[i] for i in e.rows.to_pylist()]))
        next_tails[part] = files[-1].file
        tail_file = index.data_file(tail)
        assert tail_file is not None  # checked by _tails_to_rewrite
        removed.append(tail_file.file)
        for delete in index.scoped_deletes(tail):
            removed.append(delete.file)
            dropped.append(delete.path)
    rewritten = set(rewriting.values())
    merged: dict[str, np.ndarray] = {}
    for path, positions in located.positions.items():
        if path in rewritten:
            continue  # its rows are gone with the old tail
        merged[path] = positions
        for delete in index.scoped_deletes(path):
            named = read_positions(table.io, delete.file, [path]).get(path)
            if named is not None:
                merged[path] = np.union1d(merged[path], named)
            removed.append(delete.file)
            dropped.append(delete.path)
    deletes = encode_position_deletes(
        table,
        Located(merged, {path: located.files[path] for path in merged}),
        file_prefix=f"{plan.prefix}{POSITION_DELETE_MARK}{attempt}",
        compression=plan.settings.compression,
    )
    written.extend(deletes.values())
    added.extend(deletes.values())
    kept = {p: v for p, v in located.positions.items() if p not in rewritten}
    change = Change(
        located=Located(kept, {p: located.files[p] for p in kept}),
        added=new_files,
        removed=sorted(rewritten),
        deletes=deletes,
        dropped_deletes=dropped,
    )
    tails_after = {part: f for part, f in next_tails.items() if f.file_size_in_bytes < TAIL_BYTES}
    return AttemptChanges(
        added, removed, list(written), Detail(change, tails_after, frozenset(used))
    )


def _by_part(written: Sequence[EncodedFile]) -> dict[Part, list[EncodedFile]]:
    parts: dict[Part, list[EncodedFile]] = {}
    for e in written:
        parts.setdefault((getattr(e.file, "spec_id", 0), e.file.partition), []).append(e)
    return parts


def _tails_to_rewrite(plan: Plan, index: KeyIndex, tails: Mapping[Part, str]) -> dict[Part, str]:
    """The tails this attempt rewrites: the writer's, live at its base, still small, of
    a partition the commit adds rows to."""
    wanted: dict[Part, str] = {}
    for part in _by_part(plan.written):
        path = tails.get(part)
        data = index.data_file(path) if path is not None else None
        if data is not None and data.file.file_size_in_bytes < TAIL_BYTES:
            wanted[part] = path  # type: ignore[assignment]
    return wanted


def _rewrite_tail(
    table: Table,
    plan: Plan,
    attempt: int,
    index: KeyIndex,
    located: Located,
    tail: str,
    encoded: Sequence[EncodedFile],
) -> tuple[list[EncodedFile], list[KeyValue]]:
    """The tail's live rows, minus those of the keys this commit changes, then the
    commit's new rows of its partition, written as new files; and their keys in order."""
    positions, keys = index.live_rows(tail)
    gone = located.positions.get(tail)
    keep = np.ones(len(positions), dtype=bool)
    if gone is not None and len(gone):
        keep = ~np.isin(positions, gone)
    schema = plan.upserts.schema
    with table.io.new_input(tail).open() as stream:
        old = pq.read_table(stream)
    old = pa.Table.from_batches(
        [conform(b, schema, match_field_ids=True, drop_extra=True) for b in old.to_batches()],
        schema=schema,
    ).take(pa.array(positions[keep]))
    new_rows = np.concatenate([e.rows.to_numpy(zero_copy_only=False) for e in encoded])
    fresh = plan.upserts.take(pa.array(new_rows))
    settings = plan.settings
    files = encode_data_files_with_rows(
        table,
        pa.concat_tables([old, fresh]).to_batches(),
        target_file_size=settings.target_file_size,
        row_group_records=settings.row_group_records,
        compression=settings.compression,
        file_prefix=f"{plan.prefix}{TAIL_FILE_MARK}{attempt}",
    )
    kept_keys = [k for k, on in zip(keys, keep.tolist(), strict=True) if on]
    return files, [*kept_keys, *(plan.upsert_values[i] for i in new_rows.tolist())]
