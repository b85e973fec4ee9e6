"""``icespool check-config --connect``: is the catalog reachable, are the tables there?

Runs the same catalog loading the daemon runs at start (so a passing check means the
start will get past the catalog), then lists namespaces and looks up every configured
table. Every call is bounded by ``[timeouts]``; a catalog client those cannot reach
(a REST endpoint that never answers its first request) is given up on after
``timeout`` seconds (default: what start-up would wait).
"""

from __future__ import annotations

import threading
from typing import Any
from urllib.parse import unquote, urlsplit

from daemon.config import REDACTED, Config, is_secret_key
from daemon.errors import CatalogError
from daemon.iceberg._catalog import load_catalog
from daemon.iceberg._timeouts import startup_timeout

__all__ = ["check_catalog"]


def check_catalog(config: Config, timeout: float | None = None) -> list[str]:
    """Lines describing what was found; raises CatalogError saying what to fix."""
    if timeout is None:
        timeout = startup_timeout(config.timeouts)
    outcome: dict[str, Any] = {}

    def probe() -> None:
        try:
            outcome["lines"] = _probe(config)
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
    lines: list[str] = outcome["lines"]
    return lines


def _probe(config: Config) -> list[str]:
    catalog = load_catalog(config.catalog.name, config.catalog.properties(), config.timeouts)
    try:
        namespaces = catalog.list_namespaces()
        lines = [
            f"catalog {config.catalog.name!r} ({config.catalog.type}) is reachable: "
            f"{len(namespaces)} namespaces"
        ]
        missing: list[str] = []
        for i, table in enumerate(config.tables):
            if catalog.table_exists(table.identifier):
                lines.append(f"table {table.name}: exists")
            elif table.create:
                lines.append(f"table {table.name}: missing, created at start (create = true)")
            else:
                missing.append(f"tables[{i}] {table.name!r}")
        if missing:
            raise CatalogError(
                f"{', '.join(missing)} not found in catalog {config.catalog.name!r} and "
                "create = false; create the table, or set create = true with a schema"
            )
        return lines
    finally:
        engine = getattr(catalog, "engine", None)  # SqlCatalog: close its pool now
        if engine is not None:
            engine.dispose()


def _hide_secrets(message: str, config: Config) -> str:
    """Drivers may echo a connection string; cut every secret we know of out of it."""
    secrets: set[str] = set()
    for key, value in config.catalog.properties().items():
        if value and is_secret_key(key):
            secrets.add(value)
    uri = config.catalog.uri or ""
    if "://" in uri:
        password = urlsplit(uri).password
        if password:
            secrets.update({password, unquote(password)})
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= 3:  # shorter values would blank out ordinary words
            message = message.replace(secret, REDACTED)
    return message
