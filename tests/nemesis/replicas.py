"""A replica slot: one `icespool run` at a time, its spool on a small tmpfs of its own, its
wall clock under libfaketime, its disk behind the spool's file-system seam, and its
catalog and object store behind proxies of its own.

A slot outlives its processes: a kill is followed by a start on the same home; a copied
or restored spool gets a new home (a new tmpfs) and the slot's next process runs there.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from support.daemon_harness import Daemon, DaemonDir
from support.http_proxy import HttpProxy
from support.proxy import TcpProxy

from nemesis.world import Link, Warehouse

__all__ = ["FAKETIME", "Slot", "SlotSettings", "readyz"]

FAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
TMPFS_BYTES = 64 << 20


@dataclass
class FileSetting:
    """A setting a process reads from a file (libfaketime's clock, the disk's fault):
    faults stack, the latest applies, healing one goes back to the one before."""

    path: Path
    default: str
    active: list[tuple[int, str]] = field(default_factory=list)
    _next: int = 0

    def __post_init__(self) -> None:
        self.path.write_text(self.default + "\n")

    def push(self, value: str) -> int:
        self._next += 1
        self.active.append((self._next, value))
        self._write()
        return self._next

    def pop(self, token: int) -> None:
        self.active = [(t, v) for t, v in self.active if t != token]
        self._write()

    def _write(self) -> None:
        value = self.active[-1][1] if self.active else self.default
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(value + "\n")
        tmp.replace(self.path)


@dataclass(frozen=True)
class SlotSettings:
    """What every replica's config shares (the tables, the tuning of a run)."""

    first_table: str
    extra: str
    maintenance_lease: str


@dataclass
class Slot:
    index: int
    root: Path
    warehouse: Warehouse
    settings: SlotSettings
    catalog: Link = field(init=False)
    store: Link = field(init=False)
    clock: FileSetting = field(init=False)  # libfaketime's offset: "+0", "+2h", "-40m"
    disk: FileSetting = field(init=False)  # the spool seam's fault: "", "erofs", "eio"
    homes: list[DaemonDir] = field(default_factory=list)
    spares: list[DaemonDir] = field(default_factory=list)  # copies no slot process runs on
    daemon: Daemon | None = None
    # Set while a fault holds the slot's process down on purpose (no restart by the
    # supervisor), and the lock serialising what changes the slot's process.
    held_down: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _listening: set[asyncio.Task[int]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        upstream = self.warehouse.catalog_upstream()
        catalog = (
            TcpProxy(upstream) if self.warehouse.variant == "sql" else HttpProxy(upstream)
        ).__enter__()
        self.catalog = Link(catalog)
        store = self.warehouse.servers.store
        self.store = Link(HttpProxy(("127.0.0.1", store.s3_port)).__enter__())
        self.clock = FileSetting(self.root / "clock", "+0")
        self.disk = FileSetting(self.root / "disk", "")

    # ------------------------------------------------------------------ places

    @property
    def name(self) -> str:
        return f"r{self.index}"

    @property
    def home(self) -> DaemonDir:
        return self.homes[-1]

    def new_home(self) -> DaemonDir:
        """A new home with an empty tmpfs spool and the slot's config."""
        home = DaemonDir(
            self.root / f"home-{len(self.homes)}",
            catalog=self.warehouse.catalog_properties(self.catalog.port, self.store.port),
        )
        home.spool_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                "mount",
                "-t",
                "tmpfs",
                "-o",
                f"size={TMPFS_BYTES},mode=0755",
                "tmpfs",
                home.spool_dir,
            ],
            check=True,
        )
        home.write_config(
            batch_timeout="3s",
            max_batch_records=4000,
            table=self.settings.first_table,
            spool_extra='claim_ttl = "6s"\nmax_bytes = "48MiB"\nsegment_max_bytes = "2MiB"',
            extra=self.settings.extra
            + f"""
[timeouts]
catalog_connect = "3s"
catalog_request = "8s"
storage_connect = "3s"
storage_request = "10s"
storage_attempts = 2
shutdown_grace = "15s"

[maintenance]
interval = "4s"
max_snapshot_age = "20s"
min_snapshots = 2
compaction_min_files = 3
orphan_older_than = "8s"
lease = "{self.settings.maintenance_lease}"
""",
        )
        self.homes.append(home)
        return home

    # ------------------------------------------------------------------ the process

    @property
    def running(self) -> bool:
        return self.daemon is not None and self.daemon.running

    def start(self) -> Daemon:
        """Start the slot's next process on its current home."""
        if self.daemon is None or self.daemon.home is not self.home:
            if self.daemon is not None:
                self.daemon.cleanup()  # the process on the old home is gone: close its log
            self.daemon = Daemon(self.home)
        env = {
            "LD_PRELOAD": str(FAKETIME),
            "FAKETIME_TIMESTAMP_FILE": str(self.clock.path),
            "FAKETIME_CACHE_DURATION": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }
        self.daemon.start(env=env, control=self.disk.path)
        # The port is known once the process says it listens: writers find it then.
        task = asyncio.get_running_loop().create_task(self.daemon.wait_listening(120))
        self._listening.add(task)
        task.add_done_callback(_forget(self._listening))
        return self.daemon

    async def wait_ready(self, within: float) -> None:
        assert self.daemon is not None
        await self.daemon.wait_ready(within)

    def kill(self) -> None:
        if self.daemon is not None and self.daemon.running:
            self.daemon.kill()

    def pause(self) -> int | None:
        """SIGSTOP the running process; its pid (to resume that one only)."""
        if not self.running:
            return None
        assert self.daemon is not None and self.daemon.pid is not None
        os.kill(self.daemon.pid, signal.SIGSTOP)
        return self.daemon.pid

    def resume(self, pid: int | None) -> None:
        if pid is not None and self.daemon is not None and self.daemon.pid == pid:
            with _gone():
                os.kill(pid, signal.SIGCONT)

    def holds_claim(self) -> bool:
        """Whether the running process took its spool's claim in the catalog (it does
        before it is ready; a catalog that refused it then leaves it without one)."""
        daemon = self.daemon
        return (
            self.running
            and daemon is not None
            and "icespool ready: " in daemon.log()
            and "the spool's identity cannot be claimed" not in daemon.log()
        )

    @property
    def url(self) -> str | None:
        daemon = self.daemon
        if daemon is None or not daemon.running or daemon.port is None:
            return None
        return daemon.url

    async def stop(self, within: float = 30.0) -> int | None:
        """SIGTERM (SIGCONT first, in case it is paused) and wait; its exit status."""
        daemon = self.daemon
        if daemon is None or not daemon.running:
            return None
        with _gone():
            os.kill(daemon.pid or 0, signal.SIGCONT)
        daemon.signal(signal.SIGTERM)
        return await daemon.wait_exit(within)

    # ------------------------------------------------------------------ the disk

    def copy_spool_to_new_home(self) -> DaemonDir:
        """A new home whose spool is a copy of the current one (as `cp -a` copies it:
        the directory lock does not travel); the slot's next process runs there."""
        source = self.home.spool_dir
        home = self.new_home()
        _copy(source, home.spool_dir)
        return home

    def copy_spool_aside(self) -> DaemonDir:
        """A home beside the slot's with a copy of its spool (no slot process uses it)."""
        home = self.copy_spool_to_new_home()
        self.spares.append(self.homes.pop())
        return home

    def snapshot_spool(self, target: Path) -> None:
        _copy(self.home.spool_dir, target)

    def restore_to_new_home(self, snapshot: Path) -> DaemonDir:
        home = self.new_home()
        _copy(snapshot, home.spool_dir)
        return home

    def fill_disk(self) -> Path:
        """Take every free byte of the spool's volume; the file to remove to free it."""
        filler = self.home.spool_dir / "filler"
        stat = os.statvfs(self.home.spool_dir)
        free = stat.f_bavail * stat.f_frsize
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            if free > 0:
                os.posix_fallocate(fd, 0, free)
        except OSError:
            pass  # what it could take is taken
        finally:
            os.close(fd)
        return filler

    def spool_files(self) -> list[Path]:
        """Segment files left in the current home's spool (quarantined ones too)."""
        spool = self.home.spool_dir
        return sorted(p for p in spool.rglob("*.arrow") if p.is_file())

    def close(self) -> None:
        """Kill the process, close the proxies, unmount every home's tmpfs."""
        if self.daemon is not None:
            self.daemon.cleanup()
        for link in (self.catalog, self.store):
            link.proxy.__exit__(None, None, None)
        for home in [*self.homes, *self.spares]:
            subprocess.run(["umount", "-l", home.spool_dir], check=False, capture_output=True)


def _forget(tasks: set[asyncio.Task[int]]) -> Callable[[asyncio.Task[int]], None]:
    def done(task: asyncio.Task[int]) -> None:
        tasks.discard(task)
        if not task.cancelled():
            task.exception()  # a process that died first: the supervisor sees it

    return done


def _copy(source: Path, target: Path) -> None:
    """``cp -a`` of a spool, without what a full-disk fault left there."""
    shutil.copytree(
        source, target, dirs_exist_ok=True, symlinks=True, ignore=shutil.ignore_patterns("filler")
    )


async def readyz(session: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with session.get(f"{url}/readyz", timeout=aiohttp.ClientTimeout(total=2)) as r:
            return r.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


class _gone:
    """Ignore a process that is gone already."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, *_: object) -> bool:
        return kind is ProcessLookupError
