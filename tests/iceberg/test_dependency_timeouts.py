"""daemon/iceberg/_timeouts.py: which timeouts each catalog client gets, what counts as an outage,
and a REST catalog whose server stops answering (a real loopback HTTP server)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
import sqlalchemy.exc
from sqlalchemy.engine import make_url

from icespool.config import TimeoutsConfig
from icespool.errors import CatalogError, CommitError
from icespool.iceberg._catalog import load_catalog
from icespool.iceberg._timeouts import catalog_properties, unavailable

_TIMEOUTS = TimeoutsConfig(
    catalog_connect=4.0, catalog_request=1.5, storage_connect=3.0, storage_request=7.0
)


def test_sqlite_catalog_waits_for_locks_at_most_the_request_timeout() -> None:
    props = catalog_properties({"type": "sql", "uri": "sqlite:////tmp/c.db"}, _TIMEOUTS)
    url = make_url(props["uri"])
    assert (url.database, url.query) == ("/tmp/c.db", {"timeout": "1.5"})
    assert (props["s3.connect-timeout"], props["s3.request-timeout"]) == ("3", "7")


def test_postgres_catalog_gets_connect_and_statement_timeouts_keeping_the_users() -> None:
    uri = "postgresql+psycopg2://u:p%40ss@db:5432/lake?sslmode=require&options=-c%20search_path%3Dx"
    url = make_url(catalog_properties({"type": "sql", "uri": uri}, _TIMEOUTS)["uri"])
    assert url.password == "p@ss"
    assert dict(url.query) == {
        "sslmode": "require",
        "connect_timeout": "4",
        "options": "-c search_path=x -c statement_timeout=1500",
    }
    # What the user wrote wins, in the URI and in the properties.
    mine = {
        "type": "sql",
        "uri": "postgresql+psycopg2://db/lake?connect_timeout=9&options=-c%20statement_timeout%3D5",
        "s3.request-timeout": "120",
    }
    props = catalog_properties(mine, _TIMEOUTS)
    assert dict(make_url(props["uri"]).query) == {
        "connect_timeout": "9",
        "options": "-c statement_timeout=5",
    }
    assert props["s3.request-timeout"] == "120"


def test_other_catalog_types_keep_their_uri() -> None:
    props = catalog_properties({"type": "rest", "uri": "http://cat:8181/"}, _TIMEOUTS)
    assert props["uri"] == "http://cat:8181/"


def test_outages_are_told_apart_from_bugs() -> None:
    operational = sqlalchemy.exc.OperationalError("SELECT 1", {}, Exception("timed out"))
    try:
        try:
            raise operational
        except sqlalchemy.exc.OperationalError as exc:
            raise CommitError("commit of segments [a] failed after 12 attempts") from exc
    except CommitError as exc:
        wrapped = exc
    assert unavailable(operational) == "the catalog"
    assert unavailable(wrapped) == "the catalog"
    assert unavailable(requests.ConnectTimeout()) == "the catalog"
    assert unavailable(ConnectionRefusedError(111, "refused")) == "the object store"
    assert (
        unavailable(OSError("AWS Error NETWORK_CONNECTION during PutObject")) == "the object store"
    )
    assert unavailable(ValueError("a bug")) is None
    assert unavailable(FileNotFoundError(2, "gone")) is None


class _RestServer(BaseHTTPRequestHandler):
    """Answers the REST catalog's config request, then never answers anything else."""

    hang = threading.Event()

    def do_GET(self) -> None:
        if self.path.startswith("/v1/config"):
            body = json.dumps({"defaults": {}, "overrides": {}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.hang.wait(30)  # silent until the test ends

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def rest_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _RestServer)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        _RestServer.hang.set()
        server.shutdown()
        server.server_close()
        _RestServer.hang.clear()


def test_rest_catalog_that_stops_answering_times_out(rest_server: str) -> None:
    catalog = load_catalog("lake", {"type": "rest", "uri": rest_server}, _TIMEOUTS)
    started = time.monotonic()
    with pytest.raises(requests.Timeout):
        catalog.list_namespaces()
    took = time.monotonic() - started
    assert _TIMEOUTS.catalog_request <= took < _TIMEOUTS.catalog_request + 2.0


@pytest.fixture
def silent_server() -> Iterator[str]:
    """Accepts connections and never answers a byte (a hung catalog or proxy)."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    closed = threading.Event()

    def accept() -> None:
        while not closed.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        closed.set()
        listener.close()
        for conn in accepted:
            conn.close()


@pytest.mark.parametrize(
    "auth",
    [{}, {"credential": "client:secret", "oauth2-server-uri": "SILENT/v1/oauth/tokens"}],
    ids=["config request", "OAuth2 token request"],
)
def test_a_rest_catalog_silent_from_its_first_request_fails_the_load_in_time(
    auth: dict[str, str], silent_server: str
) -> None:
    """RestCatalog's constructor asks for its config (and a token) before the daemon can
    reach its session: those requests must be bounded too, or a start (which waits for
    that same load again) hangs for good even after the catalog comes back."""
    outcome: dict[str, BaseException | None] = {}

    def load() -> None:
        try:
            props = {k: v.replace("SILENT", silent_server) for k, v in auth.items()}
            load_catalog("lake", {"type": "rest", "uri": silent_server, **props}, _TIMEOUTS)
            outcome["error"] = None
        except BaseException as exc:
            outcome["error"] = exc

    started = time.monotonic()
    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    loader.join(_TIMEOUTS.catalog_request + 3.0)
    assert not loader.is_alive(), "loading a silent REST catalog did not give up"
    error = outcome["error"]
    assert isinstance(error, CatalogError), error
    assert "ReadTimeout" in str(error), error
    assert time.monotonic() - started >= _TIMEOUTS.catalog_request
