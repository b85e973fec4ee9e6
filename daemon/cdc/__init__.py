"""Keyed changes (upserts and deletes by key) for tables that declare a key.

A change batch is the table's Arrow schema with every non-key column nullable (a
delete carries only its key) plus a trailing ``_icespool_op`` int8 column: `UPSERT`
or `DELETE`. Sources decode into it (`change_schema`, `with_ops`); the writer
spools it as it comes and, per commit, keeps the last change per key. HTTP change
bodies (rows plus ``"_op": "upsert" | "delete"``) decode through `body_schema` and
`to_changes`.
"""

from daemon.cdc._body import (
    HTTP_OP,
    OP_NAMES,
    body_schema,
    key_error,
    line_of,
    no_key,
    row_of,
    to_changes,
    without_op,
)
from daemon.cdc._changes import DELETE, OP_COLUMN, UPSERT, change_schema, with_ops

__all__ = [
    "DELETE",
    "HTTP_OP",
    "OP_COLUMN",
    "OP_NAMES",
    "UPSERT",
    "body_schema",
    "change_schema",
    "key_error",
    "line_of",
    "no_key",
    "row_of",
    "to_changes",
    "with_ops",
    "without_op",
]
