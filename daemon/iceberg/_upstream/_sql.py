"""Replaces ``SqlCatalog.commit_table`` (and the row lookup of ``SqlCatalog.load_table``):
the SQL catalog, with commits and refreshes whose cost does not grow with history.

pyiceberg's ``SqlCatalog.commit_table`` loads the table's current metadata file
(parse), applies the updates to it (then deep-copies the result), writes the new
file and swaps ``metadata_location`` in the catalog row by compare-and-swap. The
parse and the copy each touch every retained snapshot: at 2,000 snapshots they cost
~150 ms of a commit whose own work is ~15 ms (tests/bench/bench_longevity.py).

``IcespoolSqlCatalog.commit_table`` builds on the metadata the committing table
already holds instead of re-reading it: the swap is conditional on the row still
naming the file that metadata was read from, and Iceberg never rewrites a metadata
file in place, so a successful swap proves the base was the current metadata. The
requirements are checked against that same base. What differs from pyiceberg: a
commit built on a stale table fails with CommitFailedException (the caller
refreshes and retries, as every daemon commit loop does) instead of being applied
on top of whatever the catalog holds now - never less safe, only stricter.

``current_location`` is the cheap half of a refresh: the row alone, no file read.

Relies on (checked by ``_contract``): ``MetastoreCatalog._parse_metadata_version``,
``Catalog._load_file_io``, ``MetastoreCatalog._write_metadata``,
``SqlCatalog._iceberg_type_filter`` and the columns of ``IcebergTables``.
"""

from __future__ import annotations

import logging

from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import CommitTableResponse, StagedTable, Table
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.update import TableRequirement, TableUpdate
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from icespool.iceberg._upstream._metadata import apply_updates
from icespool.iceberg._upstream._v3_metadata import write_metadata

__all__ = ["IcespoolSqlCatalog", "current_location"]

_log = logging.getLogger("icespool.commit")


class IcespoolSqlCatalog(SqlCatalog):
    """pyiceberg's SQL catalog with a commit that does not re-read the table's history
    (see the module doc), and that writes v3 metadata (``_v3_metadata``). Everything else
    is pyiceberg's."""

    _write_metadata = staticmethod(write_metadata)

    def commit_table(
        self,
        table: Table,
        requirements: tuple[TableRequirement, ...],
        updates: tuple[TableUpdate, ...],
    ) -> CommitTableResponse:
        base, base_location = table.metadata, table.metadata_location
        if (
            isinstance(table, StagedTable)  # a table being created: no row to swap yet
            or not base_location
            # The swap's outcome is read from the UPDATE's row count; dialects that
            # cannot report it take pyiceberg's path (SELECT ... FOR UPDATE).
            or not self.engine.dialect.supports_sane_rowcount
        ):
            return super().commit_table(table, requirements, updates)
        for requirement in requirements:
            requirement.validate(base)  # CommitFailedException: not met
        metadata = apply_updates(base, updates, base_location)
        if metadata is base:
            return CommitTableResponse(metadata=base, metadata_location=base_location)
        version = self._parse_metadata_version(base_location) + 1
        provider = load_location_provider(metadata.location, metadata.properties)
        location = provider.new_table_metadata_file_location(version)
        io = self._load_file_io(metadata.properties, location)
        self._write_metadata(metadata, io, location)
        if not self._swap(table.name(), base_location, location):
            # Certainly not committed: the file we wrote is referenced by nothing.
            try:
                io.delete(location)
            except Exception as exc:
                _log.warning("could not delete unused metadata file %s: %s", location, exc)
            raise CommitFailedException(
                f"Table has been updated by another process: {'.'.join(table.name())}"
            )
        return CommitTableResponse(metadata=metadata, metadata_location=location)

    def _swap(self, identifier: tuple[str, ...], expected: str, location: str) -> bool:
        """Point the table's row at ``location`` if it still names ``expected``."""
        namespace = Catalog.namespace_to_string(Catalog.namespace_from(identifier))
        statement = (
            update(IcebergTables)
            .where(
                IcebergTables.catalog_name == self.name,
                IcebergTables.table_namespace == namespace,
                IcebergTables.table_name == Catalog.table_name_from(identifier),
                IcebergTables.metadata_location == expected,
            )
            .values(metadata_location=location, previous_metadata_location=expected)
        )
        with Session(self.engine) as session:
            result = session.execute(statement)
            swapped = bool(result.rowcount >= 1)  # type: ignore[attr-defined]
            session.commit()
        return swapped


def current_location(catalog: SqlCatalog, identifier: tuple[str, ...]) -> str | None:
    """The metadata location the catalog's row names for ``identifier`` (None: no row).

    The row ``SqlCatalog.load_table`` selects (pyiceberg pinned <0.13), without
    reading the file it names.
    """
    namespace = Catalog.namespace_to_string(Catalog.namespace_from(identifier))
    statement = select(IcebergTables.metadata_location).where(
        IcebergTables.catalog_name == catalog.name,
        IcebergTables.table_namespace == namespace,
        IcebergTables.table_name == Catalog.table_name_from(identifier),
    )
    # Excludes views stored in the same table by other engines, as load_table does.
    if (type_filter := catalog._iceberg_type_filter()) is not None:
        statement = statement.where(type_filter)
    with Session(catalog.engine) as session:
        location: str | None = session.scalar(statement)
    return location
