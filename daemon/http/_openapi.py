"""The OpenAPI 3 document of the HTTP API, kept as package data (``daemon/http/openapi.json``)
and served as it is at ``GET /v1/openapi.json``. Tests check it against the running
daemon (every route, every status it can answer)."""

from __future__ import annotations

import functools
from importlib.resources import files

__all__ = ["OPENAPI_FILE", "openapi_document"]

#: The document's name inside the ``icespool.http`` package.
OPENAPI_FILE = "openapi.json"


@functools.cache
def openapi_document() -> bytes:
    """The document's bytes, exactly as in the package."""
    return files("icespool.http").joinpath(OPENAPI_FILE).read_bytes()
