"""Catalog loading and table creation/validation.

Everything here blocks (catalog round trips, metadata file I/O); the daemon calls it
through ``asyncio.to_thread``.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from pyiceberg.catalog import Catalog
from pyiceberg.catalog import load_catalog as _pyiceberg_load_catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import (
    NamespaceAlreadyExistsError,
    NoSuchNamespaceError,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER, SortOrder

from icespool.config import TimeoutsConfig, hide_secrets, pyiceberg_value
from icespool.errors import CatalogError, SchemaError
from icespool.iceberg._defaults import CREATED_BY, TABLE_DEFAULTS, with_defaults
from icespool.iceberg._timeouts import catalog_properties, error_chain, short_error
from icespool.iceberg._upstream._rest import BoundedRestCatalog
from icespool.iceberg._upstream._sql import IcespoolSqlCatalog
from icespool.runtime.retry import retry
from icespool.schema import SchemaDifference, schema_diff

if TYPE_CHECKING:
    from icespool.iceberg._upstream._hive import BoundedHiveCatalog

__all__ = [
    "check_compatible",
    "ensure_table",
    "load_catalog",
    "missing_sqlite_database",
    "split_identifier",
]

_log = logging.getLogger("icespool.catalog")


def load_catalog(
    name: str,
    props: Mapping[str, str],
    timeouts: TimeoutsConfig | None = None,
    *,
    create: bool = True,
) -> Catalog:
    """Load the pyiceberg catalog ``name`` configured by ``props`` (the ``[catalog]`` table).

    For SQL catalogs on SQLite the database's directory is created first, because
    SQLite creates the file but not its parent directories, and a local warehouse
    directory likewise (not for REST catalogs). With ``create=False`` (the commands that
    only look) nothing is created: a SQLite database that does not exist raises
    `CatalogError` naming it, where connecting would create an empty one. Every call the
    catalog and its FileIO make later is bounded by ``timeouts`` (default: the
    ``[timeouts]`` defaults). A SQL catalog is pyiceberg's with the daemon's commit
    (`IcespoolSqlCatalog`: commits cost the same whatever the table's history).
    """
    timeouts = timeouts or TimeoutsConfig()
    texts = {key: str(value) for key, value in props.items() if key != "name"}
    if texts.get("type", "").lower() == "sql":
        uri = texts.get("uri", "")
        if uri.startswith("sqlite"):
            if create:
                _ensure_sqlite_directory(uri)
            else:
                _require_sqlite_database(name, uri)
    if create and texts.get("type", "").lower() != "rest":
        # A REST catalog's warehouse is the catalog's to interpret (often a name, as for
        # Polaris or Lakekeeper), never a directory of this machine.
        _ensure_local_warehouse(texts.get("warehouse", ""))
    _check_azure_file_io(texts)
    try:
        typed = {key: pyiceberg_value(key, value) for key, value in texts.items()}
    except ValueError as exc:
        raise CatalogError(f"catalog {name!r}: {exc}") from None
    properties = catalog_properties(typed, timeouts)
    kind = str(properties.get("type", "")).lower()
    hive = _hive_catalog() if kind == "hive" else None

    def load() -> Catalog:
        if kind == "rest":
            # Not through pyiceberg's load_catalog: the constructor already sends
            # requests, which only a subclass can bound (_rest).
            return BoundedRestCatalog(name, timeouts, **properties)
        if hive is not None:
            # Bounded Thrift calls, a connection per thread (_hive).
            return hive(name, timeouts, **properties)
        return _own_sql(_pyiceberg_load_catalog(name, **properties))

    try:
        return retry(load, attempts=3, retryable=_creation_race, pause=lambda n, _: 0.2 * n)
    except Exception as exc:
        raise _catalog_error(name, exc, properties) from exc


def _creation_race(exc: BaseException) -> bool:
    """SqlCatalog creates its tables on first use; replicas starting together on a new
    database race on that CREATE TABLE, and the loser sees an integrity error for a
    table that now exists: loading again finds it."""
    racing = type(exc).__name__ in ("IntegrityError", "ProgrammingError")
    return racing and "already exists" in str(exc)


def _hive_catalog() -> type[BoundedHiveCatalog]:
    """`BoundedHiveCatalog`, imported only for a Hive catalog: it needs thrift, which only
    the ``hive`` extra installs."""
    try:
        from icespool.iceberg._upstream._hive import BoundedHiveCatalog
    except ImportError as exc:
        raise CatalogError(
            f"catalog type 'hive' needs the thrift package ({exc}): install "
            "'icespool[hive]' (pip install '/path/to/icespool[hive]')"
        ) from None
    return BoundedHiveCatalog


def _own_sql(catalog: Catalog) -> Catalog:
    """pyiceberg's SqlCatalog as an IcespoolSqlCatalog with the same properties (the
    ones pyiceberg merged from its own configuration too)."""
    if type(catalog) is not SqlCatalog:
        return catalog
    own = IcespoolSqlCatalog(catalog.name, **catalog.properties)
    catalog.engine.dispose()
    return own


def _catalog_error(name: str, exc: Exception, properties: Mapping[str, str]) -> CatalogError:
    # Logged and shown in /readyz: a client that echoes a request or a URI keeps no secret.
    return CatalogError(
        hide_secrets(
            f"cannot load catalog {name!r} ({short_error(exc)}); "
            "check the [catalog] settings and that the catalog service is reachable",
            properties,
        )
    )


_AZURE_SCHEMES = ("abfs", "abfss", "wasb", "wasbs")


def _check_azure_file_io(properties: Mapping[str, str]) -> None:
    """An Azure warehouse in the canonical ``abfss://container@account.dfs.core.windows.net/``
    form needs adlfs: without it pyiceberg 0.12 falls back to PyArrowFileIO, which reads the
    ``container@account...`` part as the container name and fails on the first write with
    an error that does not say why (apache/iceberg-python#2698)."""
    parsed = urlparse(properties.get("warehouse", ""))
    if parsed.scheme not in _AZURE_SCHEMES or "@" not in parsed.netloc:
        return
    if parsed.scheme.startswith("wasb"):
        # pyiceberg 0.12's FsspecFileIO registers abfs(s) only, and pyarrow's cannot take
        # the account form: no FileIO writes there. The same account is reachable as abfss.
        container, _, host = parsed.netloc.partition("@")
        account = host.split(".", 1)[0]
        raise CatalogError(
            f"catalog.warehouse {properties['warehouse']!r}: pyiceberg 0.12 writes no "
            f"{parsed.scheme}://container@account location; use "
            f"'abfss://{container}@{account}.dfs.core.windows.net{parsed.path}' (the same "
            "storage account, through adlfs)"
        )
    if "py-io-impl" in properties or importlib.util.find_spec("adlfs") is not None:
        return
    raise CatalogError(
        f"catalog.warehouse {properties['warehouse']!r} is an Azure location with an "
        "account in it, which needs adlfs (pip install 'icespool[azure]'); pyiceberg's "
        "pyarrow FileIO only takes the container form 'abfs://container/path'"
    )


def _sqlite_file(uri: str) -> str | None:
    """The database file a SQLite URI names, or None (in memory, or a ``file:`` URI)."""
    from sqlalchemy.engine import make_url

    database = make_url(uri).database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return os.path.abspath(database)


def missing_sqlite_database(props: Mapping[str, str]) -> str | None:
    """The absolute path of the SQLite database a SQL catalog's ``props`` name, when that
    file does not exist (connecting would create it); else None."""
    uri = str(props.get("uri", ""))
    if str(props.get("type", "")).lower() != "sql" or not uri.startswith("sqlite"):
        return None
    database = _sqlite_file(uri)
    return database if database is not None and not os.path.isfile(database) else None


def _require_sqlite_database(name: str, uri: str) -> None:
    database = missing_sqlite_database({"type": "sql", "uri": uri})
    if database is not None:
        raise CatalogError(
            f"catalog {name!r}: the SQLite database {database} does not exist (catalog.uri "
            f"{uri!r}); check the path: `icespool run` creates it at its first start, this "
            "command creates nothing"
        )


def _ensure_sqlite_directory(uri: str) -> None:
    database = _sqlite_file(uri)
    if database is None:
        return
    directory = os.path.dirname(database)
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        raise CatalogError(
            f"cannot create the SQLite catalog directory {directory!r}: {exc}"
        ) from exc


def _ensure_local_warehouse(warehouse: str) -> None:
    parsed = urlparse(warehouse)
    if not warehouse or parsed.scheme not in ("", "file"):
        return
    path = parsed.path if parsed.scheme == "file" else warehouse
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise CatalogError(f"cannot create the warehouse directory {path!r}: {exc}") from exc


def split_identifier(identifier: str | tuple[str, ...]) -> tuple[tuple[str, ...], str]:
    """Split ``namespace.table`` (or a tuple) into (namespace tuple, table name)."""
    parts = tuple(identifier.split(".")) if isinstance(identifier, str) else identifier
    if len(parts) < 2 or any(not part for part in parts):
        raise CatalogError(
            f"table identifier {'.'.join(parts)!r} must be 'namespace.table' with non-empty parts"
        )
    return parts[:-1], parts[-1]


def ensure_table(
    catalog: Catalog,
    identifier: str | tuple[str, ...],
    schema: Schema,
    spec: PartitionSpec,
    properties: Mapping[str, str],
    create: bool,
    sort_order: SortOrder = UNSORTED_SORT_ORDER,
    *,
    defaults: Mapping[str, str] = TABLE_DEFAULTS,
) -> Table:
    """Load the table, creating namespace and table when ``create`` and it is missing.

    A new table gets ``spec``, ``sort_order`` and ``properties`` over ``defaults``
    (the daemon's defaults for the tables it creates: declared properties win). An
    existing table is checked against the declared ``schema`` (``check_compatible``):
    a difference that records of the declared shape cannot be written through raises
    ``SchemaError`` listing every such difference. The existing table's partition
    spec, sort order and properties are used as they are (the table, not the
    declaration, decides layout; ``apply_defaults`` adds missing defaults on opt-in).
    """
    namespace, name = split_identifier(identifier)
    full = (*namespace, name)
    props = {**with_defaults(properties, defaults), CREATED_BY: "icespool"}

    def load_or_create() -> Table:
        table = _load_existing(catalog, full)
        if table is not None:
            return table
        if not create:
            raise CatalogError(
                f"table {'.'.join(full)!r} does not exist; create it or set create = true"
            )
        table = _create(catalog, namespace, full, schema, spec, props, sort_order)
        if table is None:
            # Another replica created it between our load and create: use theirs.
            table = _load_existing(catalog, full)
        if table is None:
            raise CatalogError(f"table {'.'.join(full)!r} vanished right after it was created")
        return table

    try:
        table = load_or_create()
    except CatalogError as exc:
        if not create or not _hive_create_race(exc, catalog, full, schema, spec, sort_order, props):
            raise
        table = load_or_create()
    check_compatible(table.schema(), schema, table_name=".".join(full))
    return table


def _hive_create_race(
    exc: CatalogError,
    catalog: Catalog,
    full: tuple[str, ...],
    schema: Schema,
    spec: PartitionSpec,
    sort_order: SortOrder,
    properties: Mapping[str, str],
) -> bool:
    """Whether loading or creating ``full`` once more is worth it after ``exc``: on a Hive
    catalog, the metastore's loser of two creates of one database deletes the database's
    new directory, under a table's metadata being written (the create failed: try again)
    or after it (`BoundedHiveCatalog.restore_first_metadata` writes it back). Other
    catalogs never lose files so."""
    restore = getattr(catalog, "restore_first_metadata", None)
    if restore is None:
        return False
    try:
        restored = restore(full, schema, spec, sort_order, dict(properties))
    except Exception:
        return False  # the load's or create's own error is the one to report
    if restored is None:
        return any(isinstance(e, FileNotFoundError) for e in error_chain(exc))
    location, written = restored
    if written:
        _log.warning(
            "table %s: its first metadata file %s was missing (the Hive Metastore deletes a "
            "new database's directory when another client's create of it fails): written "
            "back from the declaration; the table had no commit yet",
            ".".join(full),
            location,
        )
    return True  # in place: written back here or by another replica


def _load_existing(catalog: Catalog, full: tuple[str, ...]) -> Table | None:
    try:
        return catalog.load_table(full)
    except (NoSuchTableError, NoSuchNamespaceError):
        return None
    except Exception as exc:
        raise CatalogError(
            f"cannot load table {'.'.join(full)!r} ({short_error(exc)}); "
            "check that the catalog is reachable"
        ) from exc


def _create(
    catalog: Catalog,
    namespace: tuple[str, ...],
    full: tuple[str, ...],
    schema: Schema,
    spec: PartitionSpec,
    properties: Mapping[str, str],
    sort_order: SortOrder,
) -> Table | None:
    try:
        _create_namespace(catalog, namespace)
        return catalog.create_table(
            full,
            schema=schema,
            partition_spec=spec,
            sort_order=sort_order,
            properties=dict(properties),
        )
    except TableAlreadyExistsError:
        return None
    except Exception as exc:
        # A catalog that checks, then inserts, reports a replica's insert in between as a
        # failure of its own (the Hive Metastore: a MetaException for the unique key);
        # then the table exists, and theirs is the one to use.
        if _exists(catalog, full):
            return None
        raise CatalogError(f"cannot create table {'.'.join(full)!r} ({short_error(exc)})") from exc


def _exists(catalog: Catalog, full: tuple[str, ...]) -> bool:
    try:
        return catalog.table_exists(full)
    except Exception:
        return False  # the create's own error is the one to report


def _create_namespace(catalog: Catalog, namespace: tuple[str, ...]) -> None:
    """Create ``namespace`` unless it exists; another replica may create it meanwhile."""
    try:
        catalog.create_namespace(namespace)
    except NamespaceAlreadyExistsError:
        pass
    except Exception:
        # SqlCatalog checks, then inserts: a replica inserting in between makes our
        # insert fail on the unique key (IntegrityError), and then the namespace exists.
        if not catalog.namespace_exists(namespace):
            raise


def check_compatible(
    existing: Schema, declared: Schema, *, table_name: str = "table"
) -> list[SchemaDifference]:
    """Compare ``declared`` with the ``existing`` table schema (see ``schema_diff``).

    Raises ``SchemaError`` naming the first offending column and listing every
    difference that declared records cannot be written through (missing column,
    incompatible type, declared-optional vs table-required, undeclared required
    column). Returns the remaining, writable differences (legal promotions, extra
    optional columns) so the caller can log them.
    """
    differences = schema_diff(existing, declared)
    blocking = [d for d in differences if not d.writable]
    if blocking:
        where = f"table {table_name}"
        listed = "; ".join(d.describe(where) for d in blocking)
        raise SchemaError(
            blocking[0].path,
            f"the declared schema does not match {where}: {listed}. Make the [[tables]] "
            "schema match the table, or change the table (ALTER TABLE)",
        )
    return [d for d in differences if d.writable]
