"""A timeout on every call to the catalog and the object store, and what an outage looks like.

pyiceberg takes no timeout for most of its clients, so each one is set where it can be:

- SQL catalog on PostgreSQL (psycopg2): libpq ``connect_timeout`` and a server-side
  ``statement_timeout`` in the URI, plus a client-side deadline on every wait for the
  server (psycopg2's wait callback). Only the last one catches a connection that was
  accepted and then never answers (a hung proxy, a half-open TCP path): the server never
  sees those statements, and libpq itself would wait forever.
- SQL catalog on SQLite: ``timeout`` (how long to wait for another writer's lock, at
  most 5 s).
- REST catalog: (connect, read) timeouts on every request of its requests sessions, from
  the constructor's first token and config requests on (``_upstream/_rest.py``).
- FileIO: ``s3.connect-timeout`` and ``s3.request-timeout`` (pyarrow and fsspec S3), and
  ``s3.retry-strategy-impl`` = ``StorageRetries``: the AWS SDK's standard retries
  (jittered exponential backoff) with ``timeouts.storage_attempts`` attempts per call.
  A call that still fails fails its flush, which the writer retries with its own backoff
  while the spool keeps the records.
- FileIO on Google Cloud Storage (``gs://``): pyarrow's GCS client retries a failing call
  for 15 minutes by default and pyiceberg passes it no limit, so a ``gs://`` warehouse
  gets ``GcsBoundedFileIO`` as its ``py-io-impl``: pyiceberg's pyarrow FileIO whose GCS
  client gives up retrying after ``timeouts.storage_request`` (``_upstream/_gcs_io.py``).
- Glue catalog (boto3): connect and read timeouts as the default client config of the
  botocore session pyiceberg builds its Glue client on (``botocore_session``); botocore's
  own retries (``glue.max-retries``, ``glue.retry-mode``) still apply on top.
  Azure (adlfs, or pyarrow's AzureFileSystem) takes no timeout from pyiceberg's
  properties: the Azure SDK's own apply (20 s to connect, 60 s per read, 3 retries).

A setting the user wrote in ``[catalog]`` (a URI parameter or a property) wins. Calls
nothing here can bound (another catalog type's client) are bounded by the caller waiting
at most ``startup_timeout``.
"""

from __future__ import annotations

import functools
import math
import select
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlparse

import requests
import sqlalchemy.exc
from pyarrow.fs import AwsStandardS3RetryStrategy
from pyiceberg.exceptions import ServerError, ServiceUnavailableError
from sqlalchemy.engine import make_url

from icespool.config import TimeoutsConfig
from icespool.errors import CatalogError
from icespool.iceberg._upstream._gcs_io import GcsBoundedFileIO

__all__ = [
    "GcsBoundedFileIO",
    "StorageRetries",
    "catalog_properties",
    "error_chain",
    "short_error",
    "startup_timeout",
    "unavailable",
]

_S3_CONNECT = "s3.connect-timeout"
_S3_REQUEST = "s3.request-timeout"
_S3_RETRY = "s3.retry-strategy-impl"
_PY_IO_IMPL = "py-io-impl"
_GCS_SCHEMES = ("gs", "gcs")
# pyiceberg's GlueCatalog builds its boto3 session on this botocore session when given one.
_BOTOCORE_SESSION = "botocore_session"
_SQLITE_BUSY = 5.0
# (connect, every later wait) of the psycopg2 wait callback, set by catalog_properties.
_pg_deadlines = (10.0, 30.0)
_pg_installed = False


def startup_timeout(timeouts: TimeoutsConfig) -> float:
    """How long loading the catalog may take: a connect and a few statements."""
    return timeouts.catalog_connect + timeouts.catalog_request


def catalog_properties(props: Mapping[str, Any], timeouts: TimeoutsConfig) -> dict[str, Any]:
    """``props`` (the ``[catalog]`` properties) with the timeouts of ``timeouts`` added."""
    properties = dict(props)
    properties.setdefault(_S3_CONNECT, _seconds(timeouts.storage_connect))
    properties.setdefault(_S3_REQUEST, _seconds(timeouts.storage_request))
    StorageRetries.attempts = timeouts.storage_attempts
    properties.setdefault(_S3_RETRY, f"{__name__}.{StorageRetries.__name__}")
    GcsBoundedFileIO.retry_limit = timeouts.storage_request
    if urlparse(str(properties.get("warehouse", ""))).scheme in _GCS_SCHEMES:
        # pyiceberg 0.12 writes gs:// through pyarrow's FileIO only: this is the same
        # FileIO with a bounded GCS client. A py-io-impl the user wrote wins.
        # This module's name: the class is re-exported here, the path users have seen.
        properties.setdefault(_PY_IO_IMPL, f"{__name__}.{GcsBoundedFileIO.__name__}")
    uri = str(properties.get("uri", ""))
    kind = str(properties.get("type", "")).lower()
    if kind == "sql" and uri:
        properties["uri"] = _sql_uri(uri, timeouts)
    elif kind == "glue" and _BOTOCORE_SESSION not in properties:
        session = _glue_session(timeouts)
        if session is not None:
            properties[_BOTOCORE_SESSION] = session
    return properties


class StorageRetries(AwsStandardS3RetryStrategy):  # type: ignore[misc]
    """pyarrow's standard AWS retry strategy with ``timeouts.storage_attempts`` attempts.

    pyiceberg builds ``s3.retry-strategy-impl`` without arguments, so the number is a class
    attribute that ``catalog_properties`` sets (process-wide: a daemon has one catalog).
    """

    attempts = 3  # pyarrow's default

    def __init__(self) -> None:
        super().__init__(max_attempts=type(self).attempts)


def _glue_session(timeouts: TimeoutsConfig) -> Any:
    """A botocore session whose clients connect within catalog_connect and read within
    catalog_request (botocore's defaults are 60 s each); None without boto3, where
    pyiceberg's own error says which extra to install."""
    try:
        import botocore.config
        import botocore.session
    except ImportError:
        return None

    session = botocore.session.Session()
    session.set_default_client_config(
        botocore.config.Config(
            connect_timeout=timeouts.catalog_connect, read_timeout=timeouts.catalog_request
        )
    )
    return session


def error_chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what it was raised from or during, outermost first."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not seen for seen in chain):
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def unavailable(exc: BaseException) -> str | None:
    """ "the catalog" or "the object store" when ``exc`` or its cause says that dependency
    could not be reached or answered too late; None for any other error."""
    chain = error_chain(exc)
    # The object store's own errors first: a data file write that failed is wrapped in a
    # CatalogError ("cannot write data files"), which alone would read as the catalog's.
    if any(_storage_error(e) for e in chain):
        return "the object store"
    for current in chain:
        if isinstance(current, (*_CATALOG_OUTAGES, *_botocore_errors())):
            return "the catalog"
        if isinstance(current, ConnectionError | TimeoutError):
            return "the object store"
    return None


def _storage_error(exc: BaseException) -> bool:
    """An error of an object store's client: pyarrow's S3 client (the AWS SDK names
    every failure so), pyarrow's GCS client (google-cloud-cpp's status in the text) or
    the Azure SDK."""
    if isinstance(exc, OSError) and any(mark in str(exc) for mark in _STORAGE_MARKS):
        return True
    return isinstance(exc, _azure_errors())


_STORAGE_MARKS = ("AWS Error", "google::cloud::Status")


@functools.cache
def _botocore_errors() -> tuple[type[BaseException], ...]:
    """botocore's network errors (no answer, a dropped connection, a timeout). Only the Glue
    catalog talks through botocore here (S3 goes through pyarrow), so they are the catalog's.
    Empty without boto3 (the glue extra)."""
    try:
        from botocore.exceptions import ConnectionError as BotoConnectionError
        from botocore.exceptions import HTTPClientError
    except ImportError:
        return ()
    return (BotoConnectionError, HTTPClientError)


@functools.cache
def _azure_errors() -> tuple[type[BaseException], ...]:
    """The Azure SDK's errors (adlfs raises them, or a RuntimeError from them): every one is
    the store's (unreachable, refused, a missing container, no permission), never the
    rows'. Empty without the SDK (the azure extra)."""
    try:
        from azure.core.exceptions import AzureError
    except ImportError:
        return ()
    return (AzureError,)


def short_error(exc: BaseException) -> str:
    """``Type: first line``: drivers append the SQL and a help link on later lines."""
    lines = str(exc).splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


_CATALOG_OUTAGES = (
    CatalogError,
    sqlalchemy.exc.OperationalError,
    sqlalchemy.exc.InterfaceError,
    sqlalchemy.exc.TimeoutError,
    sqlalchemy.exc.DisconnectionError,
    requests.ConnectionError,
    requests.Timeout,
    ServerError,
    ServiceUnavailableError,
)


def _seconds(value: float) -> str:
    return f"{value:g}"


def _sql_uri(uri: str, timeouts: TimeoutsConfig) -> str:
    url = make_url(uri)
    query = dict(url.query)
    if url.get_backend_name() == "sqlite":
        # A lock held by another local writer, not a network wait: keep pysqlite's 5 s
        # at most, so a held lock fails a commit (retried later) instead of holding
        # its thread and lane for the whole request timeout.
        query.setdefault("timeout", _seconds(min(timeouts.catalog_request, _SQLITE_BUSY)))
    elif url.get_backend_name() == "postgresql" and url.get_driver_name() == "psycopg2":
        # libpq takes whole seconds; 0 would mean "wait forever".
        query.setdefault("connect_timeout", str(max(1, math.ceil(timeouts.catalog_connect))))
        options = str(query.get("options", ""))
        if "statement_timeout" not in options:
            ms = int(timeouts.catalog_request * 1000)
            query["options"] = f"{options} -c statement_timeout={ms}".strip()
        _install_pg_deadline(timeouts)
    else:
        return uri
    rendered: str = url.set(query=query).render_as_string(hide_password=False)
    return rendered


def _install_pg_deadline(timeouts: TimeoutsConfig) -> None:
    """Bound every psycopg2 wait (process-wide: the daemon has one catalog)."""
    global _pg_deadlines, _pg_installed
    # The client deadline is a little later than the server's statement_timeout, so a
    # slow statement ends with the server's clear error, a silent server with ours.
    _pg_deadlines = (timeouts.catalog_connect, timeouts.catalog_request + 1.0)
    if not _pg_installed:
        import psycopg2.extensions  # type: ignore[import-untyped]

        psycopg2.extensions.set_wait_callback(_pg_wait)
        _pg_installed = True


def _pg_wait(conn: Any) -> None:
    """psycopg2's wait callback (``psycopg2.extras.wait_select``) with a deadline.

    Raising closes the connection (psycopg2 cannot resume a wait), so SQLAlchemy drops
    it from the pool and the next call connects afresh.
    """
    import psycopg2
    import psycopg2.extensions as ext

    connecting = conn.status == ext.STATUS_SETUP
    limit = _pg_deadlines[0] if connecting else _pg_deadlines[1]
    deadline = time.monotonic() + limit
    while True:
        state = conn.poll()
        if state == ext.POLL_OK:
            return
        left = deadline - time.monotonic()
        if left <= 0:
            what = "connect" if connecting else "answer"
            raise psycopg2.OperationalError(
                f"the catalog database did not {what} within {limit:g} s "
                "(timeouts.catalog_connect / timeouts.catalog_request)"
            )
        if state == ext.POLL_READ:
            select.select([conn.fileno()], [], [], left)
        elif state == ext.POLL_WRITE:
            select.select([], [conn.fileno()], [], left)
        else:  # pragma: no cover - psycopg2 documents no other state
            raise psycopg2.OperationalError(f"unexpected poll state {state}")
