"""Compaction: bin-pack the small data files the daemon wrote, in ONE ``replace`` snapshot.

Three steps, so the scheduler can run each where it belongs:

- ``plan_compaction`` (any thread, reads manifests): the live data files of ``main``
  that are small (under ``small_file_fraction`` x the target size), daemon-written
  (``own_file``) and of the table's CURRENT partition spec (files of older specs are
  left alone: rewriting them means re-partitioning, which is Spark's job), grouped per
  partition, in bins of at most the target size, at most ``max_bytes`` in all.
- ``rewrite`` (a thread, outside the table's lane, under an ``IoBudget``): reads each
  bin's files with pyarrow through ``table.io`` and writes them again with
  ``encode_data_files``, the daemon's one Parquet writer (same codec, row groups,
  statistics and table write properties as a flush), sorted by the table's sort order
  if it has one. Output names are ``c-{uuid7}-{partition:05d}-{file:05d}.parquet``,
  the uuid7 fixed in the plan: a retried rewrite of a plan overwrites its own files,
  and the orphan sweep (``_orphans.py``) knows them.
- ``commit_rewrite`` (the table's lane, serialised with ingest commits): one
  ``replace`` snapshot through ``iceberg/_commit.commit_replace``, validated on every
  attempt against the refreshed table; another writer's rewrite or delete of the
  inputs ends it as ``conflict`` with the new files deleted and nothing committed.

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

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat, ManifestContent
from pyiceberg.schema import Schema
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.table.sorting import NullOrder, SortDirection, SortOrder
from pyiceberg.table.update import ValidatableTableRequirement
from pyiceberg.typedef import Record

from daemon.errors import CommitError, IcespoolError
from daemon.iceberg._commit import (
    CommitOutcomeUnknownError,
    ReplaceConflictError,
    commit_replace,
)
from daemon.iceberg._parquet import (
    _int_property,
    _remove_quietly,
    encode_data_files,
    partition_transform,
)
from daemon.maintenance._orphans import (
    COMPACTION_PREFIX,
    compaction_file_prefix,
    is_daemon_file,
    new_file_id,
)
from daemon.retry import CONFLICTS, Backoff
from daemon.schema import arrow_schema_for, conform

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
_ROW_LINEAGE_FORMAT: Final = 3
_SORT_ORDER_ID_POSITION: Final = 15  # DataFile.sort_order_id reads _data[15]


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
    """Small files of one partition, rewritten together into files named after ``file_id``."""

    file_id: str
    partition: Record
    files: tuple[DataFile, ...]

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
    ``main``'s snapshot ``snapshot_id``; committed as ONE replace snapshot."""

    plan_id: str
    snapshot_id: int
    spec_id: int
    target_file_size: int
    bins: tuple[CompactionBin, ...]
    files: tuple[DataFile, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "files", tuple(f for b in self.bins for f in b.files))

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
) -> list[CompactionPlan]:
    """The compaction worth doing on ``table`` as loaded (refresh it first): at most one plan.

    ``target_file_size`` is the daemon's setting; the table's
    ``write.target-file-size-bytes`` wins, as it does for the encoder. Partitions that
    delete files apply to are skipped (the rewrite reads files as they are on disk),
    and nothing is planned while a global (unpartitioned-spec) delete file is live.
    A bin holds at most the target size of compressed column data (``payload_bytes``)
    and so makes one output file; ``max_bytes`` bounds the input files' sizes (the
    I/O) and ``max_files`` the input files (the plan's memory and the size of the
    commit, whose manifests list every replaced file). Bins follow commit order
    (sequence number, then path), so a bin holds rows that arrived together: tight
    column bounds for readers' pruning. Partitions with the most small files come
    first when ``max_bytes`` cannot take them all.

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
    metadata = table.metadata
    snapshot = metadata.snapshot_by_name(MAIN_BRANCH)
    if snapshot is None or metadata.format_version >= _ROW_LINEAGE_FORMAT:
        return []
    target = _int_property(
        dict(metadata.properties), TableProperties.WRITE_TARGET_FILE_SIZE_BYTES, target_file_size
    )
    spec_id = metadata.default_spec_id
    specs = metadata.specs()
    small = small_file_fraction * target
    io = table.io
    blocked: set[Record] = set()
    groups: dict[tuple[Record, int], list[tuple[int, str, DataFile]]] = defaultdict(list)
    for manifest in snapshot.manifests(io):
        if manifest.content == ManifestContent.DELETES:
            entries = manifest.fetch_manifest_entry(io, discard_deleted=True)
            if entries and specs[manifest.partition_spec_id].is_unpartitioned():
                return []  # a global delete applies to every file
            if manifest.partition_spec_id == spec_id:
                blocked.update(entry.data_file.partition for entry in entries)
            continue
        if manifest.partition_spec_id != spec_id:
            continue
        for entry in manifest.fetch_manifest_entry(io, discard_deleted=True):
            data_file = entry.data_file
            if (
                data_file.content != DataFileContent.DATA
                or data_file.file_format != FileFormat.PARQUET
                or data_file.file_size_in_bytes >= small
                or not own_file(data_file.file_path)
            ):
                continue
            key = (data_file.partition, _tier(data_file.file_path))
            groups[key].append((entry.sequence_number or 0, data_file.file_path, data_file))

    eligible = [
        (key, sorted(items, key=lambda item: (item[0], item[1])))
        for key, items in groups.items()
        if key[0] not in blocked and len(items) >= min_input_files
    ]
    eligible.sort(key=lambda group: (-len(group[1]), group[1][0][0], group[1][0][1]))
    bins: list[CompactionBin] = []
    room = max_bytes
    files_left = max_files
    for (partition, _), items in eligible:
        chunks: list[list[DataFile]] = [[]]
        size = 0
        for _, _, data_file in items:
            length = data_file.file_size_in_bytes
            if length > room or files_left == 0:
                break
            payload = payload_bytes(data_file)
            if chunks[-1] and size + payload > target:
                chunks.append([])
                size = 0
            chunks[-1].append(data_file)
            size += payload
            room -= length
            files_left -= 1
        for chunk in chunks:
            if len(chunk) >= 2:  # a bin of one file would only copy it
                bins.append(CompactionBin(new_file_id(), partition, tuple(chunk)))
            else:
                room += sum(f.file_size_in_bytes for f in chunk)
                files_left += len(chunk)
        if room <= 0 or files_left <= 0:
            break
    if not bins:
        return []
    return [
        CompactionPlan(
            plan_id=new_file_id(),
            snapshot_id=snapshot.snapshot_id,
            spec_id=spec_id,
            target_file_size=target,
            bins=tuple(bins),
        )
    ]


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


def _rewrite_bin(
    table: Table,
    plan: CompactionPlan,
    piece: CompactionBin,
    *,
    budget: IoBudget,
    deadline: float | None,
    row_group_records: int,
    compression: str,
) -> list[DataFile]:
    batches: list[pa.RecordBatch] = []
    for data_file in piece.files:
        # Per file: thousands of small files slow to open take time the budget never sees.
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError("compaction rewrite passed its deadline")
        budget.acquire(data_file.file_size_in_bytes, deadline=deadline)
        try:
            batches += _read(table.io, data_file)
        except FileNotFoundError as exc:
            raise CompactionConflictError(
                f"table {'.'.join(table.name())}: input {data_file.file_path} is gone "
                "(another writer's rewrite and expiry removed it)"
            ) from exc
    read = sum(batch.num_rows for batch in batches)
    if read != piece.records:
        raise CompactionError(
            f"table {'.'.join(table.name())}: bin {piece.file_id} read {read} rows, its "
            f"manifest entries count {piece.records}; not rewritten"
        )
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
        file_prefix=compaction_file_prefix(piece.file_id),
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
        if out != piece.records:
            raise CompactionError(
                f"table {'.'.join(table.name())}: bin {piece.file_id} wrote {out} rows "
                f"of {piece.records}; not committed"
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
    if records != plan.records:
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
    _log.info(
        "table %s: compacted %d files (%d bytes) into %d (%d bytes) in %d partition(s), "
        "snapshot %d",
        name,
        len(plan.files),
        plan.bytes,
        len(new_files),
        added,
        plan.partitions,
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
    )
