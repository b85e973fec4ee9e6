"""Change bodies of ``POST /v1/tables/{t}/changes``: rows of the table's columns plus an
``"_op"`` of ``"upsert"`` or ``"delete"``, decoded whole (pyarrow) into a change batch.

The body decoders (`icespool.decode._body`, with ``changes``) read a body into
`body_schema` (the change schema with ``_op`` as text in place of the int8 op column);
`to_changes` maps ``_op`` to `UPSERT` / `DELETE` in one vectorized pass and checks what
the decode could not know row by row: an upsert carries every column the table
requires, a delete needs only its key. Also here: how a change's fault is said
(`key_error`, `no_key`) and the refusal of a change batch for a table without a key
(`refuse_changes`), which the in-process API shares.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from icespool.cdc._changes import DELETE, OP_COLUMN, UPSERT, with_ops
from icespool.errors import BadInputError, SchemaError

__all__ = [
    "HTTP_OP",
    "NO_OP",
    "OP_NAMES",
    "body_schema",
    "key_error",
    "line_of",
    "no_key",
    "refuse_changes",
    "row_of",
    "to_changes",
    "without_op",
    "without_op_column",
]

#: The column of a change body that says what the row is.
HTTP_OP: Final = "_op"
#: ``_op`` values, in op-code order (`UPSERT` = 0, `DELETE` = 1).
OP_NAMES: Final = ("upsert", "delete")
_OP_TEXT: Final = pa.field(HTTP_OP, pa.string(), nullable=False)
#: What a change body without ``_op`` is told.
NO_OP: Final = (
    "missing: every row of a change body says what it is, 'upsert' or 'delete' "
    "(send records without it to POST /records)"
)
_JSON_WS: Final = b" \t\r\n"

assert OP_NAMES.index("upsert") == UPSERT and OP_NAMES.index("delete") == DELETE


def body_schema(change_schema: pa.Schema) -> pa.Schema:
    """What a change body decodes into: ``change_schema``'s columns with ``_op`` (text,
    required) in place of the op column."""
    fields = [f for f in change_schema if f.name != OP_COLUMN]
    return pa.schema([*fields, _OP_TEXT], metadata=change_schema.metadata)


def without_op(schema: pa.Schema) -> pa.Schema:
    """``schema`` (a body's own, e.g. inferred) without ``_op``: what the table may
    evolve for."""
    index = schema.get_field_index(HTTP_OP)
    return schema if index < 0 else schema.remove(index)


def key_error(exc: SchemaError, key: Sequence[str]) -> SchemaError:
    """A decode error on a key column, said as one (reason ``missing_key`` or
    ``bad_key``, the dead-letter reasons of the same faults from Kafka)."""
    if exc.column not in key:
        return exc
    if "missing or null" in exc.problem:
        problem = exc.problem.replace("required column is missing or null", "the key is missing")
        return SchemaError(exc.column, f"{problem}; every change needs the table's key").because(
            "missing_key"
        )
    return SchemaError(exc.column, f"key column: {exc.problem}").because("bad_key")


def to_changes(
    decoded: pa.Table | pa.RecordBatch,
    schema: pa.Schema,
    key: Sequence[str],
    where: Callable[[int], str],
) -> pa.RecordBatch:
    """A change batch (`icespool.cdc.change_schema` of the table of Arrow ``schema``
    and ``key``) from ``decoded`` (in `body_schema`); ``where(row)`` says where row
    ``row`` is in the body (`` (line 3)``).

    Raises `SchemaError` naming ``_op`` (an op that is neither) or the column the table
    requires that an upsert lacks (a delete needs only its key)."""
    required = [f.name for f in schema if not f.nullable and f.name not in key]
    names = decoded.schema.names
    op_text = decoded.column(names.index(HTTP_OP))
    ops = pc.index_in(op_text, value_set=pa.array(OP_NAMES))
    if ops.null_count:
        row = pc.index(pc.is_null(ops), True).as_py()
        shown = op_text[row].as_py()
        raise SchemaError(
            HTTP_OP,
            f"unknown op {shown!r}{where(row)}; an op is 'upsert' or 'delete'",
        ).because("bad_change")
    ops = pc.cast(ops, pa.int8())
    upserts = pc.equal(ops, UPSERT)
    for name in required:
        lacking = pc.and_(upserts, pc.is_null(decoded.column(names.index(name))))
        if pc.any(lacking).as_py():
            row = pc.index(lacking, True).as_py()
            raise SchemaError(
                name,
                f"required column is missing or null in an upsert{where(row)} "
                "(a delete needs only the key)",
            )
    columns = [decoded.column(i) for i, n in enumerate(names) if n != HTTP_OP]
    rows = pa.Table.from_arrays(columns, schema=without_op(decoded.schema))
    if isinstance(ops, pa.ChunkedArray):
        ops = ops.combine_chunks()
    return with_ops(rows, ops, key)


def line_of(body: bytes) -> Callable[[int], str]:
    """``where`` for an NDJSON body: row N is its N-th non-blank line (failure path
    only: one scan of the body)."""

    def where(row: int) -> str:
        seen = -1
        for number, line in enumerate(body.split(b"\n"), start=1):
            if line.strip(_JSON_WS):
                seen += 1
                if seen == row:
                    return f" (line {number})"
        return ""

    return where


def row_of(row: int) -> str:
    """``where`` for an Arrow body: its row index."""
    return f" (row {row})"


def no_key(table: str) -> BadInputError:
    """`/changes` for an append table."""
    return BadInputError(
        f"table {table!r} has no key, so it takes no changes: POST /changes is for "
        "tables with `key = [...]` (upsert tables); append records with POST /records"
    ).because("not_upsert")


def refuse_changes(name: str, schema: pa.Schema, key: Sequence[str]) -> None:
    """A change batch (op column) for a table without a key is refused before any
    schema change: evolving or creating the table for it would make the op a column
    and keep every delete as a row."""
    if OP_COLUMN in schema.names and not key:
        raise BadInputError(
            f"column {OP_COLUMN!r} marks keyed changes (upserts and deletes), but table "
            f"{name} has no key (an append table); declare key = [...] in its [[tables]] "
            f"entry to make it an upsert table, or send rows without {OP_COLUMN!r}"
        )


def without_op_column(schema: pa.Schema) -> pa.Schema:
    """``schema`` without the op column: it is the change batch's, never a column to
    evolve the table for."""
    index = schema.get_field_index(OP_COLUMN)
    return schema if index < 0 else schema.remove(index)
