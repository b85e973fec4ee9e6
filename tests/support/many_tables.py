"""A SQL catalog holding hundreds or thousands of real tables, made in about a second.

Creating a table through pyiceberg is a catalog transaction plus a metadata file,
~10-30 ms on SQLite: 1,000 tables would take most of a test's budget. Here one table
is created through pyiceberg, and every other one gets a metadata file of its own
(the same schema, its own location and uuid) and a catalog row, all rows inserted in
one transaction: exactly what `SqlCatalog.register_table` does for one table. The
tables are independent real Iceberg tables; the daemon loads and commits to them as
to any other.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import urlparse

from pyiceberg.catalog import load_catalog
from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType
from sqlalchemy import insert
from sqlalchemy.orm import Session

__all__ = ["SCHEMA", "declared_tables", "make_tables"]

#: ``id long required, v string``: the daemon harness's table schema.
SCHEMA = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "v", StringType()))


def make_tables(catalog_name: str, properties: Mapping[str, str], names: Sequence[str]) -> None:
    """Create the tables ``names`` ("namespace.table", one namespace) in the SQL catalog."""
    catalog = load_catalog(catalog_name, **properties)
    assert isinstance(catalog, SqlCatalog), "a SQL catalog (SQLite or PostgreSQL)"
    try:
        namespaces = {name.split(".", 1)[0] for name in names}
        assert len(namespaces) == 1, namespaces
        namespace = namespaces.pop()
        catalog.create_namespace_if_not_exists(namespace)
        first = catalog.create_table(names[0], SCHEMA)
        template = first.metadata
        warehouse = Path(urlparse(properties["warehouse"]).path)
        rows = []
        for name in names[1:]:
            table = name.split(".", 1)[1]
            location = warehouse / namespace / table
            (location / "metadata").mkdir(parents=True)
            metadata = template.model_copy(
                update={"location": location.as_uri(), "table_uuid": uuid.uuid4()}
            )
            path = location / "metadata" / f"00000-{uuid.uuid4()}.metadata.json"
            path.write_text(metadata.model_dump_json())
            rows.append(catalog._create_table_row(namespace, table, path.as_uri()))
        with Session(catalog.engine) as session:
            session.execute(insert(IcebergTables), rows)
            session.commit()
    finally:
        catalog.engine.dispose()


def declared_tables(names: Sequence[str]) -> list[dict[str, object]]:
    """``[[tables]]`` entries for ``names`` with the schema of `make_tables`."""
    schema = [
        {"name": "id", "type": "long", "required": True},
        {"name": "v", "type": "string"},
    ]
    return [{"name": name, "create": True, "schema": schema} for name in names]
