"""Compaction's plan: which of the daemon's small files (and the files delete files
apply to) one run rewrites, in bins per partition (see ``_compact`` for the steps)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.typedef import Record

from icespool.cdc import LiveDelete, droppable, live_files
from icespool.errors import IcespoolError
from icespool.iceberg._properties import write_int_property
from icespool.maintenance._orphans import COMPACTION_PREFIX, is_daemon_file, new_file_id

__all__ = [
    "DEFAULT_DELETE_FILE_THRESHOLD",
    "DEFAULT_MAX_FILES",
    "DEFAULT_SMALL_FILE_FRACTION",
    "CompactionBin",
    "CompactionConflictError",
    "CompactionError",
    "CompactionPlan",
    "payload_bytes",
    "plan_compaction",
]

#: Files under this fraction of the target size are small (Iceberg's and Spark's default).
DEFAULT_SMALL_FILE_FRACTION: Final = 0.75
#: Input files per run: bounds the plan's memory and the replace commit's manifests.
DEFAULT_MAX_FILES: Final = 10_000
#: Delete files that must apply to a file that is not small before it is rewritten.
DEFAULT_DELETE_FILE_THRESHOLD: Final = 1
_ROW_LINEAGE_FORMAT: Final = 3
_DIRTY: Final = -1  # the group of a partition's files that deletes apply to


class CompactionError(IcespoolError):
    """A compaction could not be done; nothing was committed."""


class CompactionConflictError(CompactionError):
    """The plan no longer matches the table (inputs gone, partition spec changed):
    another writer got there first. Nothing was committed or left behind."""


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
