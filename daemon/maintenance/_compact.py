"""Compaction: bin-pack the small data files the daemon wrote and apply the delete files
that apply to them, in ONE ``replace`` snapshot.

Three steps, so the scheduler can run each where it belongs:

- ``plan_compaction`` (any thread, reads manifests): the live data files of ``main``
  that are small (under ``small_file_fraction`` x the target size) or that delete
  files apply to, daemon-written (``own_file``) and of the table's CURRENT partition
  spec (files of older specs are left alone: rewriting them means re-partitioning,
  which is Spark's job), grouped per partition, in bins of at most the target size,
  at most ``max_bytes`` in all. Which delete file applies to which data file follows
  Iceberg's rules (``_deletes.py``).
- ``rewrite`` (a thread, outside the table's lane, under an ``IoBudget``): reads each
  bin's files with pyarrow through ``table.io``, applies the equality and position
  deletes that apply to each file (whole-file pyarrow, ``daemon/cdc/_merge.py``) and writes
  the rows left with ``encode_data_files``, the daemon's one Parquet writer (same
  codec, row groups, statistics and table write properties as a flush), sorted by the
  table's sort order if it has one. Output names are
  ``c-{uuid7}-{partition:05d}-{file:05d}.parquet``, the uuid7 fixed in the plan: a
  retried rewrite of a plan overwrites its own files, and the orphan sweep
  (``_orphans.py``) knows them.
- ``commit_rewrite`` (the table's lane, serialised with ingest commits): one
  ``replace`` snapshot through ``iceberg/_commit.commit_replace``, validated on every
  attempt against the refreshed table; another writer's rewrite or delete of the
  inputs ends it as ``conflict`` with the new files deleted and nothing committed.

Sequence numbers. Upsert commits keep adding equality deletes while a rewrite runs
(planning and rewriting happen outside the table's lane). The new files therefore
carry the data sequence number of the snapshot the plan read (Iceberg's
``use-starting-sequence-number``, what Spark's rewrites do): an equality delete
committed after it has a higher sequence number and still applies to the rewritten
rows, so it needs no conflict. What does conflict (checked at commit time on the
refreshed table): an input no longer live, and a position delete (or any delete the
plan did not see with a sequence number at most the plan's) naming or scoping an
input: the rewrite could not have applied it. The same commit removes every delete
file of sequence number at most the plan's that then applies to no live data file
(``_deletes.droppable``), so the number of delete files, and with it the read cost,
stays bounded by what arrived since the last run.

Why the inputs are read with pyarrow and not pyiceberg's scan: pyiceberg 0.12 reads a
null list or map of structs back as an empty one; compaction must keep every value.
The daemon's own files carry Parquet field ids, so ``conform`` (the spool replay's
rules) matches columns and nested fields renamed, added or dropped since by id.

Two tiers, to bound write amplification: flush files are merged with flush files and
compaction outputs with compaction outputs (each tier needs ``min_input_files`` small
files in a partition). Otherwise a partition that grows slowly would have its one
growing compacted file rewritten by every run (quadratic bytes); with tiers a byte is
rewritten about log_{min_input_files}(target / flush size) times.

Interface changes against the design file: ``plan_compaction`` returns at most ONE
plan (all partitions' bins; one snapshot per run, not one per partition: each
replace rewrites the manifests holding its inputs, so per-partition commits would
multiply that work and the snapshot count); it also takes ``max_files`` and
``small_file_fraction``, and ``own_file`` defaults to ``is_daemon_file``. The plan's
``file_ids`` are what the orphan sweep's ``is_spooled`` should hold while it runs.
``rewrite`` takes the writer settings (``row_group_records``, ``compression``, both
required) and a ``deadline``, and raises ``CompactionConflictError`` when inputs
vanished. ``commit_rewrite`` takes ``retry`` and ``requirements`` (the lease).
``IoBudget(bytes_per_second | None, burst_seconds=1.0)`` has ``close()`` for shutdown.
Everything here blocks. Use a Table instance of maintenance's own: commits refresh it
in place.

The modules: ``_compact_plan`` (the plan, and the errors every step raises),
``_budget`` (the ``IoBudget``), this one (the rewrite) and ``_compact_commit`` (the
commit); this module re-exports the names of all of them.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.sorting import NullOrder, SortDirection, SortOrder
from pyiceberg.typedef import Record

from icespool.cdc import LiveDelete, applies
from icespool.cdc._merge import apply_equality_deletes
from icespool.iceberg._parquet import (
    _remove_quietly,
    encode_data_files_with_rows,
    partition_transform,
)
from icespool.maintenance._budget import IoBudget
from icespool.maintenance._compact_commit import (
    COMPACTION_SUMMARY_KEY,
    CompactionResult,
    commit_rewrite,
)
from icespool.maintenance._compact_plan import (
    DEFAULT_DELETE_FILE_THRESHOLD,
    DEFAULT_MAX_FILES,
    DEFAULT_SMALL_FILE_FRACTION,
    CompactionBin,
    CompactionConflictError,
    CompactionError,
    CompactionPlan,
    payload_bytes,
    plan_compaction,
)
from icespool.maintenance._lineage import Lineage, Rewritten
from icespool.maintenance._orphans import compaction_file_prefix
from icespool.schema import arrow_schema_for, conform

__all__ = [
    "COMPACTION_SUMMARY_KEY",
    "DEFAULT_DELETE_FILE_THRESHOLD",
    "DEFAULT_MAX_FILES",
    "DEFAULT_SMALL_FILE_FRACTION",
    "CompactionBin",
    "CompactionConflictError",
    "CompactionError",
    "CompactionPlan",
    "CompactionResult",
    "IoBudget",
    "commit_rewrite",
    "payload_bytes",
    "plan_compaction",
    "rewrite",
]

_SORT_ORDER_ID_POSITION: Final = 15  # DataFile.sort_order_id reads _data[15]
_POSITION_PATH: Final = "file_path"  # a position delete file's columns
_POSITION_POS: Final = "pos"
_SEQUENCE: Final = "_icespool_delete_seq"
_ROW_POSITION: Final = "_icespool_row_position"


def _read(io: FileIO, data_file: DataFile) -> list[pa.RecordBatch]:
    with io.new_input(data_file.file_path).open() as stream:
        batches: list[pa.RecordBatch] = pq.read_table(stream).to_batches()
    return batches


def _sort_keys(
    data: pa.Table, schema: Schema, order: SortOrder
) -> list[tuple[str, pa.Array, str]] | None:
    """(name, values, direction) sort keys for ``order``, or None if it cannot be applied
    (a nested source column, a transform the encoder does not implement)."""
    keys: list[tuple[str, pa.Array, str]] = []
    for index, sort_field in enumerate(order.fields):
        name = schema.find_column_name(sort_field.source_id)
        if name is None or name not in data.column_names:
            return None
        try:
            values = partition_transform(
                sort_field.transform,
                schema.find_field(sort_field.source_id).field_type,
                data.column(name),
            )
        except ValueError:
            return None
        if isinstance(values, pa.ExtensionArray):
            values = values.storage
        # A null-flag key before each value: per-field null placement, which Arrow's
        # sort (one null placement for all keys) cannot express.
        nulls_first = sort_field.null_order == NullOrder.NULLS_FIRST
        flag = pc.is_valid(values) if nulls_first else pc.is_null(values)
        direction = "ascending" if sort_field.direction == SortDirection.ASC else "descending"
        keys += [(f"n{index}", flag, "ascending"), (f"v{index}", values, direction)]
    return keys


def _sorted(
    batches: list[pa.RecordBatch], schema: Schema, order: SortOrder
) -> tuple[list[pa.RecordBatch], np.ndarray] | None:
    target = arrow_schema_for(schema)
    data = pa.Table.from_batches(
        [conform(b, target, match_field_ids=True, drop_extra=True) for b in batches if b.num_rows],
        schema=target,
    )
    keys = _sort_keys(data, schema, order)
    if keys is None:
        return None
    frame = pa.table({name: values for name, values, _ in keys})
    indices = pc.sort_indices(frame, sort_keys=[(name, how) for name, _, how in keys])
    ordered: list[pa.RecordBatch] = data.take(indices).to_batches()
    return ordered, indices.to_numpy()


def _gone(table: Table, path: str, exc: FileNotFoundError) -> CompactionConflictError:
    return CompactionConflictError(
        f"table {'.'.join(table.name())}: {path} is gone "
        "(another writer's rewrite and expiry removed it)"
    )


class _DeleteReader:
    """Reads delete files for a rewrite, each once (cached until the partition changes:
    bins follow partitions, and a partition's bins share its delete files)."""

    def __init__(self, table: Table, budget: IoBudget, deadline: float | None) -> None:
        self._table = table
        self._budget = budget
        self._deadline = deadline
        self._partition: Record | None = None
        self._cache: dict[str, pa.Table] = {}
        self._newest: dict[tuple[tuple[int, ...], frozenset[str]], pa.Table] = {}

    def for_partition(self, partition: Record) -> None:
        if partition != self._partition:
            self._partition, self._cache, self._newest = partition, {}, {}

    def newest(self, ids: tuple[int, ...], deletes: list[LiveDelete]) -> pa.Table:
        """The keys (columns of field ``ids``) that ``deletes`` delete, once each, with
        the highest sequence number deleting it (``_SEQUENCE``): a file of data sequence
        number d loses the keys whose newest delete is above d, so each file joins
        against distinct keys instead of every delete file's rows."""
        wanted = (ids, frozenset(d.path for d in deletes))
        cached = self._newest.get(wanted)
        if cached is not None:
            return cached
        tables = []
        for delete in deletes:
            rows = _storage_columns(self.read(delete))
            sequence = pa.array(np.full(rows.num_rows, delete.sequence_number, dtype=np.int64))
            tables.append(rows.append_column(_SEQUENCE, sequence))
        keys = [c for c in tables[0].column_names if c != _SEQUENCE]
        newest = pa.concat_tables(tables).group_by(keys, use_threads=False)
        newest = newest.aggregate([(_SEQUENCE, "max")]).rename_columns([*keys, _SEQUENCE])
        self._newest[wanted] = newest
        return newest

    def read(self, delete: LiveDelete) -> pa.Table:
        cached = self._cache.get(delete.path)
        if cached is not None:
            return cached
        self._budget.acquire(delete.file.file_size_in_bytes, deadline=self._deadline)
        try:
            with self._table.io.new_input(delete.path).open() as stream:
                data = pq.read_table(stream)
        except FileNotFoundError as exc:
            raise _gone(self._table, delete.path, exc) from exc
        if delete.is_equality:
            data = self._equality_columns(delete, data)
        else:
            data = data.select([_POSITION_PATH, _POSITION_POS])
        self._cache[delete.path] = data
        return data

    def _equality_columns(self, delete: LiveDelete, data: pa.Table) -> pa.Table:
        schema = self._table.metadata.schema()
        ids = list(delete.file.equality_ids or ())
        try:
            fields = [schema.find_field(field_id) for field_id in ids]
        except ValueError as exc:
            raise CompactionError(
                f"table {'.'.join(self._table.name())}: equality delete {delete.path} names "
                f"field ids {ids}, not all in the current schema; not rewritten"
            ) from exc
        if not ids:
            raise CompactionError(
                f"table {'.'.join(self._table.name())}: equality delete {delete.path} has no "
                "equality field ids; not rewritten"
            )
        target = arrow_schema_for(Schema(*fields))
        batch = conform(data, target, match_field_ids=True, drop_extra=True)
        return pa.Table.from_batches([batch], schema=target)


def _storage_columns(rows: pa.Table) -> pa.Table:
    """``rows`` with extension-typed columns (uuid) as their storage: Arrow's hash
    kernels take no extension type, and the storage compares the same."""
    for index, field in enumerate(rows.schema):
        if isinstance(field.type, pa.BaseExtensionType):
            column = rows.column(index)
            storage = pa.chunked_array([c.storage for c in column.chunks], field.type.storage_type)
            rows = rows.set_column(index, field.with_type(field.type.storage_type), storage)
    return rows


def _read_conformed(
    table: Table, data_file: DataFile, budget: IoBudget, deadline: float | None, target: pa.Schema
) -> pa.Table:
    budget.acquire(data_file.file_size_in_bytes, deadline=deadline)
    try:
        batches = _read(table.io, data_file)
    except FileNotFoundError as exc:
        raise _gone(table, data_file.file_path, exc) from exc
    conformed = [
        conform(b, target, match_field_ids=True, drop_extra=True) for b in batches if b.num_rows
    ]
    return pa.Table.from_batches(conformed, schema=target)


def _position_mask(num_rows: int, positions: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Keep-mask of a file of ``num_rows`` rows after deleting row ``positions``
    (out-of-range positions are ignored, as Iceberg's readers do)."""
    keep = np.ones(num_rows, dtype=bool)
    if len(positions):
        values = np.asarray(positions.to_numpy(zero_copy_only=False), dtype=np.int64)
        keep[values[(values >= 0) & (values < num_rows)]] = False
    return pa.array(keep)


def _merged_bin(
    table: Table,
    piece: CompactionBin,
    reader: _DeleteReader,
    *,
    budget: IoBudget,
    deadline: float | None,
) -> tuple[list[pa.RecordBatch], int, list[np.ndarray]]:
    """The bin's rows with its delete files applied, each to the files Iceberg's rules
    scope it to (``_deletes.applies``: per file, by its data sequence number); the
    number of rows read; and, per input file, the positions of its rows that were kept.
    Whole-file pyarrow: position masks, then equality deletes as one anti-join per file
    and key (``icespool.cdc.apply_equality_deletes``)."""
    metadata = table.metadata
    schema = metadata.schema()
    spec_id = metadata.default_spec_id
    target = arrow_schema_for(schema)
    reader.for_partition(piece.partition)
    pieces: list[pa.Table] = []
    kept: list[np.ndarray] = []
    read = 0
    for data_file, sequence in zip(piece.files, piece.sequences, strict=True):
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError("compaction rewrite passed its deadline")
        data = _read_conformed(table, data_file, budget, deadline, target)
        # Row positions ride along through the filters (which keep row order).
        data = data.append_column(_ROW_POSITION, pa.array(np.arange(data.num_rows)))
        if data.num_rows != data_file.record_count:
            raise CompactionError(
                f"table {'.'.join(table.name())}: {data_file.file_path} holds {data.num_rows} "
                f"rows, its manifest entry counts {data_file.record_count}; not rewritten"
            )
        read += data.num_rows
        named = [
            reader.read(d)
            for d in piece.deletes
            if not d.is_equality and applies(d, data_file, sequence, spec_id)
        ]
        if named:
            rows = pa.concat_tables(named)
            mine = pc.equal(rows.column(_POSITION_PATH), data_file.file_path)
            data = data.filter(
                _position_mask(data.num_rows, pc.filter(rows.column(_POSITION_POS), mine))
            )
        by_key: dict[tuple[int, ...], list[LiveDelete]] = defaultdict(list)
        for delete in piece.deletes:  # the bin's: one newest-key table per bin and key
            if delete.is_equality:
                by_key[tuple(delete.file.equality_ids or ())].append(delete)
        for ids, group in by_key.items():
            if not any(d.sequence_number > sequence for d in group):
                continue
            newest = reader.newest(ids, group)
            # Scoping by partition is the bin's (one partition, or global deletes);
            # by sequence number here: deletes newer than this file's rows.
            keys = newest.filter(pc.greater(newest.column(_SEQUENCE), sequence))
            key = [schema.find_column_name(field_id) or "" for field_id in ids]
            data = apply_equality_deletes(data, keys.drop_columns([_SEQUENCE]), key)
        kept.append(data.column(_ROW_POSITION).to_numpy())
        pieces.append(data.drop_columns([_ROW_POSITION]))
    merged = pa.concat_tables(pieces) if pieces else target.empty_table()
    return merged.to_batches(), read, kept


def _rewrite_bin(
    table: Table,
    plan: CompactionPlan,
    piece: CompactionBin,
    *,
    budget: IoBudget,
    deadline: float | None,
    row_group_records: int,
    compression: str,
    incarnation: str,
    reader: _DeleteReader,
) -> tuple[list[DataFile], dict[str, tuple[np.ndarray, np.ndarray]]]:
    """The bin's new files, and for each the input (index in ``plan.files``) and
    position every row came from."""
    batches: list[pa.RecordBatch] = []
    if piece.deletes:
        batches, read, kept = _merged_bin(table, piece, reader, budget=budget, deadline=deadline)
    else:
        kept = []
        for data_file in piece.files:
            # Per file: thousands of small files slow to open take time the budget never sees.
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError("compaction rewrite passed its deadline")
            budget.acquire(data_file.file_size_in_bytes, deadline=deadline)
            try:
                read_batches = _read(table.io, data_file)
            except FileNotFoundError as exc:
                raise _gone(table, data_file.file_path, exc) from exc
            batches += read_batches
            kept.append(np.arange(sum(b.num_rows for b in read_batches), dtype=np.int64))
        read = sum(batch.num_rows for batch in batches)
    if read != piece.records:
        raise CompactionError(
            f"table {'.'.join(table.name())}: bin {piece.file_id} read {read} rows, its "
            f"manifest entries count {piece.records}; not rewritten"
        )
    expected = sum(batch.num_rows for batch in batches)
    if not expected:
        return [], {}  # every row deleted: the inputs go, nothing replaces them
    inputs = {data_file.file_path: number for number, data_file in enumerate(plan.files)}
    sources = np.concatenate(
        [
            np.full(len(k), inputs[f.file_path], dtype=np.int32)
            for f, k in zip(piece.files, kept, strict=True)
        ]
    )
    positions = np.concatenate(kept)
    metadata = table.metadata
    order = metadata.sort_order()
    ordered = None if order.is_unsorted else _sorted(batches, metadata.schema(), order)
    if ordered is not None:
        batches, permutation = ordered
        sources, positions = sources[permutation], positions[permutation]
    # The write, charged before it happens at the input's payload (close to the output).
    budget.acquire(piece.payload, deadline=deadline)
    encoded = encode_data_files_with_rows(
        table,
        batches,
        target_file_size=plan.target_file_size,
        row_group_records=row_group_records,
        compression=compression,
        file_prefix=compaction_file_prefix(piece.file_id, incarnation),
    )
    written = [e.file for e in encoded]
    try:
        extra = sum(f.file_size_in_bytes for f in written) - piece.payload
        if extra > 0:
            budget.acquire(extra)  # no deadline: the bytes are written already
        if ordered is not None:
            for data_file in written:
                # DataFile exposes sort_order_id read-only; its slot is position 15.
                data_file[_SORT_ORDER_ID_POSITION] = order.order_id
        out = sum(data_file.record_count for data_file in written)
        if out != expected:
            raise CompactionError(
                f"table {'.'.join(table.name())}: bin {piece.file_id} wrote {out} rows "
                f"of {expected}; not committed"
            )
    except BaseException:
        _remove_quietly(table.io, [f.file_path for f in written])
        raise
    rows = {}
    for e in encoded:
        taken = e.rows.to_numpy(zero_copy_only=False)
        rows[e.file.file_path] = (sources[taken], positions[taken])
    return written, rows


def rewrite(
    table: Table,
    plan: CompactionPlan,
    *,
    budget: IoBudget,
    row_group_records: int,
    compression: str,
    incarnation: str,
    deadline: float | None = None,
) -> Rewritten:
    """Write the plan's bins as new data files (not committed) and return them, with
    where each of their rows came from (`Lineage`).

    One bin in memory at a time (about the target size of compressed data). Reads and
    writes pass ``budget``; past ``deadline`` (``time.monotonic()``) it stops with
    TimeoutError. On any error every file written so far is deleted, nothing stays.
    ``row_group_records`` and ``compression`` are the table's writer settings (table
    write properties win, as for a flush).
    """
    if table.metadata.default_spec_id != plan.spec_id:
        raise CompactionConflictError(
            f"table {'.'.join(table.name())}: the partition spec changed since planning"
        )
    written: list[DataFile] = []
    lineage: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    reader = _DeleteReader(table, budget, deadline)
    try:
        for piece in plan.bins:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError("compaction rewrite passed its deadline")
            files, rows = _rewrite_bin(
                table,
                plan,
                piece,
                budget=budget,
                deadline=deadline,
                row_group_records=row_group_records,
                compression=compression,
                incarnation=incarnation,
                reader=reader,
            )
            written += files
            lineage.update(rows)
    except BaseException:
        _remove_quietly(table.io, [f.file_path for f in written])
        raise
    inputs = tuple(data_file.file_path for data_file in plan.files)
    return Rewritten(tuple(written), Lineage(inputs, lineage))
