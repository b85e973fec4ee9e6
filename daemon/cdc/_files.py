"""Reading what the key index needs from a table's files: key columns of data files
(by field id, whoever wrote them), the (file, position) pairs of position deletes and
deletion vectors, and the keys of equality deletes. Blocking."""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, FileFormat

from icespool.iceberg import read_deletion_vector, v3_value

__all__ = [
    "PATH_COLUMN",
    "POS_COLUMN",
    "read_columns",
    "read_optional_columns",
    "read_positions",
    "union_positions",
]

#: A position delete file's columns (Iceberg's reserved field ids 2147483546/5).
PATH_COLUMN = "file_path"
POS_COLUMN = "pos"
_FIELD_ID = b"PARQUET:field_id"


def read_columns(io: FileIO, path: str, field_ids: Sequence[int]) -> list[pa.Array]:
    """The top-level columns of the Parquet file at ``path`` with ``field_ids``, in that
    order (matched by the field ids the file was written with, so a column renamed
    since, or named otherwise by another engine, is still found)."""
    found = read_optional_columns(io, path, field_ids)
    missing = [
        field_id for field_id, column in zip(field_ids, found, strict=True) if column is None
    ]
    if missing:
        raise ValueError(f"data file {path} has no column with field id {missing}")
    return [column for column in found if column is not None]


def read_optional_columns(io: FileIO, path: str, field_ids: Sequence[int]) -> list[pa.Array | None]:
    """`read_columns`, with None for a field id the file has no column of."""
    with io.new_input(path).open() as stream:
        parquet = pq.ParquetFile(stream)
        names: dict[int, str] = {}
        for field in parquet.schema_arrow:
            raw = (field.metadata or {}).get(_FIELD_ID)
            if raw is not None:
                names[int(raw)] = field.name
        present = [field_id for field_id in field_ids if field_id in names]
        read = parquet.read(columns=[names[field_id] for field_id in present])
    columns = {field_id: read.column(i).combine_chunks() for i, field_id in enumerate(present)}
    return [columns.get(field_id) for field_id in field_ids]


def read_positions(
    io: FileIO, delete_file: DataFile, paths: Collection[str] | None = None
) -> dict[str, np.ndarray]:
    """The positions a position-delete file (Parquet) or a deletion vector (a Puffin
    blob: its one data file) deletes in each data file it names (of ``paths`` only,
    when given)."""
    if delete_file.file_format == FileFormat.PUFFIN:
        referenced = v3_value(delete_file, "referenced_data_file")
        if referenced is None:
            raise ValueError(f"deletion vector {delete_file.file_path} names no data file")
        if paths is not None and referenced not in paths:
            return {}
        return {referenced: read_deletion_vector(io, delete_file)}
    with io.new_input(delete_file.file_path).open() as stream:
        read = pq.read_table(stream, columns=[PATH_COLUMN, POS_COLUMN])
    if read.num_rows == 0:
        return {}
    files = read.column(PATH_COLUMN).combine_chunks().dictionary_encode()
    positions = read.column(POS_COLUMN).combine_chunks().to_numpy(zero_copy_only=False)
    indices = files.indices.to_numpy(zero_copy_only=False)
    out: dict[str, np.ndarray] = {}
    for code, path in enumerate(files.dictionary.to_pylist()):
        if paths is None or path in paths:
            out[path] = np.asarray(positions[indices == code], dtype=np.int64)
    return out


def union_positions(*positions: np.ndarray) -> np.ndarray:
    """The sorted union of position arrays (a mask over their range: linear, where a
    hashed set union of hundreds of thousands of positions took a tenth of a second)."""
    present = [p for p in positions if len(p)]
    if not present:
        return np.zeros(0, dtype=np.int64)
    if len(present) == 1:
        return np.unique(present[0]) if not _sorted_unique(present[0]) else present[0]
    mask = np.zeros(
        max(int(p[-1]) if _sorted_unique(p) else int(p.max()) for p in present) + 1, dtype=bool
    )
    for p in present:
        mask[p] = True
    return np.flatnonzero(mask).astype(np.int64)


def _sorted_unique(positions: np.ndarray) -> bool:
    return bool(len(positions) < 2 or np.all(positions[1:] > positions[:-1]))
