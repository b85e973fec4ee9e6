"""tests/iceberg: tests of daemon/iceberg/ (the shared fixtures come from tests/conftest.py)."""

from __future__ import annotations

import pytest
from support.fixture_types import REST_CATALOGS, RestCatalogServer, rest_catalog_server


@pytest.fixture(params=list(REST_CATALOGS))
def rest_catalog(request: pytest.FixtureRequest) -> RestCatalogServer:
    """Each REST catalog the tests run against, in turn (see `rest_catalog_server`)."""
    return rest_catalog_server(request.param, request)
