"""Overrides ``RestCatalog._config_headers`` (and wraps ``RestCatalog.commit_table``): the
REST catalog's HTTP session, a timeout on every request, an Idempotency-Key on commits.

pyiceberg's RestCatalog (pinned <0.13) sends every call through ``Session.request`` of a
``requests`` session and offers no per-request hook: its ``header.*`` properties are the
same on every request, and it passes no timeout. Its constructor already talks to the
server (the OAuth2 token, ``/v1/config``) on sessions it creates itself, so the seam is
``BoundedRestCatalog``: the one place every session of the catalog passes through right
after its creation (``_config_headers``, before any request) gets an instance override of
its ``request`` that

- bounds every request by ``(timeouts.catalog_connect, timeouts.catalog_request)`` unless
  the caller passed a timeout, and
- gives every table commit (``POST .../namespaces/{ns}/tables/{table}`` and
  ``POST .../transactions/commit``) a fresh UUIDv7 ``Idempotency-Key`` header (Iceberg
  REST spec, 1.10+): a catalog that honours it answers a replay of the same request
  with the first outcome instead of applying it again. pyiceberg's own retry of a commit
  (after refreshing an expired token) is a new request and gets a new key; the server
  refused the first one (401), so nothing is applied twice.

A commit answered with a body that is no commit response (an HTML page of a gateway in
front of the catalog, a body cut short) is an unknown outcome too: pyiceberg's parse
error is a ValueError, which the committer would take for the table rejecting the data.

The committer does not rely on the key: after an unknown outcome it refreshes the table
and looks for its segments (``_commit``), which works on every catalog. Servers announce
support with ``idempotency-key-lifetime`` in ``/v1/config``; some that do not honour it
anyway (Apache Iceberg 1.11's reference server), others ignore it (SeaweedFS).

Relies on (checked by ``_contract``): ``RestCatalog._create_session`` calling
``_config_headers(session)`` on every session it creates, before any request.
"""

from __future__ import annotations

from typing import Any

import pydantic
import requests
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.exceptions import CommitStateUnknownException
from pyiceberg.table import CommitTableResponse, Table
from pyiceberg.table.update import TableRequirement, TableUpdate

from icespool.config import TimeoutsConfig
from icespool.iceberg._rest import IDEMPOTENCY_HEADER, is_commit_request
from icespool.spool import new_uuid7

__all__ = ["BoundedRestCatalog"]


class BoundedRestCatalog(RestCatalog):
    """pyiceberg's RestCatalog whose every HTTP request is bounded by ``timeouts`` (the
    token and config requests of its constructor included) and whose table commits carry
    an Idempotency-Key."""

    def __init__(self, name: str, timeouts: TimeoutsConfig, **properties: str) -> None:
        # Set before RestCatalog.__init__, which creates sessions and sends requests.
        self._icespool_limits = (timeouts.catalog_connect, timeouts.catalog_request)
        super().__init__(name, **properties)

    def commit_table(
        self,
        table: Table,
        requirements: tuple[TableRequirement, ...],
        updates: tuple[TableUpdate, ...],
    ) -> CommitTableResponse:
        try:
            response: CommitTableResponse = super().commit_table(table, requirements, updates)
        except pydantic.ValidationError as exc:
            if exc.title != CommitTableResponse.__name__:
                raise
            # The answer to the commit is no commit response (a gateway's HTML page, a
            # body cut short): the catalog may have applied it. pyiceberg raises the
            # parse error, a ValueError, which reads as "the table rejected the data";
            # this is the REST client's own word for a lost answer (as for a 502).
            raise CommitStateUnknownException(
                f"the catalog answered the commit with something that is not a commit "
                f"response ({exc.error_count()} validation errors); it may have applied it"
            ) from exc
        return response

    def _config_headers(self, session: requests.Session) -> None:
        # Called first thing for each new session (_create_session), before its auth
        # manager fetches a token: the earliest point every session passes through.
        super()._config_headers(session)
        _bind(session, self._icespool_limits)


def _bind(session: requests.Session, limits: tuple[float, float]) -> None:
    send = session.request

    def request(method: str, url: str, **kwargs: Any) -> requests.Response:
        if kwargs.get("timeout") is None:
            kwargs["timeout"] = limits
        if is_commit_request(method, url):
            # commit_table passes the session's own header dict: never mutate it.
            headers = dict(kwargs.get("headers") or {})
            headers[IDEMPOTENCY_HEADER] = new_uuid7()
            kwargs["headers"] = headers
        return send(method, url, **kwargs)

    setattr(session, "request", request)  # noqa: B010 - an instance override
