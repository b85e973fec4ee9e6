"""spark-conf reads a SQL catalog's URI as SQLAlchemy's make_url does, without SQLAlchemy.

(Importing SQLAlchemy was most of `icespool spark-conf`'s start-up.) The parts a JDBC URL
takes are compared with make_url's on hand-picked and generated URIs.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from icespool.errors import SparkConfError
from icespool.spark.conf import _database_uri, jdbc_connection

URIS = [
    "sqlite:////var/lib/icespool/catalog.db",
    "sqlite:///relative/catalog.db",
    "sqlite://",
    "sqlite:///:memory:",
    "sqlite:///file:catalog.db?mode=ro&uri=true",
    "postgresql+psycopg2://icespool:s3cr3t@db.internal:5432/lake",
    "postgresql://db.internal/lake?sslmode=require&options=-c%20x%3D1",
    "postgresql://u%40x:p%2Fw%3Ad@[::1]:6543/my%20db?b=2&a=1&b=3",
    "postgresql://user@host/db?keep=&x=1",
    "postgresql://:pw@host",
    "postgresql://host:5432",
    "mysql+pymysql://u:p@h/d",
    "not a uri",
    "postgresql//host/db",
]


def _sqlalchemy(uri: str) -> tuple[object, ...] | str:
    try:
        url = make_url(uri)
    except ArgumentError:
        return "unparsable"
    query = [
        (k, v)
        for k, values in url.query.items()
        for v in ([values] if isinstance(values, str) else values)
    ]
    return (
        url.get_backend_name(),
        url.host,
        url.port,
        url.database,
        url.username,
        url.password,
        query,
    )


def _ours(uri: str) -> tuple[object, ...] | str:
    try:
        url = _database_uri(uri)
    except SparkConfError as exc:
        message = str(exc)
    else:
        return (
            url.backend,
            url.host,
            url.port,
            url.database,
            url.username,
            url.password,
            url.query,
        )
    assert message.startswith(f"catalog.uri {uri!r} is not a database URI")
    return "unparsable"


@pytest.mark.parametrize("uri", URIS)
def test_parts_are_sqlalchemys(uri: str) -> None:
    assert _ours(uri) == _sqlalchemy(uri)


_PIECE = st.text(alphabet="abz09%@:/?&=[]+-_. ", max_size=8)


@given(
    st.sampled_from(["sqlite", "postgresql", "postgresql+psycopg2", "pg-x"]),
    _PIECE,
    _PIECE,
    st.sampled_from(["", "host", "[::1]", "db.internal"]),
    st.sampled_from(["", ":5432", ":1", ":"]),
    _PIECE,
    _PIECE,
)
def test_generated_uris_part_as_sqlalchemy_parts_them(
    scheme: str, user: str, password: str, host: str, port: str, path: str, query: str
) -> None:
    credentials = f"{user}:{password}@" if user or password else ""
    uri = f"{scheme}://{credentials}{host}{port}/{path}?{query}"
    try:
        expected = _sqlalchemy(uri)
    except ValueError:  # make_url's int() of a port that is not a number
        with pytest.raises(SparkConfError, match="is not a number"):
            _database_uri(uri)
        return
    assert _ours(uri) == expected


@pytest.mark.parametrize(
    ("uri", "port"), [("postgresql://host:54x/db", "54x"), ("postgresql://host:/db", "")]
)
def test_a_port_that_is_not_a_number_is_named(uri: str, port: str) -> None:
    with pytest.raises(ValueError, match="invalid literal for int"):
        make_url(uri)  # SQLAlchemy's error here was a traceback out of spark-conf
    with pytest.raises(SparkConfError) as raised:
        jdbc_connection(uri)
    assert str(raised.value) == f"catalog.uri {uri!r}: port {port!r} is not a number"


def test_jdbc_urls() -> None:
    pg = jdbc_connection("postgresql+psycopg2://u%40x:p%2Fw@[::1]/lake?b=2&a=1&b=3")
    assert (pg.url, pg.user, pg.password) == (
        "jdbc:postgresql://[::1]:5432/lake?b=2&b=3&a=1",
        "u@x",
        "p/w",
    )
    lite = jdbc_connection("sqlite:////var/lib/icespool/catalog.db")
    assert (lite.url, lite.user, lite.password) == (
        "jdbc:sqlite:/var/lib/icespool/catalog.db",
        None,
        None,
    )
    with pytest.raises(SparkConfError, match="is not a database URI"):
        jdbc_connection("catalog.db")
