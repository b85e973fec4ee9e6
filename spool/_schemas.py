"""The last Arrow schema each table was spooled with, kept after its segments are gone.

A segment's schema message says how its batches look; once the segment is committed
and deleted, that knowledge would be lost. The spool keeps it in one small file,
``table-schemas`` (JSON: table -> base64 of the serialized Arrow schema), written
atomically when the spool closes; at open, a leftover segment's schema is newer than
the record (a process that died never wrote it). It is a hint for the spool's owner
(what a table looked like at the last run), never data: a damaged or missing file only
means no hint.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from ._format import TABLE_KEY
from ._fs import FileSystem

__all__ = ["SCHEMAS_FILE", "load_schemas", "newest_segment_schemas", "record_schemas"]

SCHEMAS_FILE = "table-schemas"
_log = logging.getLogger("icespool.spool")


def load_schemas(directory: Path) -> dict[str, pa.Schema]:
    """The recorded schemas (empty when there is no record or it cannot be read)."""
    path = directory / SCHEMAS_FILE
    try:
        entries = json.loads(path.read_bytes())
        if not isinstance(entries, dict):
            raise ValueError("not a JSON object")
        return {
            str(table): ipc.read_schema(pa.py_buffer(base64.b64decode(encoded, validate=True)))
            for table, encoded in entries.items()
        }
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, TypeError, binascii.Error, pa.ArrowException) as exc:
        _log.warning(
            "%s cannot be read (%s: %s); the tables' last schemas are not known until "
            "their next appends",
            path,
            type(exc).__name__,
            exc,
        )
        return {}


def record_schemas(
    directory: Path,
    schemas: Mapping[str, pa.Schema],
    recorded: Mapping[str, pa.Schema],
    fs: FileSystem,
) -> Mapping[str, pa.Schema]:
    """Replace the record with ``schemas`` (atomically) unless it holds them already;
    returns what the record holds now (``recorded`` when it cannot be written)."""
    changed = schemas.keys() != recorded.keys() or any(
        not schema.equals(recorded[table], check_metadata=True) for table, schema in schemas.items()
    )
    if not changed:
        return recorded
    try:
        _save(directory, schemas, fs)
    except OSError as exc:
        _log.warning("the tables' schemas cannot be recorded in %s: %s", directory, exc)
        return recorded
    return dict(schemas)


def _save(directory: Path, schemas: Mapping[str, pa.Schema], fs: FileSystem) -> None:
    text = json.dumps(
        {
            table: base64.b64encode(schema.serialize().to_pybytes()).decode()
            for table, schema in sorted(schemas.items())
        },
        separators=(",", ":"),
    )
    tmp = directory / (SCHEMAS_FILE + ".tmp")
    fs.write_file(tmp, text.encode())
    fs.replace(tmp, directory / SCHEMAS_FILE)
    fs.fsync_directory(directory)


def newest_segment_schemas(segments: Iterable[tuple[str, Path]]) -> dict[str, pa.Schema]:
    """The schema of each table's newest segment among ``segments`` ((table, path),
    oldest first), read from the segment's schema message alone."""
    newest: dict[str, Path] = {}
    for table, path in segments:
        newest[table] = path
    found: dict[str, pa.Schema] = {}
    for table, path in newest.items():
        try:
            with pa.OSFile(str(path)) as source:
                schema = ipc.open_stream(source).schema
        except (OSError, pa.ArrowException) as exc:
            _log.warning("the schema of segment %s cannot be read: %s", path.name, exc)
            continue
        found[table] = untagged(schema)
    return found


def untagged(schema: pa.Schema) -> pa.Schema:
    """``schema`` without the table tag a segment's schema message carries."""
    metadata = {k: v for k, v in (schema.metadata or {}).items() if k != TABLE_KEY}
    return schema.with_metadata(metadata) if metadata else schema.remove_metadata()
