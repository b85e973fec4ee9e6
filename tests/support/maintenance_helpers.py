"""Tables holding many small daemon-written files, for the maintenance tests.

Files are written the way a flush writes them (``encode_data_files`` with a spool
segment id as the prefix) and committed by ``commit_files`` in ONE snapshot, so a test
gets a thousand small files in a second instead of a thousand commits.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable, Sequence
from pathlib import Path

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table

from icespool.iceberg import commit_files
from icespool.iceberg._catalog import load_catalog
from icespool.iceberg._parquet import encode_data_files
from icespool.schema import arrow_schema_for, conform
from icespool.spool import new_uuid7

__all__ = [
    "ENCODE",
    "INCARNATION",
    "append_daemon_files",
    "encode_daemon_files",
    "live_files",
    "local_path",
    "rows",
    "sql_catalog",
    "table_ids",
    "uuid7_at",
]

#: The incarnation the helpers' daemon-named files carry (a process's 12-hex tag).
INCARNATION = "0123456789ab"

#: The writer settings the helpers encode with (a flush's, small targets).
ENCODE = {"target_file_size": 1 << 20, "row_group_records": 10_000, "compression": "zstd"}


def sql_catalog(directory: Path, name: str = "lake") -> Catalog:
    """A real SQLite SQL catalog with a local warehouse under ``directory``."""
    return load_catalog(
        name,
        {
            "type": "sql",
            "uri": f"sqlite:///{directory}/catalog.db",
            "warehouse": (directory / "warehouse").as_uri(),
        },
    )


def uuid7_at(epoch_s: float) -> str:
    """A uuid7 whose time is ``epoch_s`` (a segment id made then)."""
    value = (int(epoch_s * 1000) & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76 | secrets.randbits(12) << 64 | 0b10 << 62 | secrets.randbits(62)
    text = f"{value:032x}"
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


def rows(ids: Iterable[int], **columns: Sequence[object]) -> pa.Table:
    """Rows ``id`` + ``payload`` (32 hex characters from the id: incompressible, so
    file sizes follow row counts) + any extra ``columns``."""
    id_list = list(ids)
    payload = [hashlib.sha256(str(i).encode()).hexdigest()[:32] for i in id_list]
    return pa.table({"id": id_list, "payload": payload, **columns})


def encode_daemon_files(
    table: Table,
    data: pa.Table,
    prefix: str | None = None,
    *,
    segment: str | None = None,
    incarnation: str = INCARNATION,
) -> tuple[str, list[DataFile]]:
    """Encode ``data`` as a flush of one spool segment (``segment``, default a fresh
    uuid7) by the process ``incarnation`` would, or under the file name ``prefix``
    when given; returns (segment id, files)."""
    segment = segment or new_uuid7()
    files = encode_data_files(
        table,
        [conform(data, arrow_schema_for(table))],
        file_prefix=prefix or f"{segment}-{incarnation}",
        **ENCODE,
    )
    return segment, files


def append_daemon_files(table: Table, chunks: Iterable[pa.Table]) -> list[DataFile]:
    """One daemon-named file set per chunk, all committed in one snapshot."""
    segments: list[str] = []
    files: list[DataFile] = []
    for chunk in chunks:
        segment, written = encode_daemon_files(table, chunk)
        segments.append(segment)
        files += written
    commit_files(table, files, segment_ids=segments, summary={})
    return files


def live_files(table: Table) -> dict[str, DataFile]:
    """The data files of ``main``'s current snapshot, by path."""
    table.refresh()
    return {task.file.file_path: task.file for task in table.scan().plan_files()}


def table_ids(table: Table) -> list[int]:
    """Every id the table holds, sorted (duplicates kept: a test asserts there are none)."""
    table.refresh()
    return sorted(table.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist())


def local_path(location: str) -> Path:
    """The local file of a ``file://`` location."""
    return Path(location.removeprefix("file://"))
