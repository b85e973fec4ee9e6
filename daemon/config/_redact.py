"""Secrets out of anything that gets printed or logged: check-config, /v1/status, start-up logs.

A key is secret when one of its words is a secret word (password, token, secret, ...) or it
names a key of some kind (access-key, account-key, api_key, ...). Plain "key" words such as
``key_field`` or ``partition_key`` are not secrets, and neither are keys that only point at
a secret (``auth_token_file``). Values are also scanned for URIs with a password
(``postgresql://user:pass@host``) or secret query parameters (``?password=...``).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

__all__ = [
    "REDACTED",
    "hide_secrets",
    "is_secret_key",
    "redact_config",
    "redact_uri",
    "redact_value",
]

REDACTED = "***"

_SECRET_WORDS = frozenset(
    {
        "password",
        "passwd",
        "pwd",
        "passphrase",
        "secret",
        "token",
        "credential",
        "credentials",
        "apikey",
        "authorization",
        # A custom auth header of a REST catalog (header.X-Custom-Auth, X-Auth-Key).
        "auth",
        "cookie",
        # Kafka's sasl.jaas.config embeds the password in the module options.
        "jaas",
    }
)
# "<qualifier> key" is a secret key: access-key, secret_key, account-key, s3.sse.key, ...
_KEY_QUALIFIERS = frozenset(
    {
        "access",
        "account",
        "api",
        "client",
        "encryption",
        "master",
        "private",
        "secret",
        "session",
        "shared",
        "signing",
        "sse",
        "storage",
    }
)
# Keys ending in these point at or describe a secret without being one.
_REFERENCE_WORDS = frozenset({"file", "path", "dir", "uri", "url", "endpoint", "enabled"})

_WORD_SPLIT = re.compile(r"[^a-z0-9]+")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*$")
_QUERY_PARAM = re.compile(r"(?P<sep>[?&;])(?P<name>[^=&#;]+)=(?P<value>[^&#;]*)")


def is_secret_key(key: str) -> bool:
    """Whether a config or property key names a secret value."""
    words = [w for w in _WORD_SPLIT.split(key.lower()) if w]
    if not words or words[-1] in _REFERENCE_WORDS:
        return False
    if any(w in _SECRET_WORDS for w in words):
        return True
    if words == ["key"]:
        return True
    # Azure-style connection strings carry the account key (AccountKey=...).
    if any(a == "connection" and b == "string" for a, b in itertools.pairwise(words)):
        return True
    return any(
        word == "key" and i > 0 and words[i - 1] in _KEY_QUALIFIERS for i, word in enumerate(words)
    )


def _redact_query(text: str) -> str:
    def repl(m: re.Match[str]) -> str:
        if is_secret_key(m.group("name")) and m.group("value"):
            return f"{m.group('sep')}{m.group('name')}={REDACTED}"
        return m.group(0)

    return _QUERY_PARAM.sub(repl, text) if "?" in text else text


def redact_uri(text: str) -> str:
    """``scheme://user:pass@host/...?password=x`` -> ``scheme://user:***@host/...?password=***``."""
    scheme_end = text.find("://")
    if scheme_end <= 0 or not _SCHEME.match(text[:scheme_end]):
        return _redact_query(text)
    head, rest = text[: scheme_end + 3], text[scheme_end + 3 :]
    # The userinfo ends at the last '@' before the query: unencoded passwords may hold '/'
    # or '@', and cutting at the first '/' would leave part of one in the output.
    query_at = min((i for i in (rest.find("?"), rest.find("#")) if i != -1), default=len(rest))
    at = rest.rfind("@", 0, query_at)
    if at != -1:
        userinfo = rest[:at]
        colon = userinfo.find(":")
        if colon != -1 and "/" not in userinfo[:colon] and colon + 1 < at:
            rest = f"{userinfo[: colon + 1]}{REDACTED}{rest[at:]}"
    return head + _redact_query(rest)


def redact_value(value: Any) -> Any:
    """A copy of a JSON-like value with secret keys and URI passwords replaced by ``***``."""
    if isinstance(value, Mapping):
        return {
            k: REDACTED
            if is_secret_key(str(k)) and v not in (None, "", [], {})
            else redact_value(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact_value(v) for v in value]
    if isinstance(value, str):
        return redact_uri(value)
    return value


def redact_config(data: Mapping[str, Any]) -> dict[str, Any]:
    """A config dumped as plain data (the spelling a config file uses), secrets hidden."""
    result: dict[str, Any] = redact_value(data)
    # A table's ``key`` is its list of key columns (an upsert table), not a secret
    # such as a catalog's bare ``key`` property.
    for table, declared in zip(result.get("tables", []), data.get("tables", []), strict=True):
        if "key" in declared:
            table["key"] = declared["key"]
    return result


def hide_secrets(message: str, properties: Mapping[str, Any]) -> str:
    """``message`` (a driver's or a client's error) with every secret value of
    ``properties`` (the catalog's, secret files read) and a URI password cut out: drivers
    may echo a connection string or a request. Values that are not text (the botocore
    session a Glue catalog is given) are skipped."""
    secrets: set[str] = set()
    for key, value in properties.items():
        if not isinstance(value, str):
            continue
        if value and is_secret_key(key):
            secrets.add(value)
        if value and "://" in value:
            try:
                password = urlsplit(value).password
            except ValueError:
                password = None
            if password:
                secrets.update({password, unquote(password)})
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= 3:  # shorter values would blank out ordinary words
            message = message.replace(secret, REDACTED)
    return message
