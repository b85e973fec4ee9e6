"""Where Avro writer schemas come from: a Confluent-compatible schema registry (by the
schema id each value's wire header carries) or one ``.avsc`` file.

A schema id the registry does not know, or a registry that does not answer after a
few tries, is `SchemaUnavailable`: the decoder makes its records dead letters with
reason ``schema_unavailable``.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Final

from icespool.decode._avro_schema import WriterSchema, load_schema_file, parse_writer_schema
from icespool.runtime.retry import retry

if TYPE_CHECKING:
    from icespool.config import KafkaConfig

__all__ = ["AvroSchemas", "FileSchema", "RegistrySchemas", "SchemaUnavailable", "avro_schemas"]

_log = logging.getLogger("icespool.kafka")

#: Registry lookups: tries and the pauses between them (``schema_registry_timeout``
#: bounds each request).
_TRIES: Final = 3
_BACKOFF: Final = (0.25, 0.75)
#: A failed lookup is not repeated for this long: a stream of records with an unknown
#: id must not wait for the retries in every fetch batch.
_FAILURE_TTL: Final = 5.0


class SchemaUnavailable(Exception):
    """A writer schema cannot be had; ``reason`` is the dead-letter reason."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


class AvroSchemas:
    """Where writer schemas come from. ``framed``: values carry the Confluent header."""

    framed: bool = True

    def get(self, schema_id: int) -> WriterSchema:
        raise NotImplementedError

    def fixed(self) -> WriterSchema:
        raise NotImplementedError


class FileSchema(AvroSchemas):
    """The schema of an ``.avsc`` file, read again when the file changes."""

    framed = False

    def __init__(self, path: Path) -> None:
        self._path = path
        self._changed = self._mtime()
        self._schema = load_schema_file(path)

    def fixed(self) -> WriterSchema:
        changed = self._mtime()
        if changed != self._changed:
            self._schema = load_schema_file(self._path)
            self._changed = changed
        return self._schema

    def _mtime(self) -> int | None:
        try:
            return self._path.stat().st_mtime_ns
        except OSError:
            return None  # a missing file fails in load_schema_file, by name


class _RegistryFailed(Exception):
    """One failed request to the registry: what went wrong, and whether to ask again."""

    def __init__(self, error: str, *, again: bool) -> None:
        super().__init__(error)
        self.error = error
        self.again = again


class RegistrySchemas(AvroSchemas):
    """A blocking client of a Confluent-compatible registry (``GET /schemas/ids/{id}``)
    with an in-process cache by id. Safe to share between threads."""

    framed = True

    def __init__(
        self,
        url: str,
        username: str | None = None,
        password: str | None = None,
        timeout: float = 2.0,
    ) -> None:
        self.url = url.rstrip("/")
        self._timeout = timeout
        self._headers = {"Accept": "application/vnd.schemaregistry.v1+json, application/json"}
        if username is not None:
            token = base64.b64encode(f"{username}:{password or ''}".encode()).decode()
            self._headers["Authorization"] = f"Basic {token}"
        self._schemas: dict[int, WriterSchema] = {}
        self._failed: dict[int, tuple[float, SchemaUnavailable]] = {}
        self._lock = threading.Lock()

    def get(self, schema_id: int) -> WriterSchema:
        with self._lock:
            found = self._schemas.get(schema_id)
            if found is not None:
                return found
            failed = self._failed.get(schema_id)
            if failed is not None and time.monotonic() < failed[0]:
                raise failed[1]
        try:
            schema = self._fetch(schema_id)
        except SchemaUnavailable as exc:
            with self._lock:
                self._failed[schema_id] = (time.monotonic() + _FAILURE_TTL, exc)
            raise
        with self._lock:
            self._failed.pop(schema_id, None)
            self._schemas[schema_id] = schema
        return schema

    def _fetch(self, schema_id: int) -> WriterSchema:
        label = f"schema id {schema_id}"
        tries = 0

        def request() -> bytes:
            nonlocal tries
            tries += 1
            try:
                return self._request(f"{self.url}/schemas/ids/{schema_id}")
            except urllib.error.HTTPError as exc:
                detail = _error_detail(exc)
                error = f"the registry answered {exc.code}{': ' + detail if detail else ''}"
                # Credentials do not fix themselves within seconds.
                raise _RegistryFailed(error, again=exc.code not in (401, 403)) from None
            except (OSError, ValueError, http.client.HTTPException) as exc:  # refused, timeouts
                error = f"the registry is unreachable: {getattr(exc, 'reason', exc)}"
                raise _RegistryFailed(error, again=True) from None

        try:
            body = retry(
                request,
                attempts=_TRIES,
                retryable=lambda exc: isinstance(exc, _RegistryFailed) and exc.again,
                pause=lambda number, _: _BACKOFF[min(number - 1, len(_BACKOFF) - 1)],
            )
        except _RegistryFailed as exc:
            # Rejected credentials end the retries after one try: say how many were made.
            made = "1 try" if tries == 1 else f"{tries} tries"
            _log.warning("Avro %s is unavailable after %s: %s", label, made, exc.error)
            raise SchemaUnavailable(
                "schema_unavailable", f"{label} unavailable after {made}: {exc.error}"
            ) from None
        try:
            answer = json.loads(body)
            kind = answer.get("schemaType", "AVRO")
            text = answer["schema"]
        except (ValueError, KeyError, TypeError, AttributeError):
            raise SchemaUnavailable(
                "invalid", f"{label}: the registry's answer has no 'schema'"
            ) from None
        if kind != "AVRO":
            raise SchemaUnavailable("invalid", f"{label} is a {kind} schema, not Avro")
        try:
            return parse_writer_schema(text, label)
        except ValueError as exc:
            raise SchemaUnavailable("invalid", str(exc)) from None

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


def avro_schemas(config: KafkaConfig) -> AvroSchemas:
    """The schema source of a ``[[kafka]]`` section with format "avro"; its source
    keeps it (and the registry cache in it) for as long as it runs."""
    if config.avro_schema_file is not None:
        return FileSchema(config.avro_schema_file)
    if config.schema_registry_url is not None:
        return RegistrySchemas(
            config.schema_registry_url,
            config.schema_registry_username,
            config.schema_registry_password,
            config.schema_registry_timeout,
        )
    raise ValueError("format 'avro' needs schema_registry_url or avro_schema_file")
