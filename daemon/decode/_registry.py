"""The one client of a Confluent-compatible schema registry, for every format.

`SchemaRegistry` fetches a schema by the id a value's wire header carries (``GET
/schemas/ids/{id}``) and the schemas it references (``GET
/subjects/{subject}/versions/{version}``), with the same tries, pauses, timeouts,
credentials and error words for each; `CachedSchemas` keeps what a format parsed
from each id, and remembers a failure for a few seconds. A schema id the registry
does not know, or a registry that does not answer after a few tries, is
`SchemaUnavailable`: the decoders make its records dead letters with reason
``schema_unavailable``.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

from icespool.runtime.retry import retry

__all__ = [
    "CachedSchemas",
    "Reference",
    "RegistryAnswer",
    "SchemaRegistry",
    "SchemaUnavailable",
]

_log = logging.getLogger("icespool.kafka")

#: Registry lookups: tries and the pauses between them (``schema_registry_timeout``
#: bounds each request).
_TRIES: Final = 3
_BACKOFF: Final = (0.25, 0.75)
#: A failed lookup is not repeated for this long: a stream of records with an unknown
#: id must not wait for the retries in every fetch batch.
_FAILURE_TTL: Final = 5.0

T = TypeVar("T")


class SchemaUnavailable(Exception):
    """A writer schema cannot be had; ``reason`` is the dead-letter reason."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class Reference:
    """A schema another one imports: its import name, and where the registry keeps it."""

    name: str
    subject: str
    version: int


@dataclass(frozen=True, slots=True)
class RegistryAnswer:
    """One schema as the registry holds it: ``kind`` AVRO, PROTOBUF or JSON."""

    label: str  # "schema id 7", or the reference's name, for messages
    kind: str
    text: str
    references: tuple[Reference, ...]


class _RegistryFailed(Exception):
    """One failed request to the registry: what went wrong, and whether to ask again."""

    def __init__(self, error: str, *, again: bool) -> None:
        super().__init__(error)
        self.error = error
        self.again = again


class SchemaRegistry:
    """A blocking client of a Confluent-compatible registry. ``format`` names the wire
    format in its log lines ("Avro"). Safe to share between threads."""

    def __init__(
        self,
        url: str,
        username: str | None = None,
        password: str | None = None,
        timeout: float = 2.0,
        *,
        format: str = "Avro",
    ) -> None:
        self.url = url.rstrip("/")
        self.format = format
        self._timeout = timeout
        self._headers = {"Accept": "application/vnd.schemaregistry.v1+json, application/json"}
        if username is not None:
            token = base64.b64encode(f"{username}:{password or ''}".encode()).decode()
            self._headers["Authorization"] = f"Basic {token}"

    def schema(self, schema_id: int) -> RegistryAnswer:
        """The schema of ``schema_id``; SchemaUnavailable when it cannot be had."""
        return self._answer(f"schema id {schema_id}", f"/schemas/ids/{schema_id}")

    def referenced(self, reference: Reference) -> RegistryAnswer:
        """The schema ``reference`` names (a version of a subject)."""
        subject = urllib.parse.quote(reference.subject, safe="")
        return self._answer(
            f"reference {reference.name!r} ({reference.subject} version {reference.version})",
            f"/subjects/{subject}/versions/{reference.version}",
        )

    def _answer(self, label: str, path: str) -> RegistryAnswer:
        body = self._get(label, path)
        try:
            answer = json.loads(body)
            kind = str(answer.get("schemaType", "AVRO"))
            text = answer["schema"]
            references = tuple(
                Reference(str(r["name"]), str(r["subject"]), int(r["version"]))
                for r in answer.get("references") or ()
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            raise SchemaUnavailable(
                "invalid", f"{label}: the registry's answer has no 'schema'"
            ) from None
        if not isinstance(text, str):
            raise SchemaUnavailable("invalid", f"{label}: the registry's answer has no 'schema'")
        return RegistryAnswer(label, kind, text, references)

    def _get(self, label: str, path: str) -> bytes:
        tries = 0

        def request() -> bytes:
            nonlocal tries
            tries += 1
            try:
                return self._request(f"{self.url}{path}")
            except urllib.error.HTTPError as exc:
                detail = _error_detail(exc)
                error = f"the registry answered {exc.code}{': ' + detail if detail else ''}"
                # Credentials do not fix themselves within seconds.
                raise _RegistryFailed(error, again=exc.code not in (401, 403)) from None
            except (OSError, ValueError, http.client.HTTPException) as exc:  # refused, timeouts
                error = f"the registry is unreachable: {getattr(exc, 'reason', exc)}"
                raise _RegistryFailed(error, again=True) from None

        try:
            return retry(
                request,
                attempts=_TRIES,
                retryable=lambda exc: isinstance(exc, _RegistryFailed) and exc.again,
                pause=lambda number, _: _BACKOFF[min(number - 1, len(_BACKOFF) - 1)],
            )
        except _RegistryFailed as exc:
            # Rejected credentials end the retries after one try: say how many were made.
            made = "1 try" if tries == 1 else f"{tries} tries"
            _log.warning("%s %s is unavailable after %s: %s", self.format, label, made, exc.error)
            raise SchemaUnavailable(
                "schema_unavailable", f"{label} unavailable after {made}: {exc.error}"
            ) from None

    def _request(self, url: str) -> bytes:
        request = urllib.request.Request(url, headers=self._headers)
        with urllib.request.urlopen(request, timeout=self._timeout) as response:
            body: bytes = response.read()
            return body


def _error_detail(exc: urllib.error.HTTPError) -> str:
    try:
        body = exc.read(2048)
        message = json.loads(body).get("message")
        return str(message) if message else ""
    except Exception:  # any body at all: the status code says enough
        return ""


class CachedSchemas(Generic[T]):
    """What ``parse`` makes of each schema id's answer (a format's writer schema), by
    id, for the life of the source; a failure is remembered for a few seconds.
    ``parse`` may fetch the schemas the answer references from ``registry``; it raises
    SchemaUnavailable (reason ``invalid`` for a schema it cannot use)."""

    framed: bool = True

    def __init__(
        self, registry: SchemaRegistry, parse: Callable[[RegistryAnswer, SchemaRegistry], T]
    ) -> None:
        self.registry = registry
        self._parse = parse
        self._schemas: dict[int, T] = {}
        self._failed: dict[int, tuple[float, SchemaUnavailable]] = {}
        self._lock = threading.Lock()

    def get(self, schema_id: int) -> T:
        with self._lock:
            found = self._schemas.get(schema_id)
            if found is not None:
                return found
            failed = self._failed.get(schema_id)
            if failed is not None and time.monotonic() < failed[0]:
                raise failed[1]
        try:
            schema = self._parse(self.registry.schema(schema_id), self.registry)
        except SchemaUnavailable as exc:
            with self._lock:
                self._failed[schema_id] = (time.monotonic() + _FAILURE_TTL, exc)
            raise
        with self._lock:
            self._failed.pop(schema_id, None)
            self._schemas[schema_id] = schema
        return schema
