"""Keyed changes (upserts and deletes by key) for tables that declare a key.

A change batch is the table's Arrow schema with every non-key column nullable (a
delete carries only its key) plus a trailing ``_icespool_op`` int8 column: `UPSERT`
or `DELETE`. Sources decode into it (`change_schema`, `with_ops`); the writer
checks it (`conform_changes`), spools it as it comes and, per commit, keeps the last
change per key (`last_changes`). Readers of the merged state (`read_merged`,
`apply_equality_deletes`) apply the equality deletes pyiceberg's scan refuses.

    _changes   the change-batch contract (op column, change schema)
    _key       which columns Iceberg allows as a key (identifier fields)
    _conform   an upsert table's input checked whole-batch before it is acked
    _merge     last change per key; equality deletes applied to rows
    _read      a table's merged state (data files minus the deletes that apply)
"""

from daemon.cdc._changes import DELETE, OP_COLUMN, UPSERT, change_schema, with_ops
from daemon.cdc._conform import conform_changes
from daemon.cdc._key import key_type_problem
from daemon.cdc._merge import Resolved, apply_equality_deletes, last_changes
from daemon.cdc._read import read_merged

__all__ = [
    "DELETE",
    "OP_COLUMN",
    "UPSERT",
    "Resolved",
    "apply_equality_deletes",
    "change_schema",
    "conform_changes",
    "key_type_problem",
    "last_changes",
    "read_merged",
    "with_ops",
]
