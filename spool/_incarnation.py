"""Which process a spool directory's data came from, and whether it is provably gone.

Every process that opens a spool is an *incarnation*: a random 12-hex tag plus where it
ran (host name, the kernel's boot id, the pid namespace, its pid and the pid's start
time). The directory records them (``incarnations``, one per line, newest last). A copy
of the directory (``cp -a``, a restored volume snapshot, a cloned VM) carries the same
records, so a record alone never proves that the process it names has ended: only the
kernel that ran it can. An earlier incarnation is *provably gone* when it ran on this
kernel (same boot id) in this pid namespace and its pid no longer names a process that
started when it did. Anything else (another machine, another container, a reboot since)
may still be running somewhere and is treated as alive.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = ["Incarnation"]

_TAG: Final = re.compile(r"[0-9a-f]{12}")
_FIELDS: Final = 6


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return "-"


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return "-"


def _start_ticks(pid: int) -> str:
    """The process's start time in clock ticks since boot (field 22 of its stat)."""
    stat = _read(f"/proc/{pid}/stat")
    # The command name (field 2) may hold spaces and parentheses: split after its end.
    _, _, rest = stat.rpartition(")")
    fields = rest.split()
    return fields[19] if len(fields) > 19 else "-"


def _token(text: str) -> str:
    return re.sub(r"\s+", "_", text) or "-"


@dataclass(frozen=True, slots=True)
class Incarnation:
    """One process that opened a spool directory."""

    tag: str
    host: str
    boot_id: str
    pid_namespace: str
    pid: int
    start_ticks: str

    @classmethod
    def current(cls) -> Incarnation:
        """This process, with a fresh tag."""
        pid = os.getpid()
        return cls(
            tag=secrets.token_hex(6),
            host=_token(socket.gethostname()),
            boot_id=_token(_read("/proc/sys/kernel/random/boot_id")),
            pid_namespace=_token(_pid_namespace()),
            pid=pid,
            start_ticks=_start_ticks(pid),
        )

    @classmethod
    def parse(cls, line: str) -> Incarnation | None:
        """The record ``line`` (as `record` writes it), or None if it is not one. A bare
        tag (an older record) parses with nothing known of where it ran."""
        parts = line.split()
        if not parts or not _TAG.fullmatch(parts[0]):
            return None
        if len(parts) != _FIELDS or not parts[4].isdigit():
            return cls(parts[0], "-", "-", "-", 0, "-")
        tag, host, boot_id, namespace, pid, ticks = parts
        return cls(tag, host, boot_id, namespace, int(pid), ticks)

    @property
    def record(self) -> str:
        return (
            f"{self.tag} {self.host} {self.boot_id} {self.pid_namespace} {self.pid} "
            f"{self.start_ticks}"
        )

    def describe(self) -> str:
        """Where it ran, for an error message."""
        return f"incarnation {self.tag} (host {self.host}, pid {self.pid})"

    def same_kernel(self, here: Incarnation) -> bool:
        """Whether this incarnation ran on ``here``'s kernel and in its pid namespace
        (where its pid can be looked up)."""
        return (
            "-" not in (self.boot_id, self.pid_namespace)
            and self.boot_id == here.boot_id
            and self.pid_namespace == here.pid_namespace
        )

    def gone(self, here: Incarnation) -> bool:
        """Whether this incarnation has provably ended, judged by ``here`` (the running
        process): it ran on the same kernel and pid namespace, and its pid is free or
        belongs to a process that started at another time."""
        if not self.same_kernel(here) or self.start_ticks == "-" or self.pid <= 0:
            return False
        if self.pid == here.pid:
            return self.start_ticks != here.start_ticks
        return _start_ticks(self.pid) != self.start_ticks
