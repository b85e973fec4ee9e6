"""The suite's PostgreSQL: 127.0.0.1:5432, user ``postgres``, trust authentication on
loopback (`make test-deps` installs and starts it, tests/support/postgres_up.sh).

    with admin() as cursor:                    # autocommit, on the ``postgres`` database
        cursor.execute('CREATE DATABASE "x"')
    with scratch_database("icespool_test") as name:   # created, dropped afterwards
        ...
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg2  # type: ignore[import-untyped]

__all__ = ["PG", "admin", "create_database", "drop_database", "scratch_database", "sqlalchemy_uri"]

PG: dict[str, Any] = {"host": "127.0.0.1", "port": 5432, "user": "postgres"}


@contextmanager
def admin() -> Iterator[Any]:
    """A cursor on the server's ``postgres`` database, autocommit (CREATE/DROP DATABASE
    run outside a transaction), closed afterwards."""
    conn = psycopg2.connect(dbname="postgres", connect_timeout=10, **PG)
    conn.autocommit = True
    try:
        with conn.cursor() as cursor:
            yield cursor
    finally:
        conn.close()


def create_database(prefix: str) -> str:
    """A new database named ``<prefix>_<random>``; returns its name."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with admin() as cursor:
        cursor.execute(f'CREATE DATABASE "{name}"')
    return name


def drop_database(name: str) -> None:
    """Drop ``name``, whoever is still connected to it."""
    with admin() as cursor:
        cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def scratch_database(prefix: str) -> Iterator[str]:
    """`create_database`, dropped on the way out."""
    name = create_database(prefix)
    try:
        yield name
    finally:
        drop_database(name)


def sqlalchemy_uri(database: str) -> str:
    """The SQLAlchemy URI of ``database`` (pyiceberg's SQL catalog ``uri``)."""
    return f"postgresql+psycopg2://{PG['user']}@{PG['host']}:{PG['port']}/{database}"
