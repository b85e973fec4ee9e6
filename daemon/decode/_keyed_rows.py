"""Reading a change record's parts into rows: its JSON value (the envelope or row) and
its Kafka key (JSON, or UTF-8 text) for `icespool.decode._keyed`; Avro ones are
`icespool.decode._avro.avro_rows`. Each is a `RowReader`: whole-array pyarrow calls,
bisected only around bad records."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from icespool.decode._connect import ConnectTypes
from icespool.decode._decoded import DeadRecord, RowReader, Rows
from icespool.decode._json_values import dead_record
from icespool.decode._locate import split_failures
from icespool.decode._ndjson import decode_ndjson_lenient
from icespool.decode._plan import JsonOptions
from icespool.decode._records import Binary
from icespool.decode._screen import too_deep_values

__all__ = ["json_envelopes", "json_keys", "key_schema", "string_keys"]

_SCALAR_OPEN: Final = pa.scalar(b'{"v":', pa.binary())
_SCALAR_CLOSE: Final = pa.scalar(b"}", pa.binary())
_NOTHING: Final = pa.scalar(b"", pa.binary())


def key_schema(schema: pa.Schema, key: Sequence[str]) -> pa.Schema:
    """The key columns (nullable: a key lacking one is found after the decode)."""
    return pa.schema([schema.field(k).with_nullable(True) for k in key])


def json_envelopes(options: JsonOptions, *, ignore_unknown: bool) -> RowReader:
    """Values (JSON) -> envelope rows through the daemon's lenient NDJSON decode
    (one pyarrow.json call; bisection only around bad records)."""
    options = replace(options, ignore_unknown=ignore_unknown)

    def decode(values: Binary, indices: npt.NDArray[np.int64], schema: pa.Schema) -> Rows:
        return _lenient(values.take(pa.array(indices)), indices, schema, options)

    return decode


def _lenient(
    values: Binary, indices: npt.NDArray[np.int64], schema: pa.Schema, options: JsonOptions
) -> Rows:
    """``values`` (the records' at ``indices``) through the lenient NDJSON decode."""
    dead: list[DeadRecord] = []
    keep = np.ones(len(values), dtype=bool)
    deep = too_deep_values(values, options.max_depth)
    if deep:  # found by one scan rather than by bisecting down to them
        for j, problem in deep.items():
            keep[j] = False
            dead.append(DeadRecord(int(indices[j]), "too_deep", problem))
        values = values.filter(pa.array(keep))
    at = indices[keep]
    if not len(values):
        return None, at[:0], dead
    result = decode_ndjson_lenient(values.to_pylist(), schema, options)
    ok = np.ones(len(values), dtype=bool)
    for error in result.errors:
        ok[error.index] = False
        dead.append(dead_record(int(at[error.index]), error))
    return result.table, at[ok], dead


def json_keys(
    key: Sequence[str], schema: pa.Schema, options: JsonOptions, *, connect: bool = False
) -> RowReader:
    """JSON Kafka keys -> key columns: an object of the key columns (Kafka Connect's
    ``{"schema":..,"payload":{..}}`` envelope allowed) or, for a one-column key, a
    JSON scalar. Objects and scalars are told apart by their first byte and each
    kind decoded in one call. ``connect``: objects' Kafka Connect schemas say how the
    columns are spelled (`ConnectTypes`, as for Debezium's values)."""
    keys = key_schema(schema, key)
    enveloped = "payload" not in key and "schema" not in key
    objects = pa.schema(
        [*keys, pa.field("payload", pa.struct(list(keys)))] if enveloped else list(keys)
    )
    scalar = pa.schema([pa.field("v", keys.field(0).type)]) if len(key) == 1 else None
    options = replace(options, ignore_unknown=True)
    read_objects = json_envelopes(options, ignore_unknown=True)
    if connect:
        read_objects = ConnectTypes(read_objects, options, keys=True)

    def decode(values: Binary, indices: npt.NDArray[np.int64], _: pa.Schema) -> Rows:
        picked = values.take(pa.array(indices))
        first = _first_bytes(picked)
        is_object = first == ord("{")
        parts: list[tuple[pa.Table, npt.NDArray[np.int64]]] = []
        dead: list[DeadRecord] = []
        if is_object.any():
            table, at, bad = read_objects(values, indices[is_object], objects)
            dead += bad
            if table is not None:
                if enveloped:
                    table = _unwrap_payload(table, keys)
                parts.append((table, at))
        rest = ~is_object
        if rest.any():
            if scalar is None:
                dead += [
                    DeadRecord(
                        int(i),
                        "bad_key",
                        f"the Kafka key is not a JSON object; a key of {len(key)} columns "
                        f"({', '.join(key)}) needs an object of them",
                    )
                    for i in indices[rest]
                ]
            else:
                # A scalar S becomes {"v":S}: one decode with the column's JSON rules.
                wrapped = pc.binary_join_element_wise(
                    _SCALAR_OPEN, picked.filter(pa.array(rest)), _SCALAR_CLOSE, _NOTHING
                )
                table, at, bad = _lenient(wrapped, indices[rest], scalar, options)
                named = f"column {key[0]!r}"
                dead += [
                    replace(d, column=key[0], error=d.error.replace("column 'v'", named))
                    if d.column == "v"
                    else d
                    for d in bad
                ]
                if table is not None:
                    parts.append((table.rename_columns(list(keys.names)), at))
        return _merge(parts, keys, dead)

    return decode


def _first_bytes(values: Binary) -> npt.NDArray[np.int64]:
    """The first non-whitespace byte of each value (-1: none), from the buffers."""
    if values.type != pa.binary():  # e.g. large_binary: the offsets below are int32
        values = values.cast(pa.binary())
    out = np.full(len(values), -1, dtype=np.int64)
    if not len(values):
        return out
    offsets = np.frombuffer(values.buffers()[1], dtype=np.int32)[
        values.offset : values.offset + len(values) + 1
    ]
    data = values.buffers()[2]
    body = np.frombuffer(data, dtype=np.uint8) if data is not None else np.empty(0, np.uint8)
    starts = offsets[:-1].astype(np.int64)
    ends = offsets[1:].astype(np.int64)
    has = ends > starts
    out[has] = body[starts[has]]
    # Leading whitespace is rare in keys: those few are looked at one by one.
    for j in np.flatnonzero(np.isin(out, (0x20, 0x09, 0x0A, 0x0D))):
        rest = bytes(body[starts[j] : ends[j]]).lstrip(b" \t\r\n")
        out[j] = rest[0] if rest else -1
    return out


def _unwrap_payload(table: pa.Table, keys: pa.Schema) -> pa.Table:
    """Key columns from the envelope's ``payload`` where a record has one."""
    payload = table.column("payload").combine_chunks()
    inner = payload.flatten()
    has = pc.is_valid(payload)
    columns = [
        pc.if_else(has, inner[i], table.column(name).combine_chunks())
        for i, name in enumerate(keys.names)
    ]
    return pa.Table.from_arrays(columns, schema=keys)


def _merge(
    parts: list[tuple[pa.Table, npt.NDArray[np.int64]]],
    schema: pa.Schema,
    dead: list[DeadRecord],
) -> Rows:
    if not parts:
        return None, np.empty(0, np.int64), dead
    table = pa.concat_tables([t.cast(schema) for t, _ in parts])
    at = np.concatenate([a for _, a in parts])
    order = np.argsort(at, kind="stable")
    return table.take(pa.array(order)), at[order], dead


def string_keys(key: Sequence[str], schema: pa.Schema) -> RowReader:
    """Kafka keys as UTF-8 text: the one key column, cast to its type."""
    keys = key_schema(schema, key)

    def decode(values: Binary, indices: npt.NDArray[np.int64], _: pa.Schema) -> Rows:
        if len(key) != 1:
            return (
                None,
                np.empty(0, np.int64),
                [
                    DeadRecord(
                        int(i),
                        "bad_key",
                        f"key_format 'string' gives one column; the key has {len(key)} "
                        f'({", ".join(key)}): use key_format = "json"',
                    )
                    for i in indices
                ],
            )
        picked = values.take(pa.array(indices))
        target = keys.field(0).type

        def cast(part: Sequence[int]) -> pa.Array:
            return picked.take(pa.array(part, pa.int64())).cast(pa.string()).cast(target)

        done, failed = split_failures(
            range(len(indices)), cast, (pa.ArrowInvalid, pa.ArrowNotImplementedError)
        )
        dead = [
            DeadRecord(
                int(indices[j]),
                "bad_key",
                f"does not convert to {key[0]!r} ({target}): {_first_line(exc)}",
                key[0],
            )
            for j, exc in failed
        ]
        parts = [
            (pa.table([array], schema=keys), indices[np.asarray(part, np.int64)])
            for array, part in done
        ]
        return _merge(parts, keys, dead)

    return decode


def _first_line(exc: Exception) -> str:
    return str(exc).split("\n", 1)[0]
