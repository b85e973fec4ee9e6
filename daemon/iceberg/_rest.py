"""Which REST requests commit table changes, and the header that makes a retry of one safe.

Every table commit (``POST .../namespaces/{ns}/tables/{table}`` and ``POST
.../transactions/commit``) gets a fresh UUIDv7 ``Idempotency-Key`` header (Iceberg REST
spec, 1.10+): a catalog that honours it answers a replay of the same request with the
first outcome instead of applying it again. The session hook that adds it (and bounds
every request by the configured timeouts) is ``_upstream/_rest.BoundedRestCatalog``.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

__all__ = ["IDEMPOTENCY_HEADER", "is_commit_request"]

IDEMPOTENCY_HEADER = "Idempotency-Key"
# /v1/{prefix}/namespaces/{namespace}/tables/{table} and /v1/{prefix}/transactions/commit;
# the prefix is optional and may hold '/', a namespace is one URL-encoded segment.
_COMMIT_PATH = re.compile(r"/v1/(?:.+/)?(?:namespaces/[^/]+/tables/[^/]+|transactions/commit)$")


def is_commit_request(method: str, url: str) -> bool:
    """Whether a REST request commits table changes (gets an Idempotency-Key)."""
    path = urlsplit(url).path
    return method.upper() == "POST" and _COMMIT_PATH.search(path) is not None
