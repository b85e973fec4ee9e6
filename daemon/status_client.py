"""Ask a running daemon for ``GET /v1/status`` (``icespool status`` and ``icespool tables``).

The standard library's urllib: one GET with a timeout needs no dependency, and the CLI
must start fast and work without the daemon's heavy imports. Every failure becomes a
`DaemonRequestError` whose message names the URL and what to do, never a traceback.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from daemon.config import Config
from daemon.errors import IcespoolError

__all__ = ["DEFAULT_TIMEOUT", "DaemonRequestError", "daemon_url", "fetch_status", "read_token"]

DEFAULT_TIMEOUT = 5.0
# A listener on every address is reached through loopback from the same machine.
_WILDCARDS = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}


class DaemonRequestError(IcespoolError):
    """The daemon could not be asked (unreachable, refused, auth, bad answer)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status  # the HTTP status, when the daemon answered at all


def daemon_url(config: Config) -> str:
    """The base URL of the daemon that ``config`` runs (its ``[http] listen``)."""
    http = config.http
    if http.port == 0:
        raise DaemonRequestError(
            f"http.listen {http.listen!r} picks a free port at start; pass --url with the "
            "port the daemon's 'icespool ready' log line names"
        )
    host = _WILDCARDS.get(http.host, http.host)
    if ":" in host:
        host = f"[{host}]"
    # Any [http] tls_* setting means the listener speaks TLS.
    tls = any(value for key, value in http if key.startswith("tls"))
    return f"{'https' if tls else 'http'}://{host}:{http.port}"


def read_token(path: Path | str | None) -> str | None:
    if not path:
        return None
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise DaemonRequestError(f"cannot read the token file {path}: {exc}") from exc
    if not token:
        raise DaemonRequestError(f"the token file {path} is empty")
    return token


def fetch_status(
    base_url: str,
    *,
    token: str | None = None,
    cafile: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> dict[str, Any]:
    """``GET {base_url}/v1/status``, bounded by ``timeout`` seconds (connect and read)."""
    if not base_url.startswith(("http://", "https://")):
        raise DaemonRequestError(
            f"URL {base_url!r} must start with http:// or https:// (e.g. http://127.0.0.1:8080)"
        )
    url = base_url.rstrip("/") + "/v1/status"
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    context = None
    if url.startswith("https:"):
        try:
            context = ssl.create_default_context(cafile=cafile)
        except (OSError, ssl.SSLError) as exc:
            raise DaemonRequestError(f"cannot load --cafile {cafile}: {exc}") from exc
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        raise DaemonRequestError(_http_problem(url, exc, token), exc.code) from None
    except urllib.error.URLError as exc:
        raise DaemonRequestError(
            f"cannot reach the icespool daemon at {url}: {exc.reason}; is it running, "
            "and is this its [http] listen address (--config / --url)?"
        ) from None
    except (TimeoutError, OSError) as exc:  # a read that timed out, a reset connection
        raise DaemonRequestError(
            f"no answer from the icespool daemon at {url} within {timeout:g}s: {exc}"
        ) from None
    try:
        status = json.loads(body)
    except ValueError:
        status = None
    if not isinstance(status, dict):
        raise DaemonRequestError(f"{url} did not answer with a status object: {body[:200]!r}")
    return status


def _http_problem(url: str, exc: urllib.error.HTTPError, token: str | None) -> str:
    try:
        message = json.loads(exc.read()).get("error", "")
    except (ValueError, AttributeError, OSError):
        message = ""
    if exc.code == 401:
        what = "no token was sent" if token is None else "the token was refused"
        return (
            f"{url} answered 401 ({what}: {message or 'unauthorized'}); pass the token "
            "file of http.auth_token_file with --token-file, or the right --config"
        )
    if exc.code == 403:
        return f"{url} answered 403 ({message or 'forbidden'}); this token may not read status"
    return f"{url} answered {exc.code} {exc.reason}: {message}".rstrip(": ")
