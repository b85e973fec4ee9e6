"""Ask a running daemon over HTTP (``icespool status``, ``tables``, ``dead-letters``).

The standard library's urllib: one GET with a timeout needs no dependency, and the CLI
must start fast and work without the daemon's heavy imports. Every failure becomes a
`DaemonRequestError` whose message names the URL and what to do, never a traceback.
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from icespool.config import Config
from icespool.errors import IcespoolError

__all__ = [
    "DEFAULT_TIMEOUT",
    "DaemonRequestError",
    "daemon_url",
    "fetch_status",
    "post_json",
    "read_token",
    "request_json",
]

DEFAULT_TIMEOUT = 5.0
# A listener on every address is reached through loopback from the same machine.
_WILDCARDS = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}


class DaemonRequestError(IcespoolError):
    """The daemon could not be asked (unreachable, refused, auth, bad answer)."""

    def __init__(
        self, message: str, status: int | None = None, answer: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status  # the HTTP status, when the daemon answered at all
        self.answer = answer  # its JSON body, when it sent one


def daemon_url(config: Config) -> str:
    """The base URL of the daemon that ``config`` runs (its ``[http] listen``)."""
    http = config.http
    if http.port == 0:
        raise DaemonRequestError(
            f"http.listen {http.listen!r} picks a free port at start; pass --url with the "
            "port the daemon's 'icespool listening' log line names"
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
    return request_json(base_url, "/v1/status", token=token, cafile=cafile, timeout=timeout)


def post_json(
    base_url: str,
    path: str,
    body: Mapping[str, Any],
    *,
    token: str | None = None,
    cafile: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> dict[str, Any]:
    """``POST {base_url}{path}`` with a JSON body; the JSON object it answers."""
    return request_json(base_url, path, body=body, token=token, cafile=cafile, timeout=timeout)


def request_json(
    base_url: str,
    path: str,
    *,
    body: Mapping[str, Any] | None = None,
    token: str | None = None,
    cafile: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> dict[str, Any]:
    """One request to the daemon (GET, or POST with ``body``), bounded by ``timeout``
    seconds (connect and read); its JSON object answer. Every failure is a
    `DaemonRequestError` naming the URL (``answer``: the daemon's JSON, if any)."""
    if not base_url.startswith(("http://", "https://")):
        raise DaemonRequestError(
            f"URL {base_url!r} must start with http:// or https:// (e.g. http://127.0.0.1:8080)"
        )
    url = base_url.rstrip("/") + path
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    if body is not None:
        request.data = json.dumps(body).encode()
        request.add_header("Content-Type", "application/json")
        request.method = "POST"
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    context = None
    if url.startswith("https:"):
        try:
            context = ssl.create_default_context(cafile=cafile)
        except (OSError, ssl.SSLError) as exc:
            raise DaemonRequestError(f"cannot load --cafile {cafile}: {exc}") from exc
    try:
        # The whole request, a second past the per-read timeout (which says more when it
        # fires first: connect refused or timed out).
        raw = _within(timeout + 1.0, lambda: _send(request, timeout, context))
    except urllib.error.HTTPError as exc:
        answer = _json_object(exc.read())
        raise DaemonRequestError(
            _http_problem(url, exc.code, answer, token), exc.code, answer
        ) from None
    except urllib.error.URLError as exc:
        raise DaemonRequestError(
            f"cannot reach the icespool daemon at {url}: {exc.reason}; is it running, "
            "and is this its [http] listen address (--config / --url)?"
        ) from None
    except (TimeoutError, OSError) as exc:
        # Timed out, reset, or closed unanswered (before HTTPException: RemoteDisconnected
        # is both).
        raise DaemonRequestError(
            f"no answer from the icespool daemon at {url} within {timeout:g}s: {exc}"
        ) from None
    except http.client.HTTPException as exc:  # the peer does not speak HTTP
        # repr: the peer's bytes, shown safely on one line.
        detail = f"{type(exc).__name__}: {str(exc).strip()!r}" if str(exc) else type(exc).__name__
        raise DaemonRequestError(f"{url} did not answer in HTTP: {detail}") from None
    answer = _json_object(raw)
    if answer is None:
        raise DaemonRequestError(f"{url} did not answer with a JSON object: {raw[:200]!r}")
    return answer


def _send(request: urllib.request.Request, timeout: float, context: ssl.SSLContext | None) -> bytes:
    with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
        body: bytes = response.read()
        return body


def _within(seconds: float, call: Callable[[], bytes]) -> bytes:
    """``call()``'s result, or TimeoutError after ``seconds`` in all: urllib's timeout
    bounds each socket read, so a peer trickling one byte at a time would never end.
    The call runs in a daemon thread, left behind if it overruns (the CLI exits)."""
    outcome: list[bytes | BaseException] = []
    done = threading.Event()

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:  # handed to the caller's thread
            outcome.append(exc)
        done.set()

    threading.Thread(target=run, name="icespool-request", daemon=True).start()
    if not done.wait(seconds):
        raise TimeoutError("timed out")
    result = outcome[0]
    if isinstance(result, BaseException):
        raise result
    return result


def _json_object(raw: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _http_problem(url: str, code: int, answer: dict[str, Any] | None, token: str | None) -> str:
    message = str((answer or {}).get("error", ""))
    if code == 401:
        what = "no token was sent" if token is None else "the token was refused"
        return (
            f"{url} answered 401 ({what}: {message or 'unauthorized'}); pass the token "
            "file of http.auth_token_file with --token-file, or the right --config"
        )
    if code == 403:
        return f"{url} answered 403 ({message or 'forbidden'}); this token may not do that"
    return f"{url} answered {code}: {message}".rstrip(": ")
