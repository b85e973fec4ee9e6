"""JSON Schema writer schemas from the schema registry: the types they declare and the
value checks that run on whole columns.

A schema's top level is an object; each property maps to a column by name:

    JSON Schema                                    column type
    boolean                                        boolean
    integer                                        long ("connect.type" int8/16/32: int)
    number                                         double ("connect.type" float32: float)
    number or string, Kafka Connect's Decimal      decimal(p, s) from "connect.parameters"
      (title org.apache.kafka.connect.data.Decimal)   (scale; connect.decimal.precision, 38)
    string                                         string
    string, format date-time / date / time / uuid  timestamptz / date / time / uuid
    string, contentEncoding base64                 binary (also "connect.type": "bytes")
    object with properties                         struct
    array with items                               list
    array of objects with properties key, value    map (the NDJSON rule for maps)

``"type": ["null", X]``, and ``oneOf``/``anyOf`` of ``{"type": "null"}`` and one other
schema (what Kafka Connect writes for an optional field), are X, nullable.
``$ref`` is followed within the document (``#/definitions/...``, ``#/$defs/...``) and
into the schemas it references by name (the registry's references).

Values are typed by the decode into the table's types (`icespool.decode._ndjson`:
the NDJSON value rules are the standard formats above), which checks ``type`` and
``format``; `Checks` then test ``required``, ``enum``/``const``, numeric bounds,
string lengths and ``pattern`` of the top-level properties on whole columns.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from icespool.decode._nesting import depth
from icespool.decode._registry import (
    Reference,
    RegistryAnswer,
    SchemaRegistry,
    SchemaUnavailable,
)

__all__ = ["Check", "JsonSchema", "natural_type", "parse_json_schema"]

_MAX_DOCUMENTS: Final = 256
_REF_LIMIT: Final = 64
_SCHEMA_TEXT_DEPTH: Final = 400
_DECIMAL: Final = "org.apache.kafka.connect.data.Decimal"
_FORMATS: Final[dict[str, pa.DataType]] = {
    "date-time": pa.timestamp("us", "UTC"),
    "date": pa.date32(),
    "time": pa.time64("us"),
    "uuid": pa.uuid(),
}

#: A check of one column of decoded rows: the mask of the rows that fail it (null:
#: passes) and what they are told.
Check = tuple[str, Callable[[pa.Array], pa.Array], str]


@dataclass(frozen=True)
class JsonSchema:
    """One registry schema: its top-level properties, resolved, and their checks."""

    label: str
    properties: dict[str, Any]
    documents: dict[str, Any] = field(repr=False)
    checks: list[Check] = field(repr=False)

    def resolve(self, node: Any) -> Any:
        """``node`` with its ``$ref`` followed and a null alternative taken away."""
        return _resolve(self.documents, node)

    def arrow_schema(self) -> pa.Schema:
        """What a table gets for these properties (every column optional); properties of
        no type the table can hold are left out."""
        fields = []
        for name, node in self.properties.items():
            data_type = natural_type(self, node)
            if data_type is not None:
                fields.append(pa.field(name, data_type))
        return pa.schema(fields)


def parse_json_schema(answer: RegistryAnswer, registry: SchemaRegistry) -> JsonSchema:
    """The schema of a registry answer with the documents it references; SchemaUnavailable
    (``invalid``) says what is wrong with it."""
    if answer.kind != "JSON":
        raise SchemaUnavailable("invalid", f"{answer.label} is a {answer.kind} schema, not JSON")
    documents = {"": _load(answer)}
    pending: list[Reference] = list(answer.references)
    while pending:
        reference = pending.pop()
        if reference.name in documents:
            continue
        if len(documents) > _MAX_DOCUMENTS:
            raise SchemaUnavailable(
                "invalid", f"{answer.label} references more than {_MAX_DOCUMENTS} documents"
            )
        referenced = registry.referenced(reference)
        documents[reference.name] = _load(referenced)
        pending.extend(referenced.references)
    try:
        root = _resolve(documents, documents[""])
        if not isinstance(root, dict) or _kind(root) != "object":
            raise ValueError("the top-level schema must be an object")
        properties = dict(root.get("properties") or {})
        schema = JsonSchema(answer.label, properties, documents, [])
        schema.checks.extend(_checks(schema, root))
    except (ValueError, TypeError, AttributeError, KeyError) as exc:
        raise SchemaUnavailable("invalid", f"{answer.label}: {exc}") from None
    return schema


def _load(answer: RegistryAnswer) -> Any:
    text = answer.text
    if depth(text.encode("utf-8", "surrogatepass")) > _SCHEMA_TEXT_DEPTH:
        raise SchemaUnavailable(
            "invalid", f"{answer.label} nests deeper than {_SCHEMA_TEXT_DEPTH} JSON levels"
        )
    try:
        return json.loads(text)
    except ValueError as exc:
        raise SchemaUnavailable("invalid", f"{answer.label} is not JSON: {exc}") from None


def _resolve(documents: dict[str, Any], node: Any) -> Any:
    document = documents[""]
    for _ in range(_REF_LIMIT):
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            name, _, pointer = str(node["$ref"]).partition("#")
            if name:
                if name not in documents:
                    raise ValueError(f"$ref {node['$ref']!r} names no referenced schema")
                document = documents[name]
            node = document
            for part in (p for p in pointer.split("/") if p):
                node = node[part.replace("~1", "/").replace("~0", "~")]
            continue
        kind = node.get("type")
        if isinstance(kind, list) and "null" in kind and len(kind) == 2:
            node = {**node, "type": next(k for k in kind if k != "null")}
            continue
        for key in ("oneOf", "anyOf"):
            options = node.get(key)
            if isinstance(options, list) and len(options) == 2:
                other = [
                    o for o in options if not (isinstance(o, dict) and o.get("type") == "null")
                ]
                if len(other) == 1:
                    node = other[0]
                    break
        else:
            return node
    raise ValueError("$ref references loop")


def _is_null(node: Any) -> bool:
    return isinstance(node, dict) and node.get("type") == "null"


def _kind(node: dict[str, Any]) -> str | None:
    kind = node.get("type")
    if kind is None and "properties" in node:
        return "object"
    return kind if isinstance(kind, str) else None


def natural_type(schema: JsonSchema, node: Any, left: int = 64) -> pa.DataType | None:
    """The column type a (sub)schema declares; None when it declares none a table can
    hold (no type, or several)."""
    node = schema.resolve(node)
    if not isinstance(node, dict) or left < 0:
        return None
    kind = _kind(node)
    connect = node.get("connect.type")
    if node.get("title") == _DECIMAL and kind in ("number", "string", None):
        parameters = node.get("connect.parameters") or {}
        scale = int(parameters.get("scale", 0))
        precision = int(parameters.get("connect.decimal.precision", 38))
        return (
            pa.decimal128(precision, scale) if precision <= 38 else pa.decimal256(precision, scale)
        )
    if kind == "boolean":
        return pa.bool_()
    if kind == "integer":
        return pa.int32() if connect in ("int8", "int16", "int32") else pa.int64()
    if kind == "number":
        return pa.float32() if connect == "float32" else pa.float64()
    if kind == "string":
        if node.get("contentEncoding") == "base64" or connect == "bytes":
            return pa.binary()
        return _FORMATS.get(str(node.get("format")), pa.string())
    if kind == "array":
        item = natural_type(schema, node.get("items", {}), left - 1)
        if item is None:
            return None
        if pa.types.is_struct(item) and item.names == ["key", "value"]:
            return pa.map_(item.field("key").type, item.field("value").type)
        return pa.list_(item)
    if kind == "object":
        properties = node.get("properties")
        fields = []
        for name, child in (properties or {}).items():
            child_type = natural_type(schema, child, left - 1)
            if child_type is not None:
                fields.append(pa.field(name, child_type))
        return pa.struct(fields) if fields else None
    return None


def _checks(schema: JsonSchema, root: dict[str, Any]) -> list[Check]:
    checks: list[Check] = []
    required = root.get("required") or []
    for name, raw in schema.properties.items():
        node = schema.resolve(raw)
        if not isinstance(node, dict):
            continue
        if name in required and not _nullable(raw):
            checks.append((name, _missing, f"required property {name!r} is missing"))
        checks.extend(_value_checks(name, node))
    return checks


def _nullable(node: Any) -> bool:
    if isinstance(node, dict):
        kind = node.get("type")
        if kind == "null" or (isinstance(kind, list) and "null" in kind):
            return True
        for key in ("oneOf", "anyOf"):
            if any(isinstance(o, dict) and o.get("type") == "null" for o in node.get(key) or ()):
                return True
    return False


def _value_checks(name: str, node: dict[str, Any]) -> list[Check]:
    checks: list[Check] = []
    options = node.get("enum")
    if "const" in node:
        options = [node["const"]]
    if isinstance(options, list) and all(
        isinstance(o, str | int | float | bool) or o is None for o in options
    ):
        allowed = [o for o in options if o is not None]
        checks.append(
            (name, _outside(allowed), f"property {name!r} is not one of {json.dumps(options)}")
        )
    bounds = {
        "minimum": pc.less,
        "exclusiveMinimum": pc.less_equal,
        "maximum": pc.greater,
        "exclusiveMaximum": pc.greater_equal,
    }
    for key, fails in bounds.items():
        bound = node.get(key)
        if isinstance(bound, int | float) and not isinstance(bound, bool):
            checks.append(
                (name, _compared(fails, bound), f"property {name!r} breaks {key} {bound}")
            )
    for key, fails in (("minLength", pc.less), ("maxLength", pc.greater)):
        length = node.get(key)
        if isinstance(length, int) and not isinstance(length, bool):
            checks.append(
                (
                    name,
                    _compared(fails, length, pc.utf8_length),
                    f"property {name!r} breaks {key} {length}",
                )
            )
    pattern = node.get("pattern")
    if isinstance(pattern, str):
        checks.append(
            (name, _unmatched(pattern), f"property {name!r} does not match pattern {pattern!r}")
        )
    return checks


def _missing(values: pa.Array) -> pa.Array:
    return values.is_null()


def _outside(allowed: list[Any]) -> Callable[[pa.Array], pa.Array]:
    def fails(values: pa.Array) -> pa.Array:
        inside = pc.is_in(values, value_set=pa.array(allowed, values.type))
        return pc.and_(pc.invert(inside), values.is_valid())

    return fails


def _compared(
    fails: Callable[[Any, Any], pa.Array],
    bound: float,
    measure: Callable[[pa.Array], pa.Array] | None = None,
) -> Callable[[pa.Array], pa.Array]:
    def check(values: pa.Array) -> pa.Array:
        return fails(values if measure is None else measure(values), bound)

    return check


def _unmatched(pattern: str) -> Callable[[pa.Array], pa.Array]:
    def fails(values: pa.Array) -> pa.Array:
        return pc.invert(pc.match_substring_regex(values, pattern))

    return fails
