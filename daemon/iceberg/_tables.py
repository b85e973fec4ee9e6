"""The daemon's tables in the catalog: load a declared one, create one from its first
records or from a fixed schema, list the ones a routing template made.

Blocking (catalog calls); the service runs them in threads. Creation goes through
`ensure_table`, so replicas creating one table together end with the same table.
Every table created here gets ``defaults`` (`iceberg/_defaults.py`: manifest merging,
old metadata removal, the retention policy) under its declared properties.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException, NoSuchNamespaceError, NoSuchTableError
from pyiceberg.manifest import ManifestContent
from pyiceberg.schema import Schema
from pyiceberg.table import Table

from icespool.config import TableConfig
from icespool.errors import CatalogError, TableLayoutError
from icespool.iceberg._catalog import ensure_table
from icespool.iceberg._defaults import TABLE_DEFAULTS
from icespool.iceberg._upstream._refresh import refresh_table
from icespool.schema import (
    check_width,
    count_columns,
    infer_schema,
    key_type_problem,
    parse_partition_spec,
    parse_schema,
    parse_sort_order,
)

__all__ = [
    "check_key",
    "check_key_columns",
    "check_upsert_layout",
    "create_inferred",
    "create_with",
    "declared_schema",
    "existing_table",
    "load_declared",
    "table_names",
]

_log = logging.getLogger("icespool.tables")
_FORMAT_VERSION = "format-version"


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
    key = tuple(declared.key) if declared is not None else ()
    if declared is None or declared.columns is None:
        try:
            table = catalog.load_table(name)
        except Exception as exc:
            raise CatalogError(
                f"table {name!r} cannot be loaded ({exc}); declare its schema with "
                "create = true (or infer = true), or create it in the catalog"
            ) from exc
        return check_key(table, key, name) if key else table
    schema = declared_schema(declared)
    properties: Mapping[str, str] = declared.properties
    if key and properties.get(_FORMAT_VERSION) != "3":
        properties = {**properties, _FORMAT_VERSION: "2"}  # row-level deletes need v2
    table = ensure_table(
        catalog,
        name,
        schema,
        parse_partition_spec(schema, declared.partition_by),
        properties,
        declared.create,
        sort_order=parse_sort_order(schema, declared.sort_by),
        defaults=defaults,
    )
    return check_key(table, key, name) if key else table


def declared_schema(declared: TableConfig) -> Schema:
    """The Iceberg schema ``[[tables]] schema`` declares (its key, if any, as the
    identifier fields); `load_declared` checks an existing table against it."""
    if declared.columns is None:
        raise ValueError(f"table {declared.name!r} declares no schema")
    schema = parse_schema([c.model_dump() for c in declared.columns])
    if not declared.key:
        return schema
    return Schema(
        *schema.fields,
        schema_id=schema.schema_id,
        identifier_field_ids=[schema.find_field(column).field_id for column in declared.key],
    )


def _partition_problem(table: Table, key: Sequence[str], name: str) -> str | None:
    schema = table.schema()
    key_ids = {schema.find_field(column).field_id for column in key}
    for partition_field in table.spec().fields:
        if partition_field.source_id not in key_ids:
            source = schema.find_column_name(partition_field.source_id)
            return (
                f"table {name!r} is partitioned by {partition_field.name} of column "
                f"{source!r}, which is not a key column; an upsert table's partition must be "
                f"determined by its key {list(key)} (a key's rows would move between "
                "partitions, out of reach of its equality deletes)"
            )
    return None


def check_key_columns(table: Table, key: Sequence[str], name: str) -> None:
    """Raise `TableLayoutError` when the table lacks a key column (renamed by another
    writer: changes could not be resolved, and quarantining them would blame the
    rows)."""
    schema = table.schema()
    for column in key:
        try:
            schema.find_field(column)
        except ValueError:
            raise TableLayoutError(
                f"table {name!r} has no column {column!r} of its key {list(key)} (renamed "
                "or dropped by another writer?); rename it back, or set [[tables]] key to "
                f"the table's identifier fields {sorted(schema.identifier_field_names())} "
                "and restart"
            ) from None


def check_upsert_layout(table: Table, key: Sequence[str], name: str) -> None:
    """Raise `TableLayoutError` when the table lacks a key column (`check_key_columns`)
    or equality deletes of the key (written in the table's current partition spec)
    would miss live rows of their keys (blocking; reads the manifest list only).

    Iceberg applies an equality delete only to data files of its own spec and
    partition, or to every data file when its spec is unpartitioned. Another writer
    may change the partitioning while the daemon runs: a partition on a non-key
    column, or any partitioned spec while data files of another spec are live, would
    let upserts leave old rows of their keys (Spark shows the key twice). Position
    deletes have no such limit: each names its data file, in that file's spec.
    """
    check_key_columns(table, key, name)
    if (problem := _partition_problem(table, key, name)) is not None:
        raise TableLayoutError(problem)
    spec = table.spec()
    snapshot = table.metadata.current_snapshot()
    if spec.is_unpartitioned() or snapshot is None:
        return
    older = sorted(
        {
            manifest.partition_spec_id
            for manifest in snapshot.manifests(table.io)
            if manifest.content == ManifestContent.DATA
            and manifest.partition_spec_id != spec.spec_id
            and (manifest.added_files_count or 0) + (manifest.existing_files_count or 0) > 0
        }
    )
    if older:
        raise TableLayoutError(
            f"table {name!r} is now partitioned by spec {spec.spec_id}, but data files of "
            f"partition spec(s) {older} are live; equality deletes of spec {spec.spec_id} "
            "do not apply to them, so upserts would keep old rows of their keys. Rewrite "
            f"the table into the current spec (Spark: CALL <catalog>.system."
            f"rewrite_data_files(table => '{name}', options => map('rewrite-all', 'true'))"
            "); the held-back changes then commit"
        )


def check_key(table: Table, key: Sequence[str], name: str) -> Table:
    """``table`` as an upsert table with ``key``, or `CatalogError` naming the table.

    The table must be format v2 or later (row-level deletes), its key columns required, of a
    type Iceberg allows as an identifier field, and its partition source columns key
    columns. Its identifier fields must be the key; a table without any gets the key
    as its identifier fields here (one schema commit, logged), so Spark and other
    engines see the same key the daemon upserts by.
    """
    version = table.metadata.format_version
    if version < 2:
        raise CatalogError(
            f"table {name!r} is format v{version}, but an upsert table (key = "
            f"{list(key)}) needs format v2 for its equality deletes; upgrade it (Spark: "
            f"ALTER TABLE {name} SET TBLPROPERTIES ('format-version'='2')) or remove key"
        )
    schema = table.schema()
    for column in key:
        try:
            field = schema.find_field(column)
        except ValueError:
            raise CatalogError(
                f"table {name!r} has no column {column!r} of its key {list(key)}; fix key"
            ) from None
        if not field.required:
            raise CatalogError(
                f"table {name!r}: key column {column!r} is optional in the table; key "
                "columns must be required (make it NOT NULL, or choose another key)"
            )
        if (problem := key_type_problem(field.field_type)) is not None:
            raise CatalogError(f"table {name!r}: key column {column!r}: {problem}")
    if (problem := _partition_problem(table, key, name)) is not None:
        raise CatalogError(problem)
    current = set(schema.identifier_field_names())
    if current == set(key):
        return table
    if current:
        raise CatalogError(
            f"table {name!r} has identifier fields {sorted(current)}, but its [[tables]] key "
            f"is {list(key)}; make them the same (Spark: ALTER TABLE {name} SET IDENTIFIER "
            "FIELDS ...)"
        )
    try:
        with table.update_schema() as update:
            update.set_identifier_fields(*key)
    except CommitFailedException:
        refresh_table(table)  # another replica set them first: check what it set
        return check_key(table, key, name)
    _log.info(
        "table %s had no identifier fields; set them to its key %s",
        name,
        ", ".join(key),
        extra={"table": name},
    )
    return table


def create_inferred(
    catalog: Catalog,
    name: str,
    incoming: pa.Schema,
    declared: TableConfig | None,
    defaults: Mapping[str, str] = TABLE_DEFAULTS,
    *,
    max_columns: int,
) -> Table:
    """``name`` created for records shaped like ``incoming`` (with the declaration's
    partitioning, sort order and properties); another replica's table is used as is.
    A schema wider than ``max_columns`` is refused (`SchemaChangeError`), as evolving
    the table to it would be."""
    existing = existing_table(catalog, name)
    if existing is not None:
        return existing
    schema = infer_schema(incoming)
    # Every column is new here, so none is named (as for inference's own limits).
    check_width(name, count_columns(schema.fields), max_columns, "?")
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
