"""Bearer tokens of the HTTP API: who may ingest into which table, who may administer.

``http.auth_token_file`` is one admin token (the contract since the first release);
``[[http.tokens]]`` adds named tokens, each with the tables it may ingest into (globs
over ``namespace.table``) and whether it is an admin (flush, /v1/status, every table).
With no token configured the API is open, as before.

Token values are read from files, compared in constant time (every configured token is
compared, whichever matches), and never logged, printed or echoed: answers and logs name
the token, never its value.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Final

from icespool.config import HttpConfig
from icespool.errors import ConfigError

__all__ = ["ADMIN_TOKEN_NAME", "Denied", "Token", "Tokens", "load_tokens"]

#: The name ``http.auth_token_file``'s token goes by in answers and logs.
ADMIN_TOKEN_NAME: Final = "auth_token_file"


@dataclass(frozen=True, slots=True)
class Token:
    """One Bearer token: ``secret`` is its value (never shown), the rest its scope."""

    name: str
    secret: bytes
    tables: tuple[str, ...] = ()
    admin: bool = False

    def may_write(self, table: str) -> bool:
        return self.admin or any(fnmatchcase(table, glob) for glob in self.tables)

    def __repr__(self) -> str:  # the dataclass repr would show the secret
        return f"Token(name={self.name!r}, tables={self.tables!r}, admin={self.admin})"


class Denied(Exception):
    """A request the tokens refuse: ``status`` 401 (who are you?) or 403 (not allowed)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Tokens:
    """The configured tokens; `replace` swaps them (SIGHUP) for the next request."""

    def __init__(self, tokens: Iterable[Token] = ()) -> None:
        self._tokens: tuple[Token, ...] = tuple(tokens)

    @property
    def enabled(self) -> bool:
        return bool(self._tokens)

    @property
    def names(self) -> list[str]:
        return [token.name for token in self._tokens]

    def replace(self, tokens: Iterable[Token]) -> None:
        self._tokens = tuple(tokens)

    def identify(self, header: str) -> Token:
        """The token an ``Authorization`` header carries; `Denied` (401) otherwise."""
        scheme, _, credentials = header.strip().partition(" ")
        if scheme.lower() != "bearer" or not credentials.strip():
            raise Denied(401, "missing 'Authorization: Bearer <token>' header")
        # surrogateescape: a header with undecodable bytes must compare unequal, not raise.
        given = credentials.strip().encode("utf-8", "surrogateescape")
        found: Token | None = None
        # Every token is compared, so the time taken does not tell which one matched.
        for token in self._tokens:
            if hmac.compare_digest(given, token.secret) and found is None:
                found = token
        if found is None:
            raise Denied(401, "wrong bearer token")
        return found

    @staticmethod
    def check_write(token: Token, table: str) -> None:
        """`Denied` (403) unless ``token`` may ingest into ``table``."""
        if not token.may_write(table):
            shown = table if len(table) <= 120 else table[:117] + "..."
            raise Denied(
                403,
                f"token {token.name!r} may not write to table {shown!r}; it may write to "
                f"{', '.join(token.tables)} (http.tokens tables)",
            )

    @staticmethod
    def check_admin(token: Token, what: str) -> None:
        """`Denied` (403) unless ``token`` is an admin token."""
        if not token.admin:
            raise Denied(
                403,
                f"token {token.name!r} is not an admin token; {what} needs one "
                "(admin = true in [[http.tokens]], or http.auth_token_file)",
            )


def load_tokens(http: HttpConfig, *, admin_file: bool = True) -> list[Token]:
    """Read every token file of ``http`` (blocking); `ConfigError` naming the key when a
    file cannot be read, is empty, or holds the same token as another entry.
    ``admin_file`` False leaves ``http.auth_token_file`` out (check-config: that file
    is only read by the daemon, as it always was)."""
    tokens: list[Token] = []
    keys: list[str] = []
    if http.auth_token_file is not None and admin_file:
        key = "http.auth_token_file"
        tokens.append(Token(ADMIN_TOKEN_NAME, _read(key, http.auth_token_file), admin=True))
        keys.append(key)
    for i, entry in enumerate(http.tokens):
        key = f"http.tokens[{i}].token_file"
        secret = _read(key, entry.token_file)
        tokens.append(Token(entry.name, secret, tuple(entry.tables), entry.admin))
        keys.append(key)
    _check_distinct(tokens, keys)
    return tokens


def _read(key: str, path: Path) -> bytes:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(key, f"cannot read the token file {path}: {reason}") from None
    if not text:
        raise ConfigError(key, f"the token file {path} is empty; put the token in it")
    if any(c.isspace() or not c.isprintable() for c in text):
        # No client can send such a token in one Authorization header.
        raise ConfigError(
            key,
            f"the token in {path} holds whitespace or control characters; put one "
            "printable token on one line",
        )
    return text.encode("utf-8")


def _check_distinct(tokens: Sequence[Token], keys: Sequence[str]) -> None:
    for i, token in enumerate(tokens):
        for j in range(i):
            if hmac.compare_digest(token.secret, tokens[j].secret):
                raise ConfigError(
                    keys[i],
                    f"holds the same token as {keys[j]}; every token must be distinct, "
                    "or the daemon cannot tell which scope applies",
                )
