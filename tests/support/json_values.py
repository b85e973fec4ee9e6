"""Spelling test values the way clients send them (JSON text, Arrow storage types)."""

from __future__ import annotations

import base64
import json
from decimal import Decimal

import pyarrow as pa

__all__ = ["b64_json", "decimal_json", "dumps", "storage_type"]


def dumps(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


def b64_json(value: bytes) -> str:
    return dumps(base64.b64encode(value).decode())


def decimal_json(value: Decimal) -> str:
    # Both spellings the README allows, exact: a raw JSON number or a JSON string.
    return str(value) if value.is_signed() else dumps(str(value))


def storage_type(t: pa.DataType) -> pa.DataType:
    """The type without extension types: clients send uuids as 16-byte binaries."""
    if isinstance(t, pa.BaseExtensionType):
        return t.storage_type
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(storage_type(f.type)) for f in t.fields])
    if pa.types.is_map(t):
        return pa.map_(
            t.key_field.with_type(storage_type(t.key_type)),
            t.item_field.with_type(storage_type(t.item_type)),
        )
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(storage_type(t.value_type)))
    return t
