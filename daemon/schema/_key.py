"""What Iceberg allows as a table's key (its identifier fields).

Iceberg's identifier-field rules: a key column is required, primitive, and not a
float or double (NaN and -0.0 make equality ambiguous). Equality deletes match rows
on exactly these columns, so the same rules decide what an upsert table may declare.
The op column's name lives here too: the config refuses it as a column name, and this
module stays light enough for the config to import (no pyarrow). Below the config, the
catalog code and the keyed changes, all of which check keys with it.
"""

from __future__ import annotations

from typing import Final

from pyiceberg.types import DoubleType, FloatType, IcebergType, PrimitiveType

__all__ = ["OP_COLUMN", "key_type_problem"]

#: The reserved trailing column of a change batch (never a table column).
OP_COLUMN: Final = "_icespool_op"


def key_type_problem(iceberg_type: IcebergType) -> str | None:
    """Why a column of ``iceberg_type`` cannot be a key column (None: it can)."""
    if not isinstance(iceberg_type, PrimitiveType):
        return f"a key column must be of a primitive type, not {iceberg_type}"
    if isinstance(iceberg_type, FloatType | DoubleType):
        return (
            f"a key column cannot be {iceberg_type} (NaN and -0.0 make equality ambiguous; "
            "Iceberg refuses them as identifier fields); use long, string, decimal, ..."
        )
    return None
