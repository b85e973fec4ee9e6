"""Keyed changes (upserts and deletes by key) for tables that declare a key.

A change batch is the table's Arrow schema with every non-key column nullable (a
delete carries only its key) plus a trailing ``_icespool_op`` int8 column: `UPSERT`
or `DELETE`. Sources decode into it (`change_schema`, `with_ops`); the writer
checks it (`conform_changes`), spools it as it comes and, per commit, keeps the last
change per key (`last_changes`). Readers of the merged state (`read_merged`,
`apply_equality_deletes`) apply the equality deletes pyiceberg's scan refuses.

    _changes   the change-batch contract (op column, change schema)
    _conform   an upsert table's input checked whole-batch before it is acked
    _merge     last change per key; equality deletes applied to rows
    _deletes   which delete files apply to which data files (Iceberg's scoping rules)
    _read      a table's merged state (data files minus the deletes that apply)
    _index     the key index: key -> (data file, position) of each live row
    _key_values  one comparable value per key (what the index stores)
    _files     key columns, positions and keys read from a table's files
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from icespool._lazy import lazy_exports

if TYPE_CHECKING:
    from icespool.cdc._changes import DELETE, OP_COLUMN, UPSERT, change_schema, with_ops
    from icespool.cdc._conform import conform_changes, spoolable
    from icespool.cdc._deletes import (
        DeleteKey,
        LiveDelete,
        LiveFiles,
        applies,
        droppable,
        live_files,
    )
    from icespool.cdc._files import (
        read_columns,
        read_optional_columns,
        read_positions,
        union_positions,
    )
    from icespool.cdc._index import (
        Change,
        IndexBehindError,
        IndexUnavailableError,
        KeyIndex,
        NewFile,
    )
    from icespool.cdc._key_values import KeyValue, key_array, key_values
    from icespool.cdc._merge import Resolved, apply_equality_deletes, last_changes
    from icespool.cdc._read import read_merged
    from icespool.iceberg._live_rows import LiveData, Located
    from icespool.schema._key import key_type_problem

__all__ = [
    "DELETE",
    "OP_COLUMN",
    "UPSERT",
    "Change",
    "DeleteKey",
    "IndexBehindError",
    "IndexUnavailableError",
    "KeyIndex",
    "KeyValue",
    "LiveData",
    "LiveDelete",
    "LiveFiles",
    "Located",
    "NewFile",
    "Resolved",
    "applies",
    "apply_equality_deletes",
    "change_schema",
    "conform_changes",
    "droppable",
    "key_array",
    "key_type_problem",
    "key_values",
    "last_changes",
    "live_files",
    "read_columns",
    "read_merged",
    "read_optional_columns",
    "read_positions",
    "spoolable",
    "union_positions",
    "with_ops",
]

# Imported when first used: see icespool._lazy.
__getattr__ = lazy_exports(
    __name__,
    {
        "icespool.cdc._changes": (
            "DELETE",
            "OP_COLUMN",
            "UPSERT",
            "change_schema",
            "with_ops",
        ),
        "icespool.cdc._conform": ("conform_changes", "spoolable"),
        "icespool.cdc._deletes": (
            "DeleteKey",
            "LiveDelete",
            "LiveFiles",
            "applies",
            "droppable",
            "live_files",
        ),
        "icespool.cdc._index": (
            "Change",
            "IndexBehindError",
            "IndexUnavailableError",
            "KeyIndex",
            "NewFile",
        ),
        "icespool.iceberg._live_rows": ("LiveData", "Located"),
        "icespool.schema._key": ("key_type_problem",),
        "icespool.cdc._files": (
            "read_columns",
            "read_optional_columns",
            "read_positions",
            "union_positions",
        ),
        "icespool.cdc._key_values": ("KeyValue", "key_array", "key_values"),
        "icespool.cdc._merge": (
            "Resolved",
            "apply_equality_deletes",
            "last_changes",
        ),
        "icespool.cdc._read": ("read_merged",),
    },
)
