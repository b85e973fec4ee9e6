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
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.schema import Schema
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.table.sorting import NullOrder, SortDirection, SortOrder
from pyiceberg.table.update import ValidatableTableRequirement
from pyiceberg.typedef import Record

from icespool.cdc import LiveDelete, applies, droppable, live_files
from icespool.cdc._merge import apply_equality_deletes
from icespool.errors import CommitError, IcespoolError
from icespool.iceberg._commit import (
    CommitOutcomeUnknownError,
    ReplaceConflictError,
    commit_replace,
)
from icespool.iceberg._parquet import (
    _remove_quietly,
    encode_data_files,
    partition_transform,
)
from icespool.iceberg._properties import write_int_property
from icespool.maintenance._orphans import (
    COMPACTION_PREFIX,
    compaction_file_prefix,
    is_daemon_file,
    new_file_id,
)
from icespool.retry import CONFLICTS, Backoff
from icespool.schema import arrow_schema_for, conform

__all__ = [
    "COMPACTION_SUMMARY_KEY",
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

_log = logging.getLogger("icespool.maintenance.compact")

#: Snapshot summary key of a compaction's replace snapshot: the plan's id.
COMPACTION_SUMMARY_KEY: Final = "icespool.compaction"
#: Files under this fraction of the target size are small (Iceberg's and Spark's default).
DEFAULT_SMALL_FILE_FRACTION: Final = 0.75
#: Input files per run: bounds the plan's memory and the replace commit's manifests.
DEFAULT_MAX_FILES: Final = 10_000
#: Delete files that must apply to a file that is not small before it is rewritten.
DEFAULT_DELETE_FILE_THRESHOLD: Final = 1
_ROW_LINEAGE_FORMAT: Final = 3
_DIRTY: Final = -1  # the group of a partition's files that deletes apply to
_SORT_ORDER_ID_POSITION: Final = 15  # DataFile.sort_order_id reads _data[15]
_POSITION_PATH: Final = "file_path"  # a position delete file's columns
_POSITION_POS: Final = "pos"
_SEQUENCE: Final = "_icespool_delete_seq"


class CompactionError(IcespoolError):
    """A compaction could not be done; nothing was committed."""


class CompactionConflictError(CompactionError):
    """The plan no longer matches the table (inputs gone, partition spec changed):
    another writer got there first. Nothing was committed or left behind."""


# ---------------------------------------------------------------- the I/O budget


class IoBudget:
    """Bytes per second (reads plus writes) shared by everything maintenance does.

    A token bucket that may go into debt: ``acquire(n)`` takes ``n`` bytes and sleeps
    until the bucket is back out of debt, so a request bigger than the bucket still
    passes and the long-run rate never exceeds ``bytes_per_second`` (plus one
    ``burst_seconds`` of credit at the start). Thread-safe: concurrent callers queue
    behind each other's debt. ``None`` means unlimited (still counts bytes).
    ``close()`` (at shutdown) wakes every waiter: waiting and later calls raise
    ``CompactionError``, so a rewrite in a thread stops (and cleans up) at once
    instead of holding the process's exit for the rest of its budget.
    """

    def __init__(self, bytes_per_second: float | None, *, burst_seconds: float = 1.0) -> None:
        if bytes_per_second is not None and bytes_per_second <= 0:
            raise ValueError(f"bytes_per_second must be positive, got {bytes_per_second}")
        if burst_seconds <= 0:
            raise ValueError(f"burst_seconds must be positive, got {burst_seconds}")
        self._rate = bytes_per_second
        self._capacity = (bytes_per_second or 0) * burst_seconds
        self._tokens = self._capacity
        self._stamp = time.monotonic()
        self._used = 0
        self._lock = threading.Lock()
        self._closed = threading.Event()

    @property
    def bytes_per_second(self) -> float | None:
        return self._rate

    @property
    def used(self) -> int:
        """Bytes acquired so far (for metrics and tests)."""
        return self._used

    def close(self) -> None:
        """Refuse every request from now on and wake the waiting ones (shutdown)."""
        self._closed.set()

    def acquire(self, nbytes: int, *, deadline: float | None = None) -> float:
        """Take ``nbytes``; return the seconds slept. With ``deadline`` (a
        ``time.monotonic()`` value) a wait that would end past it takes nothing and
        raises TimeoutError instead."""
        if self._closed.is_set():
            raise CompactionError("the I/O budget is closed (maintenance is stopping)")
        if nbytes <= 0:
            return 0.0
        with self._lock:
            if self._rate is None:
                self._used += nbytes
                return 0.0
            now = time.monotonic()
            self._tokens = min(self._capacity, self._tokens + (now - self._stamp) * self._rate)
            self._stamp = now
            wait = max(0.0, (nbytes - self._tokens) / self._rate)
            if deadline is not None and now + wait > deadline:
                raise TimeoutError(
                    f"the I/O budget ({self._rate:.0f} bytes/s) cannot pass {nbytes} bytes "
                    "before the run's deadline"
                )
            self._tokens -= nbytes
            self._used += nbytes
        if wait and self._closed.wait(wait):
            raise CompactionError("the I/O budget was closed (maintenance is stopping)")
        return wait


# ---------------------------------------------------------------- the plan


@dataclass(frozen=True)
class CompactionBin:
    """Files of one partition, rewritten together into files named after ``file_id``:
    small files, and files that delete files apply to. ``sequences`` are the files'
    data sequence numbers, ``deletes`` the live delete files that apply to any of them
    (applied by the rewrite, each to the files Iceberg's rules scope it to)."""

    file_id: str
    partition: Record
    files: tuple[DataFile, ...]
    sequences: tuple[int, ...] = ()
    deletes: tuple[LiveDelete, ...] = ()

    @property
    def bytes(self) -> int:
        return sum(data_file.file_size_in_bytes for data_file in self.files)

    @property
    def payload(self) -> int:
        return sum(payload_bytes(data_file) for data_file in self.files)

    @property
    def records(self) -> int:
        return sum(data_file.record_count for data_file in self.files)


@dataclass(frozen=True)
class CompactionPlan:
    """What one run rewrites: bins per partition of spec ``spec_id``, planned on
    ``main``'s snapshot ``snapshot_id`` of sequence number ``sequence_number``;
    committed as ONE replace snapshot whose new files carry that data sequence number
    (so equality deletes committed after the planned snapshot still apply to them),
    removing the inputs and the delete files nothing live needs any more (``drops``
    as planned; the commit decides again on the refreshed table)."""

    plan_id: str
    snapshot_id: int
    spec_id: int
    target_file_size: int
    bins: tuple[CompactionBin, ...]
    sequence_number: int = 0
    drops: tuple[LiveDelete, ...] = ()
    files: tuple[DataFile, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "files", tuple(f for b in self.bins for f in b.files))

    @property
    def applies_deletes(self) -> bool:
        """Whether the rewrite removes rows (delete files apply to its inputs)."""
        return any(b.deletes for b in self.bins)

    @property
    def known_deletes(self) -> frozenset[str]:
        """Paths of every delete file the plan saw applying to its inputs or dropped."""
        return frozenset(
            {d.path for b in self.bins for d in b.deletes} | {d.path for d in self.drops}
        )

    @property
    def bytes(self) -> int:
        return sum(b.bytes for b in self.bins)

    @property
    def records(self) -> int:
        return sum(b.records for b in self.bins)

    @property
    def partitions(self) -> int:
        return len({b.partition for b in self.bins})

    @property
    def file_ids(self) -> frozenset[str]:
        """The ids in the output names: while the plan runs, the orphan sweep's
        ``is_spooled`` should answer true for them."""
        return frozenset(b.file_id for b in self.bins)


def payload_bytes(data_file: DataFile) -> int:
    """The compressed column bytes of a data file (its manifest's ``column_sizes``).

    What a merged file will need, unlike the file size: a file of a few rows is mostly
    footer and statistics (10 rows of 3 columns: 1.7 KB on disk, 0.3 KB of data), so
    bins sized by file size would come out many times under the target.
    """
    sizes = data_file.column_sizes
    return sum(sizes.values()) if sizes else data_file.file_size_in_bytes


def _tier(path: str) -> int:
    return 1 if path.rsplit("/", 1)[-1].startswith(COMPACTION_PREFIX) else 0


def plan_compaction(
    table: Table,
    *,
    target_file_size: int,
    min_input_files: int = 5,
    max_bytes: int,
    max_files: int = DEFAULT_MAX_FILES,
    own_file: Callable[[str], bool] = is_daemon_file,
    small_file_fraction: float = DEFAULT_SMALL_FILE_FRACTION,
    delete_file_threshold: int = DEFAULT_DELETE_FILE_THRESHOLD,
    rewrite_foreign: bool = True,
) -> list[CompactionPlan]:
    """The compaction worth doing on ``table`` as loaded (refresh it first): at most one plan.

    ``target_file_size`` is the daemon's setting; the table's
    ``write.target-file-size-bytes`` wins, as it does for the encoder.

    Two kinds of partitions, those with deletes first:

    - a partition where delete files (equality or position, the partition's own or
      global ones) apply to files: its small daemon files and every file with at least
      ``delete_file_threshold`` delete files applying (Spark's option of the same name)
      are rewritten with the deletes applied, whatever their number. Files of other
      writers (Spark's rewrite outputs) count too, with ``rewrite_foreign``, when they
      are at most twice the target size (bigger ones are left to Spark's
      ``rewrite_data_files``, which splits them): left alone, every later equality
      delete of their partition would apply to them and stay for ever;
    - otherwise, as before: ``min_input_files`` small files of one tier at least.

    A bin holds at most the target size of compressed column data (``payload_bytes``)
    and so makes one output file (a bin of one file only when deletes apply to it);
    ``max_bytes`` bounds the bytes read (input files, and the delete files a
    partition's rewrite reads) and ``max_files`` the input files (the plan's memory and
    the size of the commit, whose manifests list every replaced file). Bins follow
    commit order (sequence number, then path), so a bin holds rows that arrived
    together: tight column bounds for readers' pruning. Partitions with the most files
    to rewrite come first when ``max_bytes`` cannot take them all.

    The plan also lists the delete files that would apply to no live data file once
    its inputs are replaced (``drops``, among those of sequence number <= the planned
    snapshot's); a plan may hold only drops (delete files that apply to nothing).

    Format v3 tables are left alone: their rows carry lineage ids (``_row_id``) that a
    rewrite must keep, which this rewrite cannot (pyiceberg 0.12 cannot write v3 at all
    yet; the guard keeps a later pyiceberg from turning this on silently).
    """
    if target_file_size <= 0:
        raise ValueError(f"target_file_size must be positive, got {target_file_size}")
    if min_input_files < 2:
        raise ValueError(f"min_input_files must be at least 2, got {min_input_files}")
    if max_bytes <= 0:
        raise ValueError(f"max_bytes must be positive, got {max_bytes}")
    if max_files < 2:
        raise ValueError(f"max_files must be at least 2, got {max_files}")
    if not 0 < small_file_fraction <= 1:
        raise ValueError(f"small_file_fraction must be in (0, 1], got {small_file_fraction}")
    if delete_file_threshold < 1:
        raise ValueError(f"delete_file_threshold must be at least 1, got {delete_file_threshold}")
    metadata = table.metadata
    snapshot = metadata.snapshot_by_name(MAIN_BRANCH)
    if snapshot is None or metadata.format_version >= _ROW_LINEAGE_FORMAT:
        return []
    target = write_int_property(
        metadata.properties, TableProperties.WRITE_TARGET_FILE_SIZE_BYTES, target_file_size
    )
    spec_id = metadata.default_spec_id
    small = small_file_fraction * target
    live = live_files(table.io, metadata, snapshot)
    sequence = snapshot.sequence_number or 0
    # (partition, tier) -> small files; partition -> files deletes apply to (tier -1).
    groups: dict[tuple[Record, int], list[_Candidate]] = defaultdict(list)
    for data in live.data.values():
        data_file = data.file
        if (
            data.spec_id != spec_id
            or data_file.content != DataFileContent.DATA
            or data_file.file_format != FileFormat.PARQUET
        ):
            continue
        deletes = tuple(live.deletes_for(data)) if live.deletes else ()
        if not own_file(data_file.file_path) and not (
            # Another writer's file (Spark's rewrite outputs) that deletes apply to: left
            # alone, every later equality delete of its partition would stay for ever.
            deletes and rewrite_foreign and payload_bytes(data_file) <= 2 * target
        ):
            continue
        is_small = data_file.file_size_in_bytes < small
        if not is_small and len(deletes) < delete_file_threshold:
            continue
        tier = _DIRTY if deletes else _tier(data_file.file_path)
        groups[(data_file.partition, tier)].append(
            _Candidate(data.sequence_number, data_file.file_path, data_file, deletes)
        )
    # A partition with deletes to apply rewrites its small clean files with them.
    for partition, tier in list(groups):
        if tier != _DIRTY and (partition, _DIRTY) in groups:
            groups[(partition, _DIRTY)] += groups.pop((partition, tier))

    eligible = [
        (key, sorted(items, key=lambda c: (c.sequence, c.path)))
        for key, items in groups.items()
        if key[1] == _DIRTY or len(items) >= min_input_files
    ]
    eligible.sort(
        key=lambda group: (
            group[0][1] != _DIRTY,
            -len(group[1]),
            group[1][0].sequence,
            group[1][0].path,
        )
    )
    bins: list[CompactionBin] = []
    room = max_bytes - live.paths_read
    files_left = max_files
    for (partition, tier), items in eligible:
        if room <= 0 or files_left <= 0:
            break
        dirty = tier == _DIRTY
        if dirty:
            # The partition's delete files are read by every bin of it: charged once.
            delete_bytes = sum(
                d.file.file_size_in_bytes
                for d in {d.path: d for c in items for d in c.deletes}.values()
            )
            if delete_bytes > room:
                continue
            room -= delete_bytes
        chunks: list[list[_Candidate]] = [[]]
        size = 0
        for candidate in items:
            length = candidate.file.file_size_in_bytes
            if length > room or files_left == 0:
                break
            payload = payload_bytes(candidate.file)
            if chunks[-1] and size + payload > target:
                chunks.append([])
                size = 0
            chunks[-1].append(candidate)
            size += payload
            room -= length
            files_left -= 1
        for chunk in chunks:
            # A bin of one clean file would only copy it.
            if len(chunk) >= 2 or (chunk and chunk[0].deletes):
                bins.append(_bin(partition, chunk))
            else:
                room += sum(c.file.file_size_in_bytes for c in chunk)
                files_left += len(chunk)
    removed = {data_file.file_path for piece in bins for data_file in piece.files}
    drops = tuple(d for d in droppable(live, removed) if d.sequence_number <= sequence)
    if not bins and not drops:
        return []
    return [
        CompactionPlan(
            plan_id=new_file_id(),
            snapshot_id=snapshot.snapshot_id,
            spec_id=spec_id,
            target_file_size=target,
            bins=tuple(bins),
            sequence_number=sequence,
            drops=drops,
        )
    ]


@dataclass(frozen=True)
class _Candidate:
    sequence: int
    path: str
    file: DataFile
    deletes: tuple[LiveDelete, ...]


def _bin(partition: Record, chunk: list[_Candidate]) -> CompactionBin:
    deletes = {d.path: d for c in chunk for d in c.deletes}
    return CompactionBin(
        new_file_id(),
        partition,
        tuple(c.file for c in chunk),
        sequences=tuple(c.sequence for c in chunk),
        deletes=tuple(deletes.values()),
    )


# ---------------------------------------------------------------- the rewrite


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
) -> list[pa.RecordBatch] | None:
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
    return ordered


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
            rows = self.read(delete)
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
) -> tuple[list[pa.RecordBatch], int]:
    """The bin's rows with its delete files applied, each to the files Iceberg's rules
    scope it to (``_deletes.applies``: per file, by its data sequence number); and the
    number of rows read. Whole-file pyarrow: position masks, then equality deletes
    as one anti-join per file and key (``icespool.cdc.apply_equality_deletes``)."""
    metadata = table.metadata
    schema = metadata.schema()
    spec_id = metadata.default_spec_id
    target = arrow_schema_for(schema)
    reader.for_partition(piece.partition)
    pieces: list[pa.Table] = []
    read = 0
    for data_file, sequence in zip(piece.files, piece.sequences, strict=True):
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError("compaction rewrite passed its deadline")
        data = _read_conformed(table, data_file, budget, deadline, target)
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
        pieces.append(data)
    merged = pa.concat_tables(pieces) if pieces else target.empty_table()
    return merged.to_batches(), read


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
) -> list[DataFile]:
    batches: list[pa.RecordBatch] = []
    if piece.deletes:
        batches, read = _merged_bin(table, piece, reader, budget=budget, deadline=deadline)
    else:
        for data_file in piece.files:
            # Per file: thousands of small files slow to open take time the budget never sees.
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError("compaction rewrite passed its deadline")
            budget.acquire(data_file.file_size_in_bytes, deadline=deadline)
            try:
                batches += _read(table.io, data_file)
            except FileNotFoundError as exc:
                raise _gone(table, data_file.file_path, exc) from exc
        read = sum(batch.num_rows for batch in batches)
    if read != piece.records:
        raise CompactionError(
            f"table {'.'.join(table.name())}: bin {piece.file_id} read {read} rows, its "
            f"manifest entries count {piece.records}; not rewritten"
        )
    expected = sum(batch.num_rows for batch in batches)
    if not expected:
        return []  # every row deleted: the inputs go, nothing replaces them
    metadata = table.metadata
    order = metadata.sort_order()
    sorted_batches = None if order.is_unsorted else _sorted(batches, metadata.schema(), order)
    # The write, charged before it happens at the input's payload (close to the output).
    budget.acquire(piece.payload, deadline=deadline)
    written = encode_data_files(
        table,
        batches if sorted_batches is None else sorted_batches,
        target_file_size=plan.target_file_size,
        row_group_records=row_group_records,
        compression=compression,
        file_prefix=compaction_file_prefix(piece.file_id, incarnation),
    )
    try:
        extra = sum(f.file_size_in_bytes for f in written) - piece.payload
        if extra > 0:
            budget.acquire(extra)  # no deadline: the bytes are written already
        if sorted_batches is not None:
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
    return written


def rewrite(
    table: Table,
    plan: CompactionPlan,
    *,
    budget: IoBudget,
    row_group_records: int,
    compression: str,
    incarnation: str,
    deadline: float | None = None,
) -> list[DataFile]:
    """Write the plan's bins as new data files (not committed) and return them.

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
    reader = _DeleteReader(table, budget, deadline)
    try:
        for piece in plan.bins:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError("compaction rewrite passed its deadline")
            written += _rewrite_bin(
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
    except BaseException:
        _remove_quietly(table.io, [f.file_path for f in written])
        raise
    return written


# ---------------------------------------------------------------- the commit


@dataclass(frozen=True)
class CompactionResult:
    """``committed``: ONE replace snapshot swapped ``files_replaced`` files for
    ``files_added``. ``conflict``: another writer changed the inputs; nothing was
    committed and the new files were deleted (``detail`` says what happened)."""

    outcome: Literal["committed", "conflict"]
    snapshot_id: int | None
    files_replaced: int
    files_added: int
    bytes_replaced: int
    bytes_added: int
    records: int
    attempts: int = 1
    detail: str = ""
    delete_files_removed: int = 0  # delete files nothing live needed any more
    rows_removed: int = 0  # rows the applied deletes removed


def _validator(plan: CompactionPlan) -> Callable[[Table], list[DataFile]]:
    """The commit-time check of a plan against the refreshed table; returns the delete
    files the replace removes too (those nothing live needs once the inputs are gone)."""
    known = plan.known_deletes
    positions = {
        d.path: d.paths for b in plan.bins for d in (*b.deletes, *plan.drops) if not d.is_equality
    }
    inputs = {data_file.file_path for data_file in plan.files}

    def check(table: Table) -> list[DataFile]:
        name = ".".join(table.name())
        metadata = table.metadata
        if metadata.default_spec_id != plan.spec_id:
            raise ReplaceConflictError(f"table {name}: the partition spec changed since planning")
        snapshot = metadata.snapshot_by_name(MAIN_BRANCH)
        if snapshot is None:
            raise ReplaceConflictError(f"table {name}: main has no snapshot any more")
        live = live_files(table.io, metadata, snapshot, known_paths=positions)
        missing = sorted(inputs.difference(live.data))
        if missing:
            shown = ", ".join(missing[:3]) + (" ..." if len(missing) > 3 else "")
            raise ReplaceConflictError(
                f"table {name}: {len(missing)} file(s) to replace are no longer live in main "
                f"(removed by another writer's rewrite or delete): {shown}"
            )
        for delete in live.deletes:
            if delete.path in known:
                continue  # applied by the rewrite, or applying to nothing
            if delete.is_equality and delete.sequence_number > plan.sequence_number:
                continue  # applies to the new files (older data sequence number) as well
            if delete.is_equality:
                hit = any(
                    applies(delete, data.file, data.sequence_number, data.spec_id)
                    for data in (live.data[path] for path in inputs)
                )
            else:
                hit = not delete.paths.isdisjoint(inputs)
            if hit:
                raise ReplaceConflictError(
                    f"table {name}: delete file {delete.path} (sequence number "
                    f"{delete.sequence_number}) was added since planning and applies to "
                    "files being replaced"
                )
        return [
            d.file for d in droppable(live, inputs) if d.sequence_number <= plan.sequence_number
        ]

    return check


def commit_rewrite(
    table: Table,
    plan: CompactionPlan,
    new_files: Sequence[DataFile],
    *,
    retry: Backoff = CONFLICTS,
    requirements: Sequence[ValidatableTableRequirement] = (),
) -> CompactionResult:
    """Commit ``new_files`` in place of the plan's inputs as one ``replace`` snapshot.

    Run it in the table's lane, with the maintenance lease in ``requirements`` (a
    replica that lost the lease commits nothing: ``CommitError``, new files
    deleted). Every attempt refreshes the table and validates it (every input still
    live in main, no delete file applying to them, the same partition spec); a
    concurrent append is retried through, a rewrite or delete of the inputs by
    another writer gives up: ``conflict``, new files deleted. Other failures raise
    after deleting the new files, except an unknown outcome
    (``CommitOutcomeUnknownError``): the snapshot may reference them, so they stay
    for the orphan sweep, which removes them only if nothing references them.
    """
    name = ".".join(table.name())
    paths = [data_file.file_path for data_file in new_files]
    records = sum(data_file.record_count for data_file in new_files)
    # Deletes applied: fewer rows (the rewrite checked each bin's count against its
    # deletes); none applied: exactly the inputs' rows.
    if records > plan.records or (records != plan.records and not plan.applies_deletes):
        _remove_quietly(table.io, paths)
        raise CompactionError(
            f"table {name}: the new files hold {records} rows, the plan's inputs "
            f"{plan.records}; nothing committed"
        )
    try:
        result = commit_replace(
            table,
            deleted=plan.files,
            added=new_files,
            summary={COMPACTION_SUMMARY_KEY: plan.plan_id},
            retry=retry,
            requirements=requirements,
            data_sequence_number=plan.sequence_number,
            check=_validator(plan),
        )
    except ReplaceConflictError as exc:
        _remove_quietly(table.io, paths)
        _log.info("table %s: compaction %s given up: %s", name, plan.plan_id, exc)
        return CompactionResult(
            outcome="conflict",
            snapshot_id=None,
            files_replaced=0,
            files_added=0,
            bytes_replaced=0,
            bytes_added=0,
            records=0,
            detail=str(exc),
        )
    except CommitOutcomeUnknownError:
        raise
    except CommitError:
        _remove_quietly(table.io, paths)
        raise
    added = sum(data_file.file_size_in_bytes for data_file in new_files)
    snapshot = table.metadata.snapshot_by_id(result.snapshot_id)
    summary = snapshot.summary if snapshot is not None else None
    dropped = int((summary.get("removed-delete-files") if summary is not None else None) or 0)
    _log.info(
        "table %s: compacted %d files (%d bytes) into %d (%d bytes) in %d partition(s), "
        "%d rows deleted, %d delete files removed, snapshot %d",
        name,
        len(plan.files),
        plan.bytes,
        len(new_files),
        added,
        plan.partitions,
        plan.records - records,
        dropped,
        result.snapshot_id,
    )
    return CompactionResult(
        outcome="committed",
        snapshot_id=result.snapshot_id,
        files_replaced=len(plan.files),
        files_added=len(new_files),
        bytes_replaced=plan.bytes,
        bytes_added=added,
        records=records,
        attempts=result.attempts,
        delete_files_removed=dropped,
        rows_removed=plan.records - records,
    )
