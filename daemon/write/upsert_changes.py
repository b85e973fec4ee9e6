"""What one attempt of an upsert commit adds and removes, decided on the table it builds
on (blocking; run in the flush's thread, inside the commit engine's attempt).

With the key index (`position_changes`):

- The older rows of the keys the commit changes are deleted by position, in delete
  files that each name one data file: a new one per commit while a file has fewer than
  ``DELTAS``, then all of them merged into one (the snapshot removes the others). A
  reader applies at most ``DELTAS`` delete files to a data file (Spark packs a file
  with few delete files into a read task with others), and a commit rewrites a file's
  deleted positions only every ``DELTAS`` commits touching it.
- The commit's new rows of a partition go at the end of the writer's last small data
  file there (its "tail", under ``TAIL_BYTES``): a copy of it with the new rows after
  its own, in its place, so its rows keep their positions (its delete file, merged as
  above, moves to the copy, and the key index takes it by renaming the file). A table
  fed every second keeps one small file per partition and writer, not one per commit.
  A tail more than half dead is copied with its live rows only (the key index renumbers
  them): a tail never holds more dead rows than live ones.
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

__all__ = [
    "DELTAS",
    "TAIL_BYTES",
    "Detail",
    "Plan",
    "Tails",
    "equality_changes",
    "position_changes",
]

#: A tail of at most this many bytes on disk is extended by the next commit; a larger
#: one is kept as it is (the cost of a commit stays bounded by it).
TAIL_BYTES: Final = 4 * 2**20
#: Delete files a data file may have naming it alone before a commit merges them.
DELTAS: Final = 4
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
    once it landed, the writer's tails after it, which encoded files it commits, and
    the positions each delete file it writes deletes (by the delete file's path)."""

    change: Change
    tails: Tails
    used: frozenset[str]
    positions: Mapping[str, np.ndarray]


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
    table: Table,
    plan: Plan,
    attempt: int,
    index: KeyIndex,
    tails: Mapping[Part, str],
    known: Mapping[str, np.ndarray],
) -> AttemptChanges:
    """The attempt's changes with ``index`` synced to ``table`` (module doc). ``known``:
    the positions of delete files the writer wrote itself (not read again)."""
    located = index.locate(plan.values)
    written: list[DataFile] = []
    try:
        return _position_changes(table, plan, attempt, index, located, tails, known, written)
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
    known: Mapping[str, np.ndarray],
    written: list[DataFile],
) -> AttemptChanges:
    parts = _by_part(plan.written)
    candidates = {part: tails[part] for part in parts if part in tails}
    scoped = _scoped(table, index, [*located.positions, *candidates.values()], known)
    extending = {
        part: path for part, path in candidates.items() if _extendable(index, path, scoped)
    }
    # Rows each data file loses. A file with fewer than DELTAS delete files naming it
    # alone gets one more with the new positions; at DELTAS they are merged into one
    # (all of them replaced), and a tail's always are, moved to its copy at the same
    # positions: a reader applies at most DELTAS delete files to a file, and a commit
    # rewrites a file's deleted positions only every DELTAS commits touching it.
    touched = {*located.positions, *extending.values()}
    merging = {p for p in touched if p in extending.values() or len(scoped[p][1]) >= DELTAS}
    dead = {
        path: _union(scoped[path][0], located.positions.get(path, _NONE))
        if path in merging
        else located.positions[path]
        for path in touched
    }
    files = {path: located.files.get(path) or index.data_file(path) for path in touched}
    removed = [d.file for path in merging for d in scoped[path][1]]
    dropped = [d.path for path in merging for d in scoped[path][1]]
    added: list[DataFile] = []
    new_files: list[NewFile] = []
    extended: dict[str, NewFile] = {}
    compacted: dict[str, NewFile] = {}
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
        gone = dead.pop(path)
        # Mostly dead: its live rows only (renumbered in the index), else all of them.
        keep = (
            _complement(gone, old.file.record_count)
            if 2 * len(gone) > old.file.record_count
            else None
        )
        copy, keys = _extend_tail(table, plan, attempt, old, encoded, keep)
        written.append(copy.file)
        added.append(copy.file)
        removed.append(old.file)
        (extended if keep is None else compacted)[path] = NewFile(copy.file, old.spec_id, keys)
        next_tails[part] = copy.file
        if keep is None:
            dead[copy.file.file_path] = gone
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
    change = Change(located, new_files, extended, (), deletes, dropped, compacted)
    tails_after = {part: f for part, f in next_tails.items() if f.file_size_in_bytes < TAIL_BYTES}
    positions = {deletes[path].file_path: dead[path] for path in deletes}
    detail = Detail(change, tails_after, frozenset(used), positions)
    return AttemptChanges(added, removed, list(written), detail)


def _scoped(
    table: Table, index: KeyIndex, paths: Sequence[str], known: Mapping[str, np.ndarray]
) -> dict[str, tuple[np.ndarray, list[LiveDelete]]]:
    """For each data file: the positions its file-scoped delete files delete, and them."""
    out: dict[str, tuple[np.ndarray, list[LiveDelete]]] = {}
    for path in paths:
        deletes = index.scoped_deletes(path)
        named = [
            known[d.path]
            if d.path in known
            else read_positions(table.io, d.file, [path]).get(path, _NONE)
            for d in deletes
        ]
        out[path] = (_union(*named), deletes)
    return out


def _union(*positions: np.ndarray) -> np.ndarray:
    """The sorted union of position arrays (a mask over their range: linear, where a
    hashed set union of hundreds of thousands of positions took a tenth of a second)."""
    present = [p for p in positions if len(p)]
    if not present:
        return _NONE
    if len(present) == 1:
        return np.unique(present[0]) if not _sorted_unique(present[0]) else present[0]
    mask = np.zeros(
        max(int(p[-1]) if _sorted_unique(p) else int(p.max()) for p in present) + 1, dtype=bool
    )
    for p in present:
        mask[p] = True
    return np.flatnonzero(mask).astype(np.int64)


def _complement(positions: np.ndarray, count: int) -> np.ndarray:
    """The positions below ``count`` not in ``positions``, sorted."""
    mask = np.ones(count, dtype=bool)
    mask[positions] = False
    return np.flatnonzero(mask).astype(np.int64)


def _sorted_unique(positions: np.ndarray) -> bool:
    return bool(len(positions) < 2 or np.all(positions[1:] > positions[:-1]))


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
    table: Table,
    plan: Plan,
    attempt: int,
    tail: LiveData,
    encoded: Sequence[EncodedFile],
    keep: np.ndarray | None,
) -> tuple[EncodedFile, list[KeyValue]]:
    """A copy of ``tail`` (of its rows at ``keep`` only, in order, when given) with the
    commit's new rows of its partition after them (one file: all of its rows keep their
    positions), and the keys of the rows it adds."""
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
    if keep is not None:
        old = old.take(pa.array(keep))
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
