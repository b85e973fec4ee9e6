"""Avro values of one fetch batch -> an Arrow batch in the table's schema.

Two framings: the Confluent wire format (magic byte 0, 4-byte big-endian schema id,
Avro binary) with the writer schemas from a schema registry, or plain Avro binary
written with one fixed schema from an ``.avsc`` file.

Each value is read by fastavro's C reader with a copy of the writer schema whose
logical types are removed, so it yields plain ints, bytes and strings instead of
``datetime``/``Decimal``/``UUID`` objects. The values are then turned into Arrow one
column at a time (``pa.array`` over the column's Python values, nested types rebuilt
from their flattened children), and logical types are applied on whole arrays: a
``timestamp-micros`` column is its int64 array viewed as ``timestamp[us, UTC]`` and
cast to the table's type with Arrow's checked casts. Only decimals and uuids convert
value by value.

A value that does not read, or whose batch does not convert, costs only itself: the
conversion is retried on halves until the bad records stand alone, and they become
dead letters (reason ``invalid``, the error names the column). A schema id the
registry does not know, or a registry that does not answer after a few tries, makes
its records dead letters with reason ``schema_unavailable``.
"""

from __future__ import annotations

import base64
import http.client
import io
import json
import logging
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import fastavro
import numpy as np
import numpy.typing as npt
import pyarrow as pa

from icespool.decode import split_failures
from icespool.decode._avro_schema import WriterSchema, load_schema_file, parse_writer_schema
from icespool.decode._nesting import DEFAULT_MAX_DEPTH
from icespool.errors import BadInputError, SchemaError
from icespool.kafka._decode import DeadRecord, Decoded, Fetch, _with_metadata
from icespool.runtime.retry import retry
from icespool.schema import cast_array, conform, find_out_of_range

if TYPE_CHECKING:
    from icespool.config import KafkaConfig

__all__ = [
    "AvroSchemas",
    "FileSchema",
    "RegistrySchemas",
    "SchemaUnavailable",
    "avro_rows",
    "avro_schemas",
    "decode_avro",
]

_log = logging.getLogger("icespool.kafka")

#: Registry lookups: tries and the pauses between them (``schema_registry_timeout``
#: bounds each request).
_TRIES: Final = 3
_BACKOFF: Final = (0.25, 0.75)
#: A failed lookup is not repeated for this long: a stream of records with an unknown
#: id must not wait for the retries in every fetch batch.
_FAILURE_TTL: Final = 5.0

_PRIMITIVES: Final = frozenset(
    {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
)
_RESOLVE_LIMIT: Final = 64


# ------------------------------------------------------------------ writer schemas


class SchemaUnavailable(Exception):
    """A writer schema cannot be had; ``reason`` is the dead-letter reason."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


class AvroSchemas:
    """Where writer schemas come from. ``framed``: values carry the Confluent header."""

    framed: bool = True

    def get(self, schema_id: int) -> WriterSchema:
        raise NotImplementedError

    def fixed(self) -> WriterSchema:
        raise NotImplementedError


class FileSchema(AvroSchemas):
    """The schema of an ``.avsc`` file, read again when the file changes."""

    framed = False

    def __init__(self, path: Path) -> None:
        self._path = path
        self._changed = self._mtime()
        self._schema = load_schema_file(path)

    def fixed(self) -> WriterSchema:
        changed = self._mtime()
        if changed != self._changed:
            self._schema = load_schema_file(self._path)
            self._changed = changed
        return self._schema

    def _mtime(self) -> int | None:
        try:
            return self._path.stat().st_mtime_ns
        except OSError:
            return None  # a missing file fails in load_schema_file, by name


class _RegistryFailed(Exception):
    """One failed request to the registry: what went wrong, and whether to ask again."""

    def __init__(self, error: str, *, again: bool) -> None:
        super().__init__(error)
        self.error = error
        self.again = again


class RegistrySchemas(AvroSchemas):
    """A blocking client of a Confluent-compatible registry (``GET /schemas/ids/{id}``)
    with an in-process cache by id. Safe to share between threads."""

    framed = True

    def __init__(
        self,
        url: str,
        username: str | None = None,
        password: str | None = None,
        timeout: float = 2.0,
    ) -> None:
        self.url = url.rstrip("/")
        self._timeout = timeout
        self._headers = {"Accept": "application/vnd.schemaregistry.v1+json, application/json"}
        if username is not None:
            token = base64.b64encode(f"{username}:{password or ''}".encode()).decode()
            self._headers["Authorization"] = f"Basic {token}"
        self._schemas: dict[int, WriterSchema] = {}
        self._failed: dict[int, tuple[float, SchemaUnavailable]] = {}
        self._lock = threading.Lock()

    def get(self, schema_id: int) -> WriterSchema:
        with self._lock:
            found = self._schemas.get(schema_id)
            if found is not None:
                return found
            failed = self._failed.get(schema_id)
            if failed is not None and time.monotonic() < failed[0]:
                raise failed[1]
        try:
            schema = self._fetch(schema_id)
        except SchemaUnavailable as exc:
            with self._lock:
                self._failed[schema_id] = (time.monotonic() + _FAILURE_TTL, exc)
            raise
        with self._lock:
            self._failed.pop(schema_id, None)
            self._schemas[schema_id] = schema
        return schema

    def _fetch(self, schema_id: int) -> WriterSchema:
        label = f"schema id {schema_id}"
        tries = 0

        def request() -> bytes:
            nonlocal tries
            tries += 1
            try:
                return self._request(f"{self.url}/schemas/ids/{schema_id}")
            except urllib.error.HTTPError as exc:
                detail = _error_detail(exc)
                error = f"the registry answered {exc.code}{': ' + detail if detail else ''}"
                # Credentials do not fix themselves within seconds.
                raise _RegistryFailed(error, again=exc.code not in (401, 403)) from None
            except (OSError, ValueError, http.client.HTTPException) as exc:  # refused, timeouts
                error = f"the registry is unreachable: {getattr(exc, 'reason', exc)}"
                raise _RegistryFailed(error, again=True) from None

        try:
            body = retry(
                request,
                attempts=_TRIES,
                retryable=lambda exc: isinstance(exc, _RegistryFailed) and exc.again,
                pause=lambda number, _: _BACKOFF[min(number - 1, len(_BACKOFF) - 1)],
            )
        except _RegistryFailed as exc:
            # Rejected credentials end the retries after one try: say how many were made.
            made = "1 try" if tries == 1 else f"{tries} tries"
            _log.warning("Avro %s is unavailable after %s: %s", label, made, exc.error)
            raise SchemaUnavailable(
                "schema_unavailable", f"{label} unavailable after {made}: {exc.error}"
            ) from None
        try:
            answer = json.loads(body)
            kind = answer.get("schemaType", "AVRO")
            text = answer["schema"]
        except (ValueError, KeyError, TypeError, AttributeError):
            raise SchemaUnavailable(
                "invalid", f"{label}: the registry's answer has no 'schema'"
            ) from None
        if kind != "AVRO":
            raise SchemaUnavailable("invalid", f"{label} is a {kind} schema, not Avro")
        try:
            return parse_writer_schema(text, label)
        except ValueError as exc:
            raise SchemaUnavailable("invalid", str(exc)) from None

    def _request(self, url: str) -> bytes:
        request = urllib.request.Request(url, headers=self._headers)
        with urllib.request.urlopen(request, timeout=self._timeout) as response:
            body: bytes = response.read()
            return body


def _error_detail(exc: urllib.error.HTTPError) -> str:
    try:
        body = exc.read(2048)
        message = json.loads(body).get("message")
        return str(message) if message else ""
    except Exception:  # any body at all: the status code says enough
        return ""


def avro_schemas(config: KafkaConfig) -> AvroSchemas:
    """The schema source of a ``[[kafka]]`` section with format "avro"; its source
    keeps it (and the registry cache in it) for as long as it runs."""
    if config.avro_schema_file is not None:
        return FileSchema(config.avro_schema_file)
    if config.schema_registry_url is not None:
        return RegistrySchemas(
            config.schema_registry_url,
            config.schema_registry_username,
            config.schema_registry_password,
            config.schema_registry_timeout,
        )
    raise ValueError("format 'avro' needs schema_registry_url or avro_schema_file")


# ------------------------------------------------------------------ decoding


def _frame(
    schemas: AvroSchemas,
    index: int,
    value: bytes,
    groups: dict[int | None, list[int]],
    dead: list[DeadRecord],
) -> None:
    """Group a value by its writer schema: the Confluent wire format's schema id, or
    None for the one fixed schema; a value without the wire header is a dead letter."""
    if not schemas.framed:
        groups.setdefault(None, []).append(index)
    elif len(value) < 5 or value[0] != 0:
        dead.append(DeadRecord(index, "invalid", _bad_header(value)))
    else:
        groups.setdefault(int.from_bytes(value[1:5], "big"), []).append(index)


def _writer_schema(
    schemas: AvroSchemas, schema_id: int | None, indices: list[int], dead: list[DeadRecord]
) -> tuple[WriterSchema, int] | None:
    """The writer schema of a group and where its values' Avro starts (after the wire
    header); None, with the group dead-lettered, when the schema is unavailable."""
    try:
        writer = schemas.fixed() if schema_id is None else schemas.get(schema_id)
    except SchemaUnavailable as exc:
        dead.extend(DeadRecord(i, exc.reason, str(exc)) for i in indices)
        return None
    return writer, 0 if schema_id is None else 5


def decode_avro(
    fetch: Fetch,
    schema: pa.Schema,
    *,
    metadata_columns: Sequence[str] = (),
    max_record_bytes: int = 2**20,
    subset: npt.NDArray[np.int64] | None = None,
    schemas: AvroSchemas,
    max_depth: int = DEFAULT_MAX_DEPTH,
) -> Decoded:
    """Decode the Avro values of ``fetch`` (or of its ``subset`` positions) for one table.

    A value nests at most as deep as its writer schema, so ``max_depth`` bounds the
    schema (recursive schemas included) before any value is read."""
    positions = subset if subset is not None else np.arange(len(fetch.offsets), dtype=np.int64)
    view = fetch.take(positions) if subset is not None else fetch
    value_schema = pa.schema([f for f in schema if f.name not in metadata_columns])
    dead: list[DeadRecord] = []
    groups: dict[int | None, list[int]] = {}
    # Avro is read value by value (fastavro) in any case: the values as bytes.
    values: list[bytes | None] = view.values.to_pylist()
    for i, value in enumerate(values):
        if not value:
            dead.append(DeadRecord(i, "empty", "the record has no value (tombstone or empty)"))
        elif len(value) > max_record_bytes:
            dead.append(
                DeadRecord(
                    i,
                    "oversized",
                    f"value of {len(value)} bytes exceeds max_record_bytes ({max_record_bytes})",
                )
            )
        else:
            _frame(schemas, i, value, groups, dead)
    tables: list[tuple[pa.RecordBatch, list[int]]] = []
    for schema_id, indices in groups.items():
        found = _writer_schema(schemas, schema_id, indices, dead)
        if found is not None:
            writer, start = found
            _decode_group(values, indices, start, writer, value_schema, max_depth, tables, dead)
    dead = sorted(
        (DeadRecord(int(positions[d.index]), d.reason, d.error, d.column) for d in dead),
        key=lambda d: d.index,
    )
    if not tables:
        return Decoded(None, np.empty(0, np.int64), dead)
    ok = np.asarray([i for _, idx in tables for i in idx], dtype=np.int64)
    table = pa.Table.from_batches([t for t, _ in tables], schema=tables[0][0].schema)
    order = np.argsort(ok, kind="stable")
    if np.any(order != np.arange(len(ok))):
        table = table.take(pa.array(order))
        ok = ok[order]
    batch = _with_metadata(table, view.take(ok), schema, metadata_columns)
    return Decoded(batch, positions[ok], dead)


def _bad_header(value: bytes) -> str:
    if len(value) < 5:
        return (
            f"value of {len(value)} byte(s) is too short for the Confluent wire format "
            "(magic byte 0 and a 4-byte schema id)"
        )
    return f"magic byte is {value[0]}, not 0: not the Confluent wire format"


def _decode_group(
    values: list[bytes | None],
    indices: list[int],
    start: int,
    writer: WriterSchema,
    value_schema: pa.Schema,
    max_depth: int,
    out: list[tuple[pa.RecordBatch, list[int]]],
    dead: list[DeadRecord],
    ignore_unknown: bool = False,
) -> None:
    try:
        build = _plan(writer, value_schema, max_depth, ignore_unknown)
    except BadInputError as exc:
        dead.extend(DeadRecord(i, exc.reason, f"{writer.label}: {exc}") for i in indices)
        return
    rows: list[Any] = []
    good: list[int] = []
    reader = writer.reader
    for i in indices:
        value = values[i]
        assert value is not None
        stream = io.BytesIO(value)
        stream.seek(start)
        try:
            record = fastavro.schemaless_reader(stream, reader)
        except Exception as exc:  # fastavro raises EOFError, IndexError, ... on bad bytes
            reason = "bad_utf8" if isinstance(exc, UnicodeDecodeError) else "invalid"
            dead.append(DeadRecord(i, reason, _unreadable(writer, exc)))
            continue
        left = len(value) - stream.tell()
        if left:
            dead.append(
                DeadRecord(
                    i,
                    "invalid",
                    f"not Avro of {writer.label}: {left} byte(s) left after the record",
                )
            )
            continue
        rows.append(record)
        good.append(i)
    by_index = dict(zip(good, rows, strict=True))
    built, failed = split_failures(
        good, lambda part: build([by_index[i] for i in part]), _CONVERSION_ERRORS
    )
    out.extend((batch, list(part)) for batch, part in built)
    for index, error in failed:
        reason = error.reason if isinstance(error, BadInputError) else "invalid"
        column = error.column if isinstance(error, SchemaError) else None
        dead.append(DeadRecord(index, reason, str(error), column))


def _unreadable(writer: WriterSchema, exc: Exception) -> str:
    detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if isinstance(exc, EOFError | IndexError):
        # fastavro's reader runs past the end of a short value (or one written with
        # another schema) with either of these.
        return (
            f"not Avro of {writer.label}: the value is cut short or was written with "
            f"another schema ({detail})"
        )
    return f"not Avro of {writer.label}: {detail}"


_CONVERSION_ERRORS = (BadInputError, pa.ArrowException, ValueError, TypeError, OverflowError)


# ------------------------------------------------------------------ column converters

Convert = Callable[[list[Any]], pa.Array]


def _plan(
    writer: WriterSchema, value_schema: pa.Schema, max_depth: int, ignore_unknown: bool = False
) -> Callable[[list[Any]], pa.RecordBatch]:
    """rows (fastavro dicts) -> a batch in ``value_schema``; SchemaError when the writer
    schema cannot fit the table at all (then no record of it can). ``ignore_unknown``:
    top-level fields ``value_schema`` lacks are skipped (an envelope's ``source``)."""
    shape = _resolve(writer, writer.shape)
    if not (isinstance(shape, dict) and shape.get("type") == "record"):
        raise BadInputError(f"the top-level Avro schema must be a record, not {_describe(shape)}")
    fields = {f["name"]: f["type"] for f in shape["fields"]}
    for name in fields:
        if value_schema.get_field_index(name) < 0 and not ignore_unknown:
            raise SchemaError(name, "Avro field is not a column of the table")
    columns: list[tuple[str, Convert | None, pa.DataType]] = []
    for target in value_schema:
        if target.name in fields:
            convert = _converter(
                # The record itself is the first level, as a JSON object is.
                writer,
                fields[target.name],
                target.type,
                target.name,
                max_depth - 1,
            )
            columns.append((target.name, convert, target.type))
        elif not target.nullable:
            raise SchemaError(target.name, "required column is missing from the Avro schema")
        else:
            columns.append((target.name, None, target.type))

    def build(rows: list[Any]) -> pa.RecordBatch:
        arrays = [
            pa.nulls(len(rows), data_type)
            if convert is None
            else convert([row[name] for row in rows])
            for name, convert, data_type in columns
        ]
        batch = conform(pa.RecordBatch.from_arrays(arrays, schema=value_schema), value_schema)
        for name, values in zip(batch.schema.names, batch.columns, strict=True):
            found = find_out_of_range(values)
            if found is not None:
                raise SchemaError(found.column(name), found.problem).because("out_of_range")
        return batch

    return build


def _resolve(writer: WriterSchema, node: Any) -> Any:
    """A named-type reference -> its definition; ``{"type": X}`` without more -> X."""
    for _ in range(_RESOLVE_LIMIT):
        if isinstance(node, str) and node not in _PRIMITIVES:
            if node not in writer.named:
                raise BadInputError(f"unknown Avro type name {node!r}")
            node = writer.named[node]
        elif isinstance(node, dict) and set(node) <= {"type"} and "type" in node:
            node = node["type"]
        else:
            return node
    raise BadInputError("Avro type references loop")


def _describe(node: Any) -> str:
    if isinstance(node, list):
        return "union"
    if isinstance(node, dict):
        logical = node.get("logicalType")
        kind = str(node.get("type"))
        return f"{kind} ({logical})" if logical else kind
    return str(node)


def _converter(
    writer: WriterSchema, node: Any, target: pa.DataType, path: str, left: int
) -> Convert:
    """``left``: how many more levels the schema may nest (max_nesting_depth); a
    recursive schema runs out of them too, before any value of it is read."""
    if left < 0:
        raise SchemaError(
            path, "the Avro schema nests deeper than max_nesting_depth (or is recursive)"
        ).because("too_deep")
    node = _resolve(writer, node)
    if isinstance(node, list):
        branches = [b for b in node if _resolve(writer, b) != "null"]
        if len(branches) == 1:
            return _converter(writer, branches[0], target, path, left)
        if not branches:
            return lambda values: pa.nulls(len(values), target)
        resolved = [_resolve(writer, b) for b in branches]
        if all(isinstance(b, str) for b in resolved) and _plain(target):
            # e.g. ["int", "long"] or ["string", "bytes"]: pyarrow converts value by value.
            return _checked(path, "union", lambda values: pa.array(values, type=target), target)
        raise SchemaError(
            path,
            "an Avro union of several non-null types maps to no single column type (only "
            "unions of primitives into a boolean, number, string or binary column do)",
        )
    kind = node["type"] if isinstance(node, dict) else node
    logical = node.get("logicalType") if isinstance(node, dict) else None
    if kind == "record":
        return _struct(writer, node, target, path, left - 1)
    if kind == "array":
        return _list(writer, node, target, path, left - 1)
    if kind == "map":
        return _map(writer, node, target, path, left - 1)
    if kind == "null":
        return lambda values: pa.nulls(len(values), target)
    natural = _natural(node, kind, logical, target, path)
    return _checked(path, _describe(node), natural, target)


def _checked(path: str, avro: str, natural: Convert, target: pa.DataType) -> Convert:
    def convert(values: list[Any]) -> pa.Array:
        try:
            return cast_array(natural(values), target)
        except SchemaError:
            raise
        except _CONVERSION_ERRORS as exc:
            raise SchemaError(path, f"cannot convert Avro {avro} to {target}: {exc}") from exc

    return convert


def _plain(t: pa.DataType) -> bool:
    """Types ``pa.array`` fills from Python values without reinterpreting numbers."""
    return bool(
        pa.types.is_boolean(t)
        or pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_string(t)
        or pa.types.is_binary(t)
    )


def _is_integer(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t))


def _natural(node: Any, kind: str, logical: str | None, target: pa.DataType, path: str) -> Convert:
    """The Arrow array an Avro primitive (with its logical type) stands for."""

    def refuse() -> SchemaError:
        return SchemaError(path, f"Avro {_describe(node)} does not convert to {target}")

    is_uuid = isinstance(target, pa.BaseExtensionType) and target.extension_name == "arrow.uuid"
    if logical == "decimal" and kind in ("bytes", "fixed"):
        if not (pa.types.is_decimal(target) or pa.types.is_floating(target)):
            raise refuse()
        return _decimal(int(node.get("precision", 38)), int(node.get("scale", 0)))
    if is_uuid and kind in ("string", "fixed"):
        # Text of a UUID (logical type uuid or not), or its 16 bytes.
        return _uuid(kind)
    temporal = _TEMPORAL.get((kind, logical or ""))
    if temporal is not None:
        storage, view = temporal
        if not (
            pa.types.is_timestamp(target) or pa.types.is_date(target) or pa.types.is_time(target)
        ):
            raise refuse()
        return lambda values: pa.array(values, storage).view(view)
    simple = _SIMPLE.get(kind)
    if simple is None and kind == "fixed":
        simple = pa.binary(int(node["size"]))
    if simple is None:
        raise SchemaError(path, f"Avro {_describe(node)} is not supported")
    compatible = {
        "boolean": pa.types.is_boolean(target),
        "int": _is_integer(target) or pa.types.is_floating(target) or pa.types.is_decimal(target),
        "long": _is_integer(target) or pa.types.is_floating(target) or pa.types.is_decimal(target),
        "float": pa.types.is_floating(target),
        "double": pa.types.is_floating(target),
        "string": pa.types.is_string(target),
        "enum": pa.types.is_string(target),
        "bytes": pa.types.is_binary(target) or pa.types.is_fixed_size_binary(target),
        "fixed": pa.types.is_binary(target) or pa.types.is_fixed_size_binary(target),
    }[kind]
    if not compatible:
        raise refuse()
    return lambda values: pa.array(values, simple)


_SIMPLE: Final[dict[str, pa.DataType]] = {
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "string": pa.string(),
    "enum": pa.string(),
    "bytes": pa.binary(),
}

# (Avro type, logical type) -> (array of the raw numbers, the type it is viewed as)
_TEMPORAL: Final[dict[tuple[str, str], tuple[pa.DataType, pa.DataType]]] = {
    ("int", "date"): (pa.int32(), pa.date32()),
    ("int", "time-millis"): (pa.int32(), pa.time32("ms")),
    ("long", "time-micros"): (pa.int64(), pa.time64("us")),
    ("long", "timestamp-millis"): (pa.int64(), pa.timestamp("ms", "UTC")),
    ("long", "timestamp-micros"): (pa.int64(), pa.timestamp("us", "UTC")),
    ("long", "timestamp-nanos"): (pa.int64(), pa.timestamp("ns", "UTC")),
    ("long", "local-timestamp-millis"): (pa.int64(), pa.timestamp("ms")),
    ("long", "local-timestamp-micros"): (pa.int64(), pa.timestamp("us")),
    ("long", "local-timestamp-nanos"): (pa.int64(), pa.timestamp("ns")),
}


def _decimal(precision: int, scale: int) -> Convert:
    """Big-endian two's-complement unscaled values -> decimal128 (decimal256 above 38
    digits) in the writer's scale; the cast to the table's type checks range and scale."""
    width = 16 if precision <= 38 else 32
    carrier = pa.decimal128(38, scale) if width == 16 else pa.decimal256(76, scale)
    zero = bytes(width)

    def convert(values: list[Any]) -> pa.Array:
        data = bytearray()
        valid: list[bool] = []
        for value in values:
            if value is None:
                data += zero
                valid.append(False)
            else:
                unscaled = int.from_bytes(value, "big", signed=True)
                try:
                    data += unscaled.to_bytes(width, "little", signed=True)
                except OverflowError:
                    raise ValueError(f"decimal of {len(value)} bytes is too large") from None
                valid.append(True)
        mask = None if all(valid) else pa.array(valid, pa.bool_()).buffers()[1]
        array = pa.Array.from_buffers(carrier, len(values), [mask, pa.py_buffer(bytes(data))])
        array.validate(full=True)  # more digits than the carrier's precision
        return array

    return convert


def _uuid(kind: str) -> Convert:
    def convert(values: list[Any]) -> pa.Array:
        if kind == "fixed":
            storage = pa.array(values, pa.binary(16))
        else:
            try:
                storage = pa.array(
                    [None if v is None else uuid.UUID(v).bytes for v in values], pa.binary(16)
                )
            except ValueError as exc:
                raise ValueError(f"not a UUID: {exc}") from None
        return pa.ExtensionArray.from_storage(pa.uuid(), storage)

    return convert


def _mask(values: list[Any]) -> pa.Array | None:
    if all(v is not None for v in values):
        return None
    return pa.array([v is None for v in values], pa.bool_())


def _offsets(values: list[Any]) -> pa.Array:
    lengths = np.fromiter((0 if v is None else len(v) for v in values), np.int32, len(values))
    offsets = np.zeros(len(values) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.array(offsets)


def _struct(writer: WriterSchema, node: Any, target: pa.DataType, path: str, left: int) -> Convert:
    if not pa.types.is_struct(target):
        raise SchemaError(path, f"an Avro record does not convert to {target}")
    fields = {f["name"]: f["type"] for f in node["fields"]}
    for name in fields:
        if target.get_field_index(name) < 0:
            raise SchemaError(f"{path}.{name}", "Avro field is not in the table's struct")
    children: list[tuple[str, Convert | None, pa.DataType]] = []
    for field in target.fields:
        if field.name in fields:
            child = _converter(writer, fields[field.name], field.type, f"{path}.{field.name}", left)
            children.append((field.name, child, field.type))
        else:
            children.append((field.name, None, field.type))

    def convert(values: list[Any]) -> pa.Array:
        arrays = [
            pa.nulls(len(values), data_type)
            if child is None
            else child([None if v is None else v[name] for v in values])
            for name, child, data_type in children
        ]
        return pa.StructArray.from_arrays(arrays, fields=list(target.fields), mask=_mask(values))

    return convert


def _list(writer: WriterSchema, node: Any, target: pa.DataType, path: str, left: int) -> Convert:
    if not (pa.types.is_list(target) or pa.types.is_large_list(target)):
        raise SchemaError(path, f"an Avro array does not convert to {target}")
    element = _converter(writer, node["items"], target.value_type, f"{path}.element", left)

    def convert(values: list[Any]) -> pa.Array:
        flat = [x for v in values if v is not None for x in v]
        return pa.ListArray.from_arrays(
            _offsets(values), element(flat), type=target, mask=_mask(values)
        )

    return convert


def _map(writer: WriterSchema, node: Any, target: pa.DataType, path: str, left: int) -> Convert:
    if not pa.types.is_map(target):
        raise SchemaError(path, f"an Avro map does not convert to {target}")
    key = _converter(writer, "string", target.key_type, f"{path}.key", left)
    item = _converter(writer, node["values"], target.item_type, f"{path}.value", left)

    def convert(values: list[Any]) -> pa.Array:
        keys = [k for v in values if v is not None for k in v]
        items = [x for v in values if v is not None for x in v.values()]
        return pa.MapArray.from_arrays(
            _offsets(values), key(keys), item(items), type=target, mask=_mask(values)
        )

    return convert


def avro_rows(
    schemas: AvroSchemas, max_depth: int = DEFAULT_MAX_DEPTH, *, ignore_unknown: bool = False
) -> Callable[
    [pa.BinaryArray, npt.NDArray[np.int64], pa.Schema],
    tuple[pa.Table | None, npt.NDArray[np.int64], list[DeadRecord]],
]:
    """Avro values (Kafka values or keys) at given positions -> rows in a schema, for
    `icespool.decode._keyed` (Debezium's envelope: ``ignore_unknown`` skips its
    ``source``, ``ts_ms``, ``transaction``). Same wire rules and dead letters as
    `decode_avro`; the good rows come back in position order."""

    def decode(
        values: pa.BinaryArray, indices: npt.NDArray[np.int64], schema: pa.Schema
    ) -> tuple[pa.Table | None, npt.NDArray[np.int64], list[DeadRecord]]:
        raw: list[bytes | None] = values.to_pylist()
        dead: list[DeadRecord] = []
        groups: dict[int | None, list[int]] = {}
        for i in indices.tolist():
            value = raw[i]
            assert value is not None, "null values are tombstones, never decoded"
            _frame(schemas, i, value, groups, dead)
        tables: list[tuple[pa.RecordBatch, list[int]]] = []
        for schema_id, group in groups.items():
            found = _writer_schema(schemas, schema_id, group, dead)
            if found is None:
                continue
            writer, start = found
            _decode_group(
                raw, group, start, writer, schema, max_depth, tables, dead, ignore_unknown
            )
        if not tables:
            return None, np.empty(0, np.int64), dead
        ok = np.asarray([i for _, idx in tables for i in idx], dtype=np.int64)
        table = pa.Table.from_batches([t for t, _ in tables], schema=schema)
        order = np.argsort(ok, kind="stable")
        return table.take(pa.array(order)), ok[order], dead

    return decode
