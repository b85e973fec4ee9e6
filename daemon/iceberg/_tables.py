"""The daemon's tables in the catalog: load a declared one, create one from its first
records or from a fixed schema, list the ones a routing template made.

Blocking (catalog calls); the service runs them in threads. Creation goes through
`ensure_table`, so replicas creating one table together end with the same table.
Every table created here gets ``defaults`` (`iceberg/_defaults.py`: manifest merging,
old metadata removal, the retention policy) under its declared properties.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError
from pyiceberg.schema import Schema
from pyiceberg.table import Table

from daemon.config import TableConfig
from daemon.errors import CatalogError
from daemon.iceberg._catalog import ensure_table
from daemon.iceberg._defaults import TABLE_DEFAULTS
from daemon.schema import infer_schema, parse_partition_spec, parse_schema, parse_sort_order

__all__ = ["create_inferred", "create_with", "existing_table", "load_declared", "table_names"]


def existing_table(catalog: Catalog, name: str) -> Table | None:
    """``name`` if the catalog has it."""
    try:
        return catalog.load_table(name)
    except NoSuchTableError:
        return None


def load_declared(
    catalog: Catalog,
    name: str,
    declared: TableConfig | None,
    defaults: Mapping[str, str] = TABLE_DEFAULTS,
) -> Table:
    """A table as ``[[tables]]`` declares it: created when missing and ``create = true``,
    checked against the declared schema; without a schema, it must exist."""
    if declared is None or declared.columns is None:
        try:
            return catalog.load_table(name)
        except Exception as exc:
            raise CatalogError(
                f"table {name!r} cannot be loaded ({exc}); declare its schema with "
                "create = true (or infer = true), or create it in the catalog"
            ) from exc
    schema = parse_schema([c.model_dump() for c in declared.columns])
    return ensure_table(
        catalog,
        name,
        schema,
        parse_partition_spec(schema, declared.partition_by),
        declared.properties,
        declared.create,
        sort_order=parse_sort_order(schema, declared.sort_by),
        defaults=defaults,
    )


def create_inferred(
    catalog: Catalog,
    name: str,
    incoming: pa.Schema,
    declared: TableConfig | None,
    defaults: Mapping[str, str] = TABLE_DEFAULTS,
) -> Table:
    """``name`` created for records shaped like ``incoming`` (with the declaration's
    partitioning, sort order and properties); another replica's table is used as is."""
    existing = existing_table(catalog, name)
    if existing is not None:
        return existing
    schema = infer_schema(incoming)
    return ensure_table(
        catalog,
        name,
        schema,
        parse_partition_spec(schema, declared.partition_by if declared else []),
        declared.properties if declared else {},
        True,
        sort_order=parse_sort_order(schema, declared.sort_by if declared else []),
        defaults=defaults,
    )


def create_with(
    catalog: Catalog, name: str, schema: Schema, defaults: Mapping[str, str] = TABLE_DEFAULTS
) -> Table:
    """``name`` with a schema of the daemon's own (the dead-letter table's)."""
    return ensure_table(
        catalog, name, schema, parse_partition_spec(schema, []), {}, True, defaults=defaults
    )


def table_names(catalog: Catalog, namespace: str) -> list[str]:
    """The tables of ``namespace`` as ``namespace.table`` (none when it is missing)."""
    try:
        return [".".join(identifier) for identifier in catalog.list_tables(namespace)]
    except NoSuchNamespaceError:
        return []
