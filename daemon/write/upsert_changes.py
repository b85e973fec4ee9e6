"""What one attempt of an upsert commit adds and removes, decided on the table it builds
on (blocking; run in the flush's thread, inside the commit engine's attempt).

With the key index (`position_changes`):

- The older rows of the keys the commit changes are deleted by position. Every data
  file they are in gets ONE delete file naming every deleted row of it: the new
  positions merged with those of the delete files that named that file alone, which the
  snapshot removes. A reader applies one delete file per data file, and a file with one
  delete file shares a read task with others.
- The commit's new rows of a partition go at the end of the writer's last small data
  file there (its "tail", under ``TAIL_BYTES``): a copy of it with the new rows after
  its own, in its place, so its rows keep their positions (its delete file, merged as
  above, moves to the copy, and the key index takes it by renaming the file). A table
  fed every second keeps one small file per partition and writer, not one per commit.
  A tail that grows past ``TAIL_BYTES`` is kept as it is and the next commit starts a
  new one; maintenance compacts the kept ones, dropping their deleted rows.

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

from icespool.cdc import (
    Change,
    IndexUnavailableError,
    KeyIndex,
    KeyValue,
    LiveData,
    LiveDelete,
    Located,
    NewFile,
    read_positions,
)
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

__all__ = ["TAIL_BYTES", "Detail", "Plan", "Tails", "equality_changes", "position_changes"]

#: A tail of at most this many bytes on disk is extended by the next commit; a larger
#: one is kept as it is (the cost of a commit stays bounded by it).
TAIL_BYTES: Final = 8 * 2**20
#: A target file size no tail reaches: its copy is one file.
_ONE_FILE: Final = 2**62
_NONE: Final = np.zeros(0, dtype=np.int64)

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
    written: list[DataFile] = []
    try:
        return _position_changes(table, plan, attempt, index, located, tails, written)
    except BaseException:
        remove_files(table, written)
        raise


def _position_changes(
    table: Table,
    plan: Plan,
    attempt: int,
    index: KeyIndex,
    located: Located,
    tails: Mapping[Part, str],
    written: list[DataFile],
) -> AttemptChanges:
    parts = _by_part(plan.written)
    candidates = {part: tails[part] for part in parts if part in tails}
    scoped = _scoped(table, index, [*located.positions, *candidates.values()])
    extending = {
        part: path for part, path in candidates.items() if _extendable(index, path, scoped)
    }
    # Rows each data file loses: the new positions, with those of the delete files that
    # name it alone (replaced by one merged file); a tail's go to its copy, at the same
    # positions.
    touched = {*located.positions, *extending.values()}
    dead = {
        path: np.union1d(scoped[path][0], located.positions.get(path, _NONE)) for path in touched
    }
    files = {path: located.files.get(path) or index.data_file(path) for path in touched}
    removed = [d.file for path in touched for d in scoped[path][1]]
    dropped = [d.path for path in touched for d in scoped[path][1]]
    added: list[DataFile] = []
    new_files: list[NewFile] = []
    extended: dict[str, NewFile] = {}
    next_tails: Tails = {}
    used: set[str] = set()
    for part, encoded in parts.items():
        path = extending.get(part)
        if path is None:
            for e in encoded:
                added.append(e.file)
                used.add(e.file.file_path)
                keys = [plan.upsert_values[i] for i in e.rows.to_pylist()]
                new_files.append(NewFile(e.file, plan.spec_id, keys))
            next_tails[part] = encoded[-1].file
            continue
        old = files.pop(path)
        assert old is not None  # live: chosen by _extendable
        copy, keys = _extend_tail(table, plan, attempt, old, encoded)
        written.append(copy.file)
        added.append(copy.file)
        removed.append(old.file)
        extended[path] = NewFile(copy.file, old.spec_id, keys)
        next_tails[part] = copy.file
        dead[copy.file.file_path] = dead.pop(path)
        files[copy.file.file_path] = LiveData(copy.file, 0, old.spec_id)
    deletes = encode_position_deletes(
        table,
        Located(
            {p: v for p, v in dead.items() if len(v)},
            {p: f for p, f in files.items() if f is not None},
        ),
        file_prefix=f"{plan.prefix}{POSITION_DELETE_MARK}{attempt}",
        compression=plan.settings.compression,
    )
    written.extend(deletes.values())
    added.extend(deletes.values())
    change = Change(located, new_files, extended, (), deletes, dropped)
    tails_after = {part: f for part, f in next_tails.items() if f.file_size_in_bytes < TAIL_BYTES}
    return AttemptChanges(
        added, removed, list(written), Detail(change, tails_after, frozenset(used))
    )


def _scoped(
    table: Table, index: KeyIndex, paths: Sequence[str]
) -> dict[str, tuple[np.ndarray, list[LiveDelete]]]:
    """For each data file: the positions its file-scoped delete files delete, and them."""
    out: dict[str, tuple[np.ndarray, list[LiveDelete]]] = {}
    for path in paths:
        deletes = index.scoped_deletes(path)
        positions = _NONE
        for delete in deletes:
            named = read_positions(table.io, delete.file, [path]).get(path)
            if named is not None:
                positions = np.union1d(positions, named)
        out[path] = (positions, deletes)
    return out


def _extendable(
    index: KeyIndex, path: str, scoped: Mapping[str, tuple[np.ndarray, list[LiveDelete]]]
) -> bool:
    """Whether the tail at ``path`` is live and every dead row of it is named by its
    file-scoped deletes (carried to its copy). A row dead by another writer's delete that
    names several files, or by an equality delete, would come back in the copy (its newer
    sequence number): such a tail is kept as it is."""
    data = index.data_file(path)
    if data is None or data.file.file_size_in_bytes >= TAIL_BYTES:
        return False
    return index.live_count(path) + len(scoped[path][0]) == data.file.record_count


def _by_part(written: Sequence[EncodedFile]) -> dict[Part, list[EncodedFile]]:
    parts: dict[Part, list[EncodedFile]] = {}
    for e in written:
        parts.setdefault((getattr(e.file, "spec_id", 0), e.file.partition), []).append(e)
    return parts


def _extend_tail(
    table: Table, plan: Plan, attempt: int, tail: LiveData, encoded: Sequence[EncodedFile]
) -> tuple[EncodedFile, list[KeyValue]]:
    """A copy of ``tail`` with the commit's new rows of its partition after its own (one
    file: its rows keep their positions), and the keys of the rows it adds."""
    schema = plan.upserts.schema
    with table.io.new_input(tail.file.file_path).open() as stream:
        old = pq.read_table(stream)
    old = pa.Table.from_batches(
        [conform(b, schema, match_field_ids=True, drop_extra=True) for b in old.to_batches()],
        schema=schema,
    )
    if old.num_rows != tail.file.record_count:
        raise IndexUnavailableError(
            f"{tail.file.file_path} holds {old.num_rows} rows, its manifest entry counts "
            f"{tail.file.record_count}"
        )
    new_rows = np.concatenate([e.rows.to_numpy(zero_copy_only=False) for e in encoded])
    settings = plan.settings
    (copy,) = encode_data_files_with_rows(
        table,
        pa.concat_tables([old, plan.upserts.take(pa.array(new_rows))]).to_batches(),
        # One file whatever its size: its first rows must keep their positions.
        target_file_size=_ONE_FILE,
        row_group_records=settings.row_group_records,
        compression=settings.compression,
        file_prefix=f"{plan.prefix}{TAIL_FILE_MARK}{attempt}",
    )
    return copy, [plan.upsert_values[i] for i in new_rows.tolist()]
