"""Equality deletes turned into position deletes, without rewriting any data.

An upsert table's commits delete by position once its key index is ready; before that
(the index being built at start, or caught up after another writer rewrote much of the
table), and in tables another engine wrote (Flink's upsert mode), deletes are by
equality: every reader joins them against every older data file in their scope. This
finds, for each live equality delete, the rows it deletes (the rows of the data files
it applies to, by Iceberg's scoping rules, whose key it names), writes position-delete
files naming exactly those rows, and commits ONE ``replace`` snapshot that removes the
equality deletes and adds the position deletes: the table's rows are the same before
and after, and readers apply per-file positions instead of joins.

Safe beside other writers: the commit checks, on the refreshed table of every attempt,
that the equality deletes are still live and that every data file named is still live
(a rewrite of one by another writer or by compaction, say, fails the check and the
conversion waits for the next run). Appends meanwhile change nothing: an equality
delete never applies to rows added after it.

Reading is blocking and budgeted (the maintenance I/O budget); the commit runs in the
table's lane.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyiceberg.table.update import ValidatableTableRequirement

from icespool.cdc import LiveData, LiveDelete, Located, key_array, live_files, read_columns
from icespool.iceberg import (
    CommitResult,
    ReplaceConflictError,
    ReplaceExtra,
    commit_replace,
    encode_position_deletes,
)
from icespool.maintenance._budget import IoBudget

__all__ = ["Conversion", "commit_conversion", "plan_conversion", "write_conversion"]

#: The summary mark of a conversion's snapshot.
_SUMMARY = {"icespool.maintenance": "convert-equality-deletes"}


@dataclass(frozen=True)
class Conversion:
    """The equality deletes of one snapshot and the rows they delete."""

    equality: tuple[DataFile, ...]
    located: Located


def plan_conversion(
    table: Table, *, budget: IoBudget, deadline: float | None = None
) -> Conversion | None:
    """The rows every live equality delete of ``table`` (as loaded) deletes (None: it
    has none). Reads the key columns of the data files they apply to."""
    snapshot = table.metadata.current_snapshot()
    if snapshot is None:
        return None
    live = live_files(table.io, table.metadata, snapshot)
    equality = [d for d in live.deletes if d.is_equality]
    if not equality:
        return None
    keys: dict[str, pa.Array] = {}
    positions: dict[str, np.ndarray] = {}
    for path, data in live.data.items():
        applying = [d for d in live.deletes_for(data) if d.is_equality]
        if not applying:
            continue
        found = _deleted_rows(table, data, applying, keys, budget, deadline)
        if len(found):
            positions[path] = found
    located = Located(positions, {path: live.data[path] for path in positions})
    return Conversion(tuple(d.file for d in equality), located)


def _deleted_rows(
    table: Table,
    data: LiveData,
    deletes: Sequence[LiveDelete],
    keys: dict[str, pa.Array],
    budget: IoBudget,
    deadline: float | None,
) -> np.ndarray:
    """The positions of ``data``'s rows whose key one of ``deletes`` names."""
    by_columns: dict[tuple[int, ...], list[LiveDelete]] = defaultdict(list)
    for delete in deletes:
        by_columns[tuple(delete.file.equality_ids or ())].append(delete)
    hit = np.zeros(data.file.record_count, dtype=bool)
    for ids, group in by_columns.items():
        budget.acquire(data.file.file_size_in_bytes, deadline=deadline)
        values = key_array(read_columns(table.io, data.file.file_path, ids))
        for delete in group:
            if delete.path not in keys:
                budget.acquire(delete.file.file_size_in_bytes, deadline=deadline)
                keys[delete.path] = key_array(read_columns(table.io, delete.path, ids))
            named = pc.is_in(values, value_set=keys[delete.path])
            hit |= np.asarray(named.to_numpy(zero_copy_only=False), dtype=bool)
    return np.flatnonzero(hit).astype(np.int64)


def write_conversion(
    table: Table, conversion: Conversion, *, file_prefix: str, compression: str
) -> list[DataFile]:
    """The position-delete files of ``conversion`` (none when its equality deletes
    delete no live row: the commit then only removes them)."""
    if not conversion.located.rows:
        return []
    written = encode_position_deletes(
        table, conversion.located, file_prefix=file_prefix, compression=compression
    )
    return list(written.values())


def commit_conversion(
    table: Table,
    conversion: Conversion,
    files: Sequence[DataFile],
    *,
    requirements: Sequence[ValidatableTableRequirement] = (),
) -> CommitResult:
    """ONE ``replace`` snapshot: ``conversion``'s equality deletes out, ``files`` in.
    Raises `ReplaceConflictError` (nothing committed) when another writer removed one
    of the equality deletes or a data file named since the conversion was planned."""
    named = set(conversion.located.positions)

    def still_named(refreshed: Table) -> ReplaceExtra:
        snapshot = refreshed.metadata.current_snapshot()
        live = (
            live_files(refreshed.io, refreshed.metadata, snapshot) if snapshot is not None else None
        )
        gone = sorted(named - set(live.data)) if live is not None else sorted(named)
        if gone:
            raise ReplaceConflictError(
                f"table {'.'.join(refreshed.name())}: {len(gone)} data file(s) an equality "
                f"delete applied to were rewritten or removed since: {gone[:3]}"
            )
        return ReplaceExtra()

    return commit_replace(
        table,
        deleted=conversion.equality,
        added=files,
        summary=_SUMMARY,
        requirements=requirements,
        check=still_named,
    )
