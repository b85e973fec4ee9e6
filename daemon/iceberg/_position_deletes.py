"""Position-delete files: the rows an upsert commit deletes, named by data file and
position, written as Iceberg v2 Parquet position deletes.

One file per data file named (file-scoped, as Spark writes them by default), in the
spec and partition of that data file (so it scopes to it whatever the table's current
spec), positions sorted as the spec requires. A reader then applies to each data file
the one delete file that names it: Spark packs a file with one delete file into a read
task with others, where a file with many applicable delete files is read alone. The
``file_path`` column's bounds are kept whole (Iceberg truncates string bounds to 16
characters by default): lower = upper = the data file's path is how readers know a
delete file is file-scoped.

Blocking; the flush runs it in its thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io.pyarrow import (
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import LongType, NestedField, StringType

from icespool.errors import CatalogError
from icespool.iceberg._parquet import remove_files
from icespool.iceberg._upstream._partition_key import physical_partition_key
from icespool.schema import arrow_schema_for

if TYPE_CHECKING:
    from icespool.iceberg._live_rows import LiveData, Located

__all__ = ["POSITION_DELETE_MARK", "encode_position_deletes"]

#: Callers name position-delete files ``{segment}-{incarnation}-pos...``: the files are
#: ``{file_prefix}-{n:05d}-00000.parquet``, the shape of a data file's name, so the
#: orphan sweep knows them as the daemon's.
POSITION_DELETE_MARK: Final = "-pos"
_SCHEMA: Final = Schema(
    NestedField(2147483546, "file_path", StringType(), required=True),
    NestedField(2147483545, "pos", LongType(), required=True),
)
_ARROW: Final = arrow_schema_for(_SCHEMA)
# Whole bounds for both columns (see the module doc).
_STATISTICS: Final = compute_statistics_plan(_SCHEMA, {"write.metadata.metrics.default": "full"})
_MAPPING: Final = parquet_path_to_id_mapping(_SCHEMA)


def encode_position_deletes(
    table: Table, located: Located, *, file_prefix: str, compression: str
) -> dict[str, DataFile]:
    """Position-delete files deleting the rows ``located`` names, one per data file
    (by its path), written through ``table.io`` as ``{file_prefix}-{n:05d}-00000.parquet``."""
    written: dict[str, DataFile] = {}
    try:
        for number, path in enumerate(sorted(located.positions)):
            data = located.files[path]
            rows = _rows([path], located.positions)
            name = f"{file_prefix}-{number:05d}-00000.parquet"
            written[path] = _write(table, rows, data.spec_id, data, name, compression)
    except OSError as exc:
        remove_files(table, written.values())
        raise CatalogError(
            f"cannot write position deletes for table {'.'.join(table.name())}: {exc}; "
            "check the warehouse storage (the spool still holds the records)"
        ) from exc
    except BaseException:
        remove_files(table, written.values())
        raise
    return written


def _rows(paths: list[str], positions: Mapping[str, np.ndarray]) -> pa.Table:
    counts = [len(positions[path]) for path in paths]
    path_array = pa.DictionaryArray.from_arrays(
        pa.array(np.repeat(np.arange(len(paths), dtype=np.int32), counts)), pa.array(paths)
    ).cast(pa.string())
    pos = pa.array(np.concatenate([positions[path] for path in paths]), pa.int64())
    return pa.Table.from_arrays([path_array, pos], schema=_ARROW)


def _write(
    table: Table, rows: pa.Table, spec_id: int, sample: LiveData, name: str, compression: str
) -> DataFile:
    metadata = table.metadata
    spec = metadata.specs()[spec_id]
    partition = sample.file.partition
    key = None
    if not spec.is_unpartitioned():
        values = [partition[i] for i in range(len(spec.fields))]
        key = physical_partition_key(spec, metadata.schema(), values, partition)
    path = table.location_provider().new_data_location(data_file_name=name, partition_key=key)
    with table.io.new_output(path).create(overwrite=True) as stream:
        with pq.ParquetWriter(stream, _ARROW, compression=compression) as writer:
            writer.write_table(rows)
        size = stream.tell()
    statistics = data_file_statistics_from_parquet_metadata(
        parquet_metadata=writer.writer.metadata,
        stats_columns=_STATISTICS,
        parquet_column_mapping=_MAPPING,
    )
    delete_file = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=partition,
        file_size_in_bytes=size,
        sort_order_id=None,
        spec_id=spec_id,
        equality_ids=None,
        key_metadata=None,
        **statistics.to_serialized_dict(),
    )
    delete_file.spec_id = spec_id  # from_args drops it; the commit checks it
    return delete_file
