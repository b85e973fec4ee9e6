"""The HTTP API on aiohttp: ingest, flush, dead-letter replay, status, metrics, probes.

_api       routes; maps domain errors to statuses; one call to the way in per request
_auth      named Bearer tokens and their scopes (tables, admin)
_conn      header and idle timeouts, connections per client IP
_encoding  request bodies' Content-Encoding, undone within the body size limit
_tls       the listener's certificate, reloaded on SIGHUP
_openapi   the OpenAPI 3 document (openapi.json), served at /v1/openapi.json
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from icespool._lazy import lazy_exports

if TYPE_CHECKING:
    from icespool.http._api import ARROW_STREAM, JSON, NDJSON, HttpServer, start_http
    from icespool.http._auth import ADMIN_TOKEN_NAME, Denied, Token, Tokens, load_tokens
    from icespool.http._openapi import OPENAPI_FILE, openapi_document
    from icespool.http._tls import load_certificate, server_context

__all__ = [
    "ADMIN_TOKEN_NAME",
    "ARROW_STREAM",
    "JSON",
    "NDJSON",
    "OPENAPI_FILE",
    "Denied",
    "HttpServer",
    "Token",
    "Tokens",
    "load_certificate",
    "load_tokens",
    "openapi_document",
    "server_context",
    "start_http",
]

# Imported when first used: see icespool._lazy.
__getattr__ = lazy_exports(
    __name__,
    {
        "icespool.http._api": (
            "ARROW_STREAM",
            "JSON",
            "NDJSON",
            "HttpServer",
            "start_http",
        ),
        "icespool.http._auth": (
            "ADMIN_TOKEN_NAME",
            "Denied",
            "Token",
            "Tokens",
            "load_tokens",
        ),
        "icespool.http._openapi": (
            "OPENAPI_FILE",
            "openapi_document",
        ),
        "icespool.http._tls": (
            "load_certificate",
            "server_context",
        ),
    },
)
