"""Avro writer schemas (a registry's or an ``.avsc`` file's), parsed for the decoder.

A leaf of the schema package so that check-config can validate a schema file
without importing the Kafka decoder.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import fastavro

from icespool.decode._nesting import depth

__all__ = ["WriterSchema", "load_schema_file", "parse_writer_schema"]

#: JSON levels a schema's text may nest (an Avro level takes three or four: record,
#: fields, field, type). Checked before json.loads and fastavro's parser recurse.
_SCHEMA_TEXT_DEPTH: Final = 400


@dataclass(frozen=True, slots=True)
class WriterSchema:
    """One writer schema, parsed twice: as written (logical types, for the column
    converters) and without logical types (for fastavro's reader)."""

    label: str  # "schema id 7" or the file name, for messages
    shape: Any
    reader: Any
    named: dict[str, Any]


def _strip_logical(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _strip_logical(v) for k, v in node.items() if k != "logicalType"}
    if isinstance(node, list):
        return [_strip_logical(v) for v in node]
    return node


def parse_writer_schema(text: str, label: str) -> WriterSchema:
    """Parse an Avro schema (JSON text); ValueError says what is wrong with it."""
    if depth(text.encode("utf-8", "surrogatepass")) > _SCHEMA_TEXT_DEPTH:
        raise ValueError(f"{label} nests deeper than {_SCHEMA_TEXT_DEPTH} JSON levels")
    try:
        raw = json.loads(text)
        shape = fastavro.parse_schema(copy.deepcopy(raw))
        reader = fastavro.parse_schema(_strip_logical(raw))
    except Exception as exc:  # fastavro raises many types for bad schemas
        raise ValueError(
            f"{label} is not a valid Avro schema: {type(exc).__name__}: {exc}"
        ) from None
    named = shape.get("__named_schemas", {}) if isinstance(shape, dict) else {}
    return WriterSchema(label, shape, reader, dict(named))


def load_schema_file(path: Path) -> WriterSchema:
    """The fixed schema of an ``.avsc`` file; ValueError when it cannot be read or parsed."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {str(path)!r}: {exc}") from None
    schema = parse_writer_schema(text, path.name)
    if not (isinstance(schema.shape, dict) and schema.shape.get("type") == "record"):
        raise ValueError(f"{str(path)!r}: the top-level Avro schema must be a record")
    return schema
