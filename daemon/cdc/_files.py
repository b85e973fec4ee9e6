"""Reading what the key index needs from a table's files: key columns of data files
(by field id, whoever wrote them), the (file, position) pairs of position deletes, and
the keys of equality deletes. Blocking."""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile

__all__ = ["PATH_COLUMN", "POS_COLUMN", "read_columns", "read_positions"]

#: A position delete file's columns (Iceberg's reserved field ids 2147483546/5).
PATH_COLUMN = "file_path"
POS_COLUMN = "pos"
_FIELD_ID = b"PARQUET:field_id"


def read_columns(io: FileIO, path: str, field_ids: Sequence[int]) -> list[pa.Array]:
    """The top-level columns of the Parquet file at ``path`` with ``field_ids``, in that
    order (matched by the field ids the file was written with, so a column renamed
    since, or named otherwise by another engine, is still found)."""
    with io.new_input(path).open() as stream:
        parquet = pq.ParquetFile(stream)
        names: dict[int, str] = {}
        for field in parquet.schema_arrow:
            raw = (field.metadata or {}).get(_FIELD_ID)
            if raw is not None:
                names[int(raw)] = field.name
        missing = [field_id for field_id in field_ids if field_id not in names]
        if missing:
            raise ValueError(f"data file {path} has no column with field id {missing}")
        read = parquet.read(columns=[names[field_id] for field_id in field_ids])
    return [read.column(i).combine_chunks() for i in range(len(field_ids))]


def read_positions(
    io: FileIO, delete_file: DataFile, paths: Collection[str] | None = None
) -> dict[str, np.ndarray]:
    """The positions a Parquet position-delete file deletes in each data file it names
    (of ``paths`` only, when given)."""
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
