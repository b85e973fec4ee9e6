"""Types of the shared fixtures, importable by test modules.

Test modules must not import ``conftest``: with several conftest.py files
(tests/ and some of its folders) the name resolves to whichever pytest loaded first.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Protocol

import pytest

from icespool.config import Config
from icespool.lifecycle.service import Icespool

__all__ = [
    "REST_CATALOGS",
    "MakeConfig",
    "RestCatalogServer",
    "RunDaemon",
    "rest_catalog_server",
]

MakeConfig = Callable[..., Config]
RunDaemon = Callable[..., AbstractAsyncContextManager[tuple[Icespool, str]]]


class RestCatalogServer(Protocol):
    """An Iceberg REST catalog with its tables on S3, as the `rest_catalog` fixture hands
    it out: SeaweedFS's (support/object_store.py) or Apache Iceberg's reference server
    (support/iceberg_rest.py)."""

    @property
    def rest_port(self) -> int: ...

    @property
    def s3_port(self) -> int: ...

    def warehouse(self) -> str: ...

    def catalog_properties(
        self, warehouse: str, *, s3_endpoint: str | None = None, rest_uri: str | None = None
    ) -> dict[str, str]: ...


# The REST catalogs tests are parametrized over, and the session fixture serving each.
REST_CATALOGS = {"rest-s3": "object_store", "rest-iceberg": "iceberg_rest"}


def rest_catalog_server(name: str, request: pytest.FixtureRequest) -> RestCatalogServer:
    """The REST catalog a ``rest-s3`` (SeaweedFS) or ``rest-iceberg`` (Apache Iceberg's
    reference server, on SeaweedFS's S3) parameter names."""
    server: RestCatalogServer = request.getfixturevalue(REST_CATALOGS[name])
    return server
