"""Which delete files apply to which data files (Iceberg's scoping rules), for compaction
and the merged-state reader.

A snapshot's live files (`live_files`): every data file with its data sequence number,
every delete file with its sequence number and scope. The rules (Iceberg spec, "Scan
Planning"):

- an equality delete of sequence number N applies to data files of data sequence
  number < N in the same spec and partition, or to every data file when its spec is
  unpartitioned (a global delete);
- a position delete of sequence number N applies to the data files it names whose data
  sequence number is <= N (also partition-scoped, and naming a path suffices: paths
  are unique); a deletion vector (format v3) likewise names its one data file, and where
  one applies no position-delete file does (it holds their deletes: the spec's rule).

A delete file nothing live needs (`droppable`) can be removed from the table by the
same commit that removes the last data files it applied to.

Position deletes name files in their ``file_path`` column; the manifest's bounds of
that column give the one path of a file-scoped delete (what Spark writes by default)
without reading it; otherwise the column is read (``paths_read`` counts the bytes). A
deletion vector's entry names its data file (``referenced_data_file``), and several
vectors may share one Puffin file: a delete file is known by its `LiveDelete.key`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.conversions import from_bytes
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat, ManifestContent
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.typedef import EMPTY_DICT, Record
from pyiceberg.types import StringType

from icespool.iceberg import LiveData, file_key, snapshot_entries, v3_value

__all__ = ["DeleteKey", "LiveDelete", "LiveFiles", "applies", "droppable", "live_files"]

#: Field id of a position delete file's ``file_path`` column (Iceberg reserved).
PATH_FIELD_ID: Final = 2147483546
_PATH_COLUMN: Final = "file_path"

#: What tells a delete file apart: its path, and a deletion vector's blob offset.
DeleteKey = tuple[str, int | None]


@dataclass(frozen=True)
class LiveDelete:
    """A live delete file: its sequence number, scope and (position deletes) the paths
    of the data files it names."""

    file: DataFile
    sequence_number: int
    spec_id: int
    is_global: bool
    paths: frozenset[str] = frozenset()

    @property
    def is_equality(self) -> bool:
        return self.file.content == DataFileContent.EQUALITY_DELETES

    @property
    def is_vector(self) -> bool:
        """A deletion vector (a blob of a Puffin file), not a position-delete file."""
        return self.file.file_format == FileFormat.PUFFIN

    @property
    def path(self) -> str:
        return self.file.file_path

    @property
    def key(self) -> DeleteKey:
        return file_key(self.file)


@dataclass
class LiveFiles:
    """The live files of one snapshot, indexed for the scoping rules."""

    data: dict[str, LiveData] = field(default_factory=dict)
    deletes: list[LiveDelete] = field(default_factory=list)
    paths_read: int = 0  # bytes of position delete files read for their paths
    _index: (
        tuple[
            dict[tuple[int, Record], list[LiveDelete]],
            list[LiveDelete],
            dict[str, list[LiveDelete]],
        ]
        | None
    ) = None

    def _indexed(
        self,
    ) -> tuple[
        dict[tuple[int, Record], list[LiveDelete]], list[LiveDelete], dict[str, list[LiveDelete]]
    ]:
        if self._index is None:
            scoped: dict[tuple[int, Record], list[LiveDelete]] = defaultdict(list)
            global_: list[LiveDelete] = []
            named: dict[str, list[LiveDelete]] = defaultdict(list)
            for delete in self.deletes:
                if not delete.is_equality:
                    for path in delete.paths:
                        named[path].append(delete)
                elif delete.is_global:
                    global_.append(delete)
                else:
                    scoped[(delete.spec_id, delete.file.partition)].append(delete)
            self._index = (scoped, global_, named)
        return self._index

    def deletes_for(self, data: LiveData) -> list[LiveDelete]:
        """The live delete files that apply to ``data`` (indexed: O(their number))."""
        scoped, global_, named = self._indexed()
        candidates = [
            *scoped.get((data.spec_id, data.file.partition), ()),
            *global_,
            *named.get(data.file.file_path, ()),
        ]
        found = [d for d in candidates if applies(d, data.file, data.sequence_number, data.spec_id)]
        if any(d.is_vector for d in found):
            # A vector holds the deletes of the position-delete files before it.
            return [d for d in found if d.is_equality or d.is_vector]
        return found


def applies(delete: LiveDelete, data_file: DataFile, sequence_number: int, spec_id: int) -> bool:
    """Whether ``delete`` applies to ``data_file`` (of data sequence number
    ``sequence_number`` and partition spec ``spec_id``)."""
    if delete.is_equality:
        if sequence_number >= delete.sequence_number:
            return False
        return delete.is_global or (
            delete.spec_id == spec_id and delete.file.partition == data_file.partition
        )
    return sequence_number <= delete.sequence_number and data_file.file_path in delete.paths


def _position_paths(io: FileIO, delete_file: DataFile) -> tuple[frozenset[str], int]:
    """The data file paths a position delete names, and the bytes read to find them."""
    referenced = v3_value(delete_file, "referenced_data_file")
    if referenced is not None:  # a deletion vector, or a file that says its one file
        return frozenset({referenced}), 0
    lower = (delete_file.lower_bounds or {}).get(PATH_FIELD_ID)
    upper = (delete_file.upper_bounds or {}).get(PATH_FIELD_ID)
    if lower is not None and lower == upper:
        return frozenset({from_bytes(StringType(), lower)}), 0
    with io.new_input(delete_file.file_path).open() as stream:
        column = pq.read_table(stream, columns=[_PATH_COLUMN]).column(_PATH_COLUMN)
    return frozenset(pc.unique(column).to_pylist()), delete_file.file_size_in_bytes


def live_files(
    io: FileIO,
    metadata: TableMetadata,
    snapshot: Snapshot,
    *,
    known_paths: Mapping[str, frozenset[str]] = EMPTY_DICT,
) -> LiveFiles:
    """Every live data and delete file of ``snapshot`` (position deletes' paths found;
    ``known_paths`` gives those of position delete files already read: files never
    change)."""
    live = LiveFiles()
    specs = metadata.specs()
    for manifest, entries in snapshot_entries(io, snapshot, metadata.format_version):
        spec_id = manifest.partition_spec_id
        if manifest.content == ManifestContent.DATA:
            for entry in entries:
                data_file = entry.data_file
                live.data[data_file.file_path] = LiveData(
                    data_file,
                    entry.sequence_number or 0,
                    spec_id,
                    v3_value(data_file, "first_row_id"),
                )
            continue
        is_global = specs[spec_id].is_unpartitioned()
        for entry in entries:
            data_file = entry.data_file
            sequence = entry.sequence_number or 0
            if data_file.content == DataFileContent.POSITION_DELETES:
                known = known_paths.get(data_file.file_path)
                paths, read = (known, 0) if known is not None else _position_paths(io, data_file)
                live.paths_read += read
                live.deletes.append(LiveDelete(data_file, sequence, spec_id, False, paths))
            else:
                live.deletes.append(LiveDelete(data_file, sequence, spec_id, is_global))
    return live


def droppable(live: LiveFiles, removed: Iterable[str]) -> list[LiveDelete]:
    """The live delete files that apply to no live data file once the data files at
    ``removed`` paths are gone (files added with a data sequence number at or above
    every such delete's, as a compaction's outputs, never revive one)."""
    gone = set(removed)
    # Smallest remaining data sequence number per (spec, partition), and overall.
    smallest: dict[tuple[int, Record], int] = defaultdict(lambda: 1 << 62)
    overall = 1 << 62
    for path, data in live.data.items():
        if path in gone:
            continue
        scope = (data.spec_id, data.file.partition)
        smallest[scope] = min(smallest[scope], data.sequence_number)
        overall = min(overall, data.sequence_number)
    drop: list[LiveDelete] = []
    for delete in live.deletes:
        if delete.is_equality:
            floor = (
                overall if delete.is_global else smallest[(delete.spec_id, delete.file.partition)]
            )
            if floor >= delete.sequence_number:
                drop.append(delete)
        elif all(p in gone or p not in live.data for p in delete.paths):
            drop.append(delete)
    return drop
