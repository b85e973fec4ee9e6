"""TLS on the HTTP listener: one server `ssl.SSLContext` for the daemon's life.

The listening socket keeps its context; a SIGHUP loads the certificate chain and key
again into that same context, so new connections get the new certificate while the
listener and the connections already open stay as they are (certificate rotation
without a restart). New files are first loaded into a scratch context: a bad pair is
refused with its key named and the running certificate stays.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from icespool.config import HttpConfig
from icespool.errors import ConfigError

__all__ = ["load_certificate", "server_context"]


def server_context(http: HttpConfig) -> ssl.SSLContext | None:
    """The listener's context for ``http`` (None without TLS); `ConfigError` naming
    ``http.tls_cert_file`` or ``http.tls_key_file`` when the pair does not load."""
    if http.tls_cert_file is None or http.tls_key_file is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    load_certificate(context, http.tls_cert_file, http.tls_key_file)
    return context


def load_certificate(context: ssl.SSLContext, cert: Path, key: Path) -> None:
    """Load ``cert`` and ``key`` into ``context``, after checking them in a scratch
    context (a failed load must not leave ``context`` half changed). Blocking, but
    small files; run it on the event loop so no handshake sees a context in change."""
    for name, path in (("http.tls_cert_file", cert), ("http.tls_key_file", key)):
        if not path.is_file():
            raise ConfigError(name, f"{path} does not exist or is not a file")
    scratch = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        scratch.load_verify_locations(cafile=cert)
    except (ssl.SSLError, OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            "http.tls_cert_file", f"{cert} does not hold a PEM certificate ({_reason(exc)})"
        ) from None
    try:
        # No password: an encrypted key must not make OpenSSL prompt on a terminal.
        scratch.load_cert_chain(cert, key, password=_no_password)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError("http.tls_key_file", _why(exc, cert, key)) from None
    context.load_cert_chain(cert, key, password=_no_password)


def _no_password() -> bytes:
    return b""


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason)
    return str(exc)


def _why(exc: BaseException, cert: Path, key: Path) -> str:
    reason = _reason(exc)
    if reason == "KEY_VALUES_MISMATCH":
        return f"the private key {key} does not belong to the certificate {cert}"
    return (
        f"{key} does not load as the PEM private key of {cert} ({reason}); an "
        "encrypted key is not supported"
    )
