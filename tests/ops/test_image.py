"""The container image, built from the Dockerfile as written and run: it serves with its
Bearer token, refuses requests without it, runs as uid 10001, and drains on SIGTERM.

The Dockerfile's base is the official Python image, which this machine cannot pull (only
package registries are reachable). It stands in for it with a root file system that
mmdebstrap makes from Debian's packages (bookworm's python3.11, as the official
``python:3.11-slim`` is bookworm too, with ``python-is-python3`` for the Dockerfile's
``python``), tagged with the Dockerfile's own base name, so ``buildah bud --pull-never``
builds every instruction unchanged. The base is cached in ``.test-tools/image/`` under a
key of its package list; the image itself is built anew on every run.

buildah runs the build and the container with chroot isolation and the host's network:
podman's and buildah's OCI runtimes (crun, runc) cannot set rlimits in this sandbox. The
tools come from Debian (``make test-deps``); a missing tool or a part that cannot start
fails the test, never skips it.
"""

from __future__ import annotations

import configparser
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.jvm import free_ports

from icespool.config import load_config

pytestmark = pytest.mark.image

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
CONTAINER_CONFIG = ROOT / "deploy/icespool-container.toml"
CACHE = ROOT / ".test-tools/image"

# The base's root file system: Debian bookworm (the official python:3.11-slim's release)
# with the packages that image adds to Debian's (ca-certificates, netbase, tzdata: pyarrow
# reads timestamptz statistics through the time zone database) and a python3 in place of
# its own build.
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = (
    "python3",
    "python3-venv",
    "python-is-python3",
    "ca-certificates",
    "netbase",
    "tzdata",
)
TAG = "localhost/icespool:test"
UID = 10001
DATA = "/var/lib/icespool"
TOKEN_PATH = "/run/secrets/icespool-token"


def _tool(name: str) -> str:
    found = shutil.which(name)
    assert found, f"{name} is not installed: `make test-deps` installs the Debian package {name}"
    return found


def _run(argv: list[str], *, timeout: float, what: str) -> str:
    """Run ``argv`` to its end; a failure fails the test with its output."""
    result = subprocess.run(
        argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, (
        f"{what} failed ({result.returncode}): {' '.join(argv)}\n"
        f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )
    return result.stdout


def _base_image_name() -> str:
    """The one image the Dockerfile's stages start from (the others start from a stage)."""
    stages: set[str] = set()
    bases: set[str] = set()
    for line in DOCKERFILE.read_text().splitlines():
        found = re.match(r"FROM\s+(\S+)(?:\s+AS\s+(\S+))?\s*$", line, re.IGNORECASE)
        if found:
            if found.group(1) not in stages:
                bases.add(found.group(1))
            if found.group(2):
                stages.add(found.group(2))
    assert len(bases) == 1, f"the Dockerfile starts from {bases}, expected one base image"
    return bases.pop()


def _base_tarball() -> Path:
    """The cached root file system tarball, made by mmdebstrap when its key changed."""
    key = hashlib.sha256(f"{SUITE} {MIRROR} apt {' '.join(BASE_PACKAGES)}".encode()).hexdigest()
    tarball = CACHE / f"base-{key[:16]}.tar"
    if tarball.exists():
        return tarball
    CACHE.mkdir(parents=True, exist_ok=True)
    partial = tarball.with_suffix(f".{os.getpid()}.partial")
    _run(
        [
            _tool("mmdebstrap"),
            "--variant=apt",
            "--format=tar",
            "--quiet",
            f"--include={','.join(BASE_PACKAGES)}",
            SUITE,
            str(partial),
            MIRROR,
        ],
        timeout=600,
        what="mmdebstrap (the stand-in base image)",
    )
    partial.replace(tarball)
    for old in CACHE.glob("base-*.tar"):
        if old != tarball:
            old.unlink(missing_ok=True)
    return tarball


def _host_pip_config(directory: Path) -> Path:
    """The host's pip settings (its config files and PIP_* variables) as one file for the
    build's RUN steps: pip there must reach the index the way pip here does (an index
    mirror, a CA bundle of its own). PIP_FIND_LINKS names host folders: left out."""
    config = configparser.ConfigParser(interpolation=None)
    files = [
        "/etc/pip.conf",
        "/etc/xdg/pip/pip.conf",
        str(Path.home() / ".pip/pip.conf"),
        str(Path.home() / ".config/pip/pip.conf"),
        os.environ.get("PIP_CONFIG_FILE", ""),
    ]
    config.read([f for f in files if f and Path(f).is_file()])
    if not config.has_section("global"):
        config.add_section("global")
    for name, value in os.environ.items():
        if name.startswith("PIP_") and name not in {"PIP_CONFIG_FILE", "PIP_FIND_LINKS"}:
            config.set("global", name.removeprefix("PIP_").lower().replace("_", "-"), value)
    path = directory / "pip.conf"
    with path.open("w") as out:
        config.write(out)
    return path


@dataclass
class Buildah:
    """buildah on a store of this test run's own (the host's is left alone)."""

    store: Path

    def argv(self, *args: str) -> list[str]:
        return [
            _tool("buildah"),
            "--root",
            str(self.store / "root"),
            "--runroot",
            str(self.store / "run"),
            # Overlay works as root here with the kernel's driver (no fuse-overlayfs);
            # it copies no layer, where vfs copies each one whole.
            "--storage-driver",
            "overlay",
            *args,
        ]

    def __call__(self, *args: str, timeout: float = 120, what: str = "buildah") -> str:
        return _run(self.argv(*args), timeout=timeout, what=what)

    def container(self, name: str) -> str:
        """A new working container of the image. buildah 1.28 mounts an anonymous volume
        over the image's VOLUME whenever `run` has more than one -v, hiding the data
        volume; the container forgets the VOLUME so the -v given is the one mounted."""
        self("from", "--quiet", "--pull-never", "--name", name, TAG)
        self("config", "--volume", f"{DATA}-", name)
        return name

    def run_argv(
        self,
        container: str,
        *command: str,
        mounts: dict[Path, str],
        env: dict[str, str] | None = None,
    ) -> list[str]:
        volumes = [f"{src}:{dst}" for src, dst in mounts.items()]
        return self.argv(
            "run",
            "--isolation",
            "chroot",
            "--network",
            "host",
            *(arg for volume in volumes for arg in ("-v", volume)),
            *(arg for item in (env or {}).items() for arg in ("--env", "=".join(item))),
            container,
            "--",
            *command,
        )


@dataclass
class Image:
    buildah: Buildah
    config: dict[str, object]
    healthcheck: list[str]


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Image]:
    """The image built from the Dockerfile as written, on the stand-in base."""
    store = tmp_path_factory.mktemp("buildah")
    buildah = Buildah(store)
    try:
        started = time.monotonic()
        tarball = _base_tarball()
        base_made = time.monotonic()
        scratch = buildah("from", "--quiet", "scratch").strip()
        buildah("add", "--quiet", scratch, str(tarball), "/", what="importing the base")
        buildah("commit", "--quiet", "--rm", scratch, f"docker.io/library/{_base_image_name()}")
        imported = time.monotonic()
        ssl = Path("/etc/ssl/certs")
        buildah(
            "bud",
            "--isolation",
            "chroot",
            "--pull-never",
            "--format",
            "docker",
            "--quiet",
            "-v",
            f"{_host_pip_config(store)}:/etc/pip.conf:ro",
            *(["-v", f"{ssl}:{ssl}:ro"] if ssl.is_dir() else []),
            "-f",
            str(DOCKERFILE),
            "-t",
            TAG,
            str(ROOT),
            timeout=900,
            what="building the Dockerfile",
        )
        built = time.monotonic()
        print(
            f"image: base {base_made - started:.1f} s, import {imported - base_made:.1f} s, "
            f"build {built - imported:.1f} s"
        )
        inspected = json.loads(buildah("inspect", "--type", "image", TAG))
        yield Image(
            buildah,
            inspected["OCIv1"]["config"],
            inspected["Docker"]["config"]["Healthcheck"]["Test"],
        )
    finally:
        with contextlib.suppress(Exception):
            buildah("rm", "--all")
        with contextlib.suppress(Exception):
            buildah("rmi", "--all", "--force")
        shutil.rmtree(store, ignore_errors=True)


def test_the_image_runs_as_uid_10001_from_its_entrypoint(image: Image) -> None:
    config = image.config
    assert config["User"] == f"{UID}:{UID}"
    assert (config["Entrypoint"], config["Cmd"]) == (["icespool"], ["run"])
    assert DATA in config["Volumes"]  # type: ignore[operator]
    assert config["StopSignal"] == "SIGTERM"
    container = image.buildah.container("icespool-ids")
    ids = _run(
        image.buildah.run_argv(
            container, "sh", "-c", "id -u; id -g; command -v icespool", mounts={}
        ),
        timeout=60,
        what="id in the container",
    ).split()
    assert ids == [str(UID), str(UID), "/opt/icespool/bin/icespool"]


def _healthz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _post(port: int, path: str, body: bytes, token: str | None) -> tuple[int, str]:
    headers = {"Content-Type": "application/x-ndjson"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=body, headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _post_accepted(port: int, path: str, body: bytes, served: Served) -> tuple[int, str]:
    """``_post`` with the token, sent again after each 503 (which carries Retry-After:
    nothing was accepted), as the API asks of its clients; 60 s at most."""
    deadline = time.monotonic() + 60
    while True:
        status, text = _post(port, path, body, served.token)
        if status != 503 or time.monotonic() > deadline:
            return status, text
        time.sleep(1.0)


def _records(ids: range) -> bytes:
    return b"".join(
        json.dumps({"event_id": i, "ts": "2026-12-01T10:00:00Z", "kind": "image"}).encode() + b"\n"
        for i in ids
    )


def _daemon_pid(parent: int) -> int | None:
    """The host pid of the daemon under the `buildah run` process ``parent``: the python
    process running /opt/icespool/bin/icespool (buildah's chroot helpers sit between)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    todo = list(children.get(parent, []))
    while todo:
        pid = todo.pop()
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if argv[:2] == [b"/opt/icespool/bin/python", b"/opt/icespool/bin/icespool"]:
                return pid
        todo += children.get(pid, [])
    return None


def test_the_healthcheck_command_runs_in_the_image(image: Image, tmp_path: Path) -> None:
    """The HEALTHCHECK's probe (the interpreter the daemon runs on: slim has no curl),
    aimed at the daemon's port, exits 0 while the daemon serves, 1 without it."""
    kind, *probe = image.healthcheck
    assert kind == "CMD" and probe[0] == "python" and ":8080/healthz" in probe[-1]
    port = free_ports(1)[0]
    probe[-1] = probe[-1].replace(":8080/", f":{port}/")
    container = image.buildah.container("icespool-health")
    refused = subprocess.run(
        image.buildah.run_argv(container, *probe, mounts={}),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode != 0
    with _served(image, tmp_path, port) as served:
        served.wait_ready()
        _run(
            image.buildah.run_argv(container, *probe, mounts={}),
            timeout=60,
            what="the HEALTHCHECK command",
        )


@dataclass
class Served:
    process: subprocess.Popen[bytes]
    log: Path
    port: int
    token: str
    data: Path

    def log_tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-40:])

    def wait_ready(self, within: float = 120) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            assert self.process.poll() is None, (
                f"the container exited with {self.process.returncode}:\n{self.log_tail()}"
            )
            with contextlib.suppress(OSError):
                if _healthz(self.port) == 200:
                    return
            time.sleep(0.3)
        raise AssertionError(f"/healthz not 200 within {within:g} s:\n{self.log_tail()}")


@contextlib.contextmanager
def _served(image: Image, tmp_path: Path, port: int) -> Iterator[Served]:
    """The image's Entrypoint + Cmd in a container, the data volume and the token file
    mounted where the image's config expects them, on ``port`` (ICESPOOL__HTTP__LISTEN)."""
    data = tmp_path / "volume"
    data.mkdir()
    # A fresh named volume takes the ownership of the image's /var/lib/icespool.
    os.chown(data, UID, UID)
    token = hashlib.sha256(os.urandom(32)).hexdigest()
    token_file = tmp_path / "icespool-token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o644)
    container = image.buildah.container(f"icespool-serve-{port}")
    command = [*image.config["Entrypoint"], *image.config["Cmd"]]  # type: ignore[misc]
    log = tmp_path / "container.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            image.buildah.run_argv(
                container,
                *command,
                mounts={data: DATA, token_file: f"{TOKEN_PATH}:ro"},
                env={"ICESPOOL__HTTP__LISTEN": f"127.0.0.1:{port}"},
            ),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield Served(process, log, port, token, data)
    finally:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            pid = _daemon_pid(process.pid)
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            process.wait(30)


def _read_ids(image: Image, data: Path) -> list[int]:
    """Every event_id in demo.events, read with pyiceberg (the image's) from the volume:
    the table's metadata holds the container's paths, so it is read where they are."""
    script = (
        "import json; from pyiceberg.catalog import load_catalog; "
        f"c = load_catalog('lake', type='sql', uri='sqlite:///{DATA}/catalog.db'); "
        "print(json.dumps(c.load_table('demo.events').scan().to_arrow()"
        ".column('event_id').to_pylist()))"
    )
    container = image.buildah.container("icespool-read")
    out = _run(
        image.buildah.run_argv(container, "python", "-c", script, mounts={data: DATA}),
        timeout=120,
        what="reading demo.events with pyiceberg",
    )
    return sorted(json.loads(out.splitlines()[-1]))


def test_the_image_serves_with_its_token_and_drains_on_sigterm(
    image: Image, tmp_path: Path
) -> None:
    """Records sent with the token are committed, a flush and the SIGTERM drain each once;
    requests without it get 401; the daemon exits 0 within the documented grace, and what
    it wrote on the volume is uid 10001's."""
    documented = re.search(
        r"# SIGTERM drains \(every table commits within (\d+) s\)", DOCKERFILE.read_text()
    )
    assert documented, "the Dockerfile no longer states the drain grace"
    grace = float(documented.group(1))
    assert load_config(CONTAINER_CONFIG).timeouts.shutdown_grace == grace

    port = free_ports(1)[0]
    with _served(image, tmp_path, port) as served:
        served.wait_ready()
        status, body = _post(port, "/v1/tables/demo.events/records", _records(range(5)), None)
        assert status == 401, body
        status, body = _post(
            port, "/v1/tables/demo.events/records", _records(range(100, 110)), "wrong"
        )
        assert status == 401, body

        for start in range(0, 300, 100):
            status, body = _post_accepted(
                port, "/v1/tables/demo.events/records", _records(range(start, start + 100)), served
            )
            assert (status, json.loads(body)) == (200, {"accepted": 100})
        status, body = _post(port, "/v1/tables/demo.events/flush", b"", served.token)
        assert status == 200 and json.loads(body)["records"] == 300, body

        # Acked and pending: the SIGTERM drain commits them.
        status, body = _post(
            port, "/v1/tables/demo.events/records", _records(range(300, 450)), served.token
        )
        assert status == 200, body
        daemon = _daemon_pid(served.process.pid)
        assert daemon is not None, f"no daemon process in the container:\n{served.log_tail()}"
        assert os.stat(f"/proc/{daemon}").st_uid == UID
        started = time.monotonic()
        os.kill(daemon, signal.SIGTERM)
        try:
            code = served.process.wait(grace)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"still running {grace:g} s after SIGTERM:\n{served.log_tail()}"
            ) from None
        took = time.monotonic() - started
        assert code == 0, f"exited with {code}:\n{served.log_tail()}"
        log = served.log.read_text()
        assert "committed demo.events: reason=shutdown records=150" in log, served.log_tail()
        complaints = [
            line for line in log.splitlines() if re.search(r'"level": "(warning|error)"', line)
        ]
        assert not complaints, "\n".join(complaints)
        print(f"image: SIGTERM drain took {took:.1f} s")

        assert _read_ids(image, served.data) == list(range(450))
        not_ours = [
            str(path)
            for path in [served.data, *served.data.rglob("*")]
            if (path.lstat().st_uid, path.lstat().st_gid) != (UID, UID)
        ]
        assert not not_ours, f"not owned by {UID}:{UID} on the volume: {not_ours[:10]}"
