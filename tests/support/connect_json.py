"""Debezium change values as Kafka Connect's JsonConverter (schemas enabled) writes them,
for tests that build them by hand: the ``{"schema": ..., "payload": ...}`` envelope with
``before``/``after`` row schemas, and Connect's Decimal as base64."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

__all__ = ["DECIMAL", "b64", "connect_schema", "envelope"]

DECIMAL = "org.apache.kafka.connect.data.Decimal"


def b64(unscaled: int) -> str:
    """Java's ``BigInteger.toByteArray`` (minimal two's complement), base64: what
    Kafka Connect's Decimal is in JSON."""
    size = (unscaled if unscaled >= 0 else ~unscaled).bit_length() // 8 + 1
    return base64.b64encode(unscaled.to_bytes(size, "big", signed=True)).decode()


def connect_schema(fields: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    row = [
        {**spec, "optional": spec.get("optional", True), "field": f} for f, spec in fields.items()
    ]
    value = {"type": "struct", "fields": row, "optional": True, "name": "db.public.t.Value"}
    return {
        "type": "struct",
        "fields": [
            {**value, "field": "before"},
            {**value, "field": "after"},
            {"type": "struct", "fields": [{"type": "string", "field": "db"}], "field": "source"},
            {"type": "string", "optional": False, "field": "op"},
        ],
        "optional": False,
        "name": "db.public.t.Envelope",
        "version": 2,
    }


def envelope(
    after: Mapping[str, Any] | None,
    op: str = "c",
    *,
    fields: Mapping[str, Mapping[str, Any]],
    before: Mapping[str, Any] | None = None,
) -> bytes:
    payload = {"before": before, "after": after, "source": {"db": "db"}, "op": op}
    # Compact, schema first: as JsonConverter writes it.
    value = {"schema": connect_schema(fields), "payload": payload}
    return json.dumps(value, separators=(",", ":")).encode()
