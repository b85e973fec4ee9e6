"""``icespool check-config --connect`` (is the catalog reachable, are the tables there,
can the daemon write where its data files go?) and ``icespool tables --offline`` (which
tables do the config and its namespaces hold?).

Runs the same catalog loading the daemon runs at start (so a passing check means the
start will get past the catalog), then lists namespaces, looks up every configured
table (an existing one against its declared schema, with the check that would degrade
it at start), and writes, lists and deletes a probe object where data files go: an existing
table's location through that table's FileIO (so vended credentials are what is tested),
else (not for REST catalogs, which decide locations) the warehouse through the
catalog's. Each step that fails is named. Every call is bounded by ``[timeouts]``; a
catalog client those cannot reach (a Hive metastore's thrift client, say) is given up
on after ``timeout`` seconds (default: what start-up would wait).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlparse

from pyarrow.fs import FileSelector, FileType
from pyiceberg.catalog import Catalog
from pyiceberg.io import FileIO, load_file_io
from pyiceberg.table import Table

from icespool.config import Config, TableConfig, hide_secrets
from icespool.errors import CatalogError, SchemaError
from icespool.iceberg._catalog import check_compatible, load_catalog, missing_sqlite_database
from icespool.iceberg._tables import declared_schema, table_names
from icespool.iceberg._timeouts import short_error, startup_timeout
from icespool.spool import new_uuid7

__all__ = ["catalog_tables", "check_catalog"]

T = TypeVar("T")


def check_catalog(config: Config, timeout: float | None = None) -> list[str]:
    """Lines describing what was found; raises CatalogError saying what to fix."""
    lines: list[str] = _bounded(config, _probe, timeout)
    return lines


def catalog_tables(config: Config, timeout: float | None = None) -> list[tuple[str, str]]:
    """``icespool tables --offline``: (table, where it is known from), sorted by name.

    The tables the config declares (or routes dead letters to) and every table of the
    catalog namespaces those use. Read-only: nothing is created (not even a namespace).
    """
    found: list[tuple[str, str]] = _bounded(config, _list_tables, timeout)
    return found


def _bounded(config: Config, work: Callable[[Config], T], timeout: float | None) -> T:
    """Run ``work(config)`` against the catalog; give up after ``timeout`` seconds."""
    if timeout is None:
        timeout = startup_timeout(config.timeouts)
    outcome: dict[str, Any] = {}

    def probe() -> None:
        try:
            outcome["result"] = work(config)
        except Exception as exc:
            outcome["error"] = exc

    # A daemon thread: a connect that never returns must not keep the CLI from exiting.
    thread = threading.Thread(target=probe, name="check-catalog", daemon=True)
    thread.start()
    thread.join(timeout)
    name = config.catalog.name
    if thread.is_alive():
        raise CatalogError(
            f"catalog {name!r} ({config.catalog.type}) did not answer within {timeout:g} s; "
            "check catalog.uri, the network path and that the catalog service is up"
        )
    error = outcome.get("error")
    if error is not None:
        message = _hide_secrets(str(error), config)
        if isinstance(error, CatalogError):
            raise CatalogError(message) from None
        raise CatalogError(
            f"catalog {name!r} is unreachable or refused the request "
            f"({type(error).__name__}: {message}); check the [catalog] settings"
        ) from None
    result: T = outcome["result"]
    return result


def _list_tables(config: Config) -> list[tuple[str, str]]:
    declared = {t.name: "configured" for t in config.tables}
    for kafka in config.kafka:
        if kafka.dead_letter_table is not None:
            declared.setdefault(kafka.dead_letter_table, "dead letters of a [[kafka]] source")
        if kafka.table is not None:
            declared.setdefault(kafka.table, "[[kafka]] route")
    namespaces = {name.split(".", 1)[0] for name in declared}
    namespaces |= {k.table_template.split(".", 1)[0] for k in config.kafka if k.table_template}
    catalog = load_catalog(
        config.catalog.name, config.catalog.properties(), config.timeouts, create=False
    )
    try:
        listed = {name for ns in sorted(namespaces) for name in table_names(catalog, ns)}
    finally:
        _dispose(catalog)
    rows = []
    for name in sorted(set(declared) | listed):
        if name not in declared:
            rows.append((name, "in the catalog"))
        elif name in listed:
            rows.append((name, f"{declared[name]}, in the catalog"))
        else:
            rows.append((name, f"{declared[name]}, not in the catalog yet"))
    return rows


def _dispose(catalog: Any) -> None:
    engine = getattr(catalog, "engine", None)  # SqlCatalog: close its pool now
    if engine is not None:
        engine.dispose()


def _probe(config: Config) -> list[str]:
    properties = config.catalog.properties()
    # A SQLite catalog the daemon has not created yet: checked as the empty catalog it
    # would be, in memory, so that the check creates no database file.
    new_database = missing_sqlite_database(properties)
    if new_database is not None:
        properties = {**properties, "uri": "sqlite:///:memory:"}
    catalog = load_catalog(config.catalog.name, properties, config.timeouts, create=False)
    try:
        namespaces = catalog.list_namespaces()
        lines = [
            f"catalog {config.catalog.name!r} ({config.catalog.type}) is reachable: "
            f"{len(namespaces)} namespaces"
            if new_database is None
            else f"catalog {config.catalog.name!r} ({config.catalog.type}): the SQLite "
            f"database {new_database} does not exist yet; `icespool run` creates it at start"
        ]
        missing: list[str] = []
        mismatched: list[str] = []
        existing: Table | None = None
        for i, table in enumerate(config.tables):
            if catalog.table_exists(table.identifier):
                loaded = catalog.load_table(table.identifier)
                existing = existing or loaded
                problem = _schema_problem(loaded, table)
                if problem is None:
                    lines.append(f"table {table.name}: exists")
                else:
                    mismatched.append(f"tables[{i}] {table.name!r}: {problem}")
            elif table.create:
                lines.append(f"table {table.name}: missing, created at start (create = true)")
            else:
                missing.append(f"tables[{i}] {table.name!r}")
        problems = list(mismatched)
        if missing:
            problems.insert(
                0,
                f"{', '.join(missing)} not found in catalog {config.catalog.name!r} and "
                "create = false; create the table, or set create = true with a schema"
                + (
                    ""
                    if new_database is None
                    else f" (its SQLite database {new_database} does not exist: is "
                    "catalog.uri right?)"
                ),
            )
        if problems:
            raise CatalogError("\n".join(problems))
        rest = config.catalog.type.lower() == "rest"
        # A REST catalog decides where tables go and may grant access to table locations
        # only (S3 Tables, vended credentials): its warehouse root proves nothing.
        warehouse = None if rest else config.catalog.warehouse
        lines.append(_probe_storage(catalog, existing, warehouse))
        return lines
    finally:
        _dispose(catalog)


def _schema_problem(existing: Table, table: TableConfig) -> str | None:
    """Why the daemon would degrade ``table`` at start: the check `load_declared` runs
    on an existing table (``check_compatible``), or None."""
    if table.columns is None:
        return None
    try:
        check_compatible(existing.schema(), declared_schema(table), table_name=table.name)
    except SchemaError as exc:
        return exc.problem
    return None


def _probe_storage(catalog: Catalog, table: Table | None, warehouse: str | None) -> str:
    """Write, list and delete a probe object where data files go; the line to print."""
    local = urlparse(warehouse or "")
    if table is not None:
        io, location, where = table.io, f"{table.location()}/data", f"table {table.name()[-1]}"
    elif local.scheme == "file" and not os.path.isdir(local.path):
        # The probe would create it: the check creates nothing.
        return (
            f"storage: the warehouse directory {local.path} does not exist yet; "
            "`icespool run` creates it (not probed)"
        )
    elif warehouse and "://" in warehouse:
        io, location, where = load_file_io(catalog.properties, warehouse), warehouse, "warehouse"
    else:
        return (
            "storage: not probed (no configured table exists yet, and the catalog decides "
            "where its data files go); run --connect again once a table exists"
        )
    path = f"{location.rstrip('/')}/icespool-probe-{new_uuid7()}"
    keys = _STORE_KEYS.get(urlparse(location).scheme, _S3_KEYS)
    _step(f"write the probe object {path}", lambda: _write(io, path), keys)
    _step(f"list {location}", lambda: _listed(io, location, path), keys)
    _step(f"delete the probe object {path}", lambda: io.delete(path), keys)
    _step(f"check that {path} is gone", lambda: _gone(io, path), keys)
    return f"storage ({where}): wrote, listed and deleted a probe object under {location}"


# The settings that decide where a location's store is and how the daemon signs in.
_S3_KEYS = "s3.endpoint, s3.region, credentials"
_STORE_KEYS = {
    "gs": "Google Cloud Storage: the bucket, gcs.service.host, gcs.oauth2.token",
    "gcs": "Google Cloud Storage: the bucket, gcs.service.host, gcs.oauth2.token",
    "abfs": "Azure: the container, adls.account-name, adls.* credentials",
    "abfss": "Azure: the container, adls.account-name, adls.* credentials",
    "wasb": "Azure: the container, adls.account-name, adls.* credentials",
    "wasbs": "Azure: the container, adls.account-name, adls.* credentials",
}


def _step(what: str, run: Callable[[], None], keys: str) -> None:
    try:
        run()
    except CatalogError:
        raise
    except Exception as exc:
        raise CatalogError(
            f"cannot {what} ({short_error(exc)}); check the storage settings ({keys}, "
            "or the catalog's vended credentials) and the permissions on that location"
        ) from exc


def _write(io: FileIO, path: str) -> None:
    with io.new_output(path).create(overwrite=True) as out:
        out.write(b"icespool check-config --connect probe; safe to delete\n")


def _listed(io: FileIO, location: str, path: str) -> None:
    """The probe shows up in a listing of its directory (PyArrowFileIO only: the FileIO
    interface has no listing; another FileIO reads the object back instead)."""
    fs_by_scheme = getattr(io, "fs_by_scheme", None)
    parse = getattr(io, "parse_location", None)
    if fs_by_scheme is None or parse is None:
        if not io.new_input(path).exists():
            raise CatalogError(f"the probe object {path} was written but cannot be found")
        return
    scheme, netloc, directory = parse(location)
    fs = fs_by_scheme(scheme, netloc)
    _, _, wanted = parse(path)
    names = {
        info.path
        for info in fs.get_file_info(FileSelector(directory.rstrip("/"), allow_not_found=True))
        if info.type == FileType.File
    }
    if wanted not in names:
        raise CatalogError(
            f"the probe object {path} was written but a listing of {location} does not show it"
        )


def _gone(io: FileIO, path: str) -> None:
    if io.new_input(path).exists():
        raise CatalogError(f"the probe object {path} is still there after its delete")


def _hide_secrets(message: str, config: Config) -> str:
    """Drivers may echo a connection string; cut every secret we know of out of it."""
    return hide_secrets(message, config.catalog.properties())
