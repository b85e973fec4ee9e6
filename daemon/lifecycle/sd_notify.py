"""systemd's notify protocol (``Type=notify``): READY, STATUS, WATCHDOG, STOPPING.

The protocol is one datagram of ``KEY=value`` lines to the AF_UNIX socket named by
``$NOTIFY_SOCKET`` (a leading ``@`` means the Linux abstract namespace). It is small
enough to speak directly, which keeps a C-extension dependency out of the image.

Without ``$NOTIFY_SOCKET`` (not started by systemd) every call is a no-op, so the
daemon runs the same everywhere.

The watchdog ping is sent from a task on the daemon's event loop, at half of
``$WATCHDOG_USEC``: a loop blocked by a stuck call stops pinging and systemd
restarts the service, which is the point of the watchdog.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from icespool.config import human_bytes

if TYPE_CHECKING:  # the service imports pyiceberg; this module stays light without it
    from icespool.lifecycle.service import Icespool

__all__ = ["Notifier", "SystemdNotifier", "status_line", "watchdog_interval"]

_log = logging.getLogger("icespool.systemd")

# How often STATUS= is refreshed when no watchdog asks for a faster tick.
_STATUS_EVERY = 5.0


def watchdog_interval(env: Mapping[str, str], pid: int) -> float | None:
    """Seconds between watchdog pings (half of ``$WATCHDOG_USEC``), or None when off.

    ``$WATCHDOG_PID`` set to another pid means the watchdog is meant for a different
    process (e.g. we were exec'd by a wrapper that got it), so we must not ping.
    """
    usec = env.get("WATCHDOG_USEC", "").strip()
    if not usec.isdigit() or int(usec) == 0:
        return None
    owner = env.get("WATCHDOG_PID", "").strip()
    if owner and owner != str(pid):
        return None
    return int(usec) / 1e6 / 2


class Notifier:
    """Sends notify datagrams to ``$NOTIFY_SOCKET``; does nothing when it is unset."""

    def __init__(self, address: str | None) -> None:
        self._address: str | bytes | None = None
        self._sock: socket.socket | None = None
        self._warned = False
        if not address:
            return
        if address.startswith("@"):
            # Abstract namespace: the kernel name starts with a NUL byte instead of '@'.
            self._address = b"\0" + address[1:].encode()
        elif address.startswith("/"):
            self._address = address
        else:
            _log.warning("ignoring NOTIFY_SOCKET=%r: not an AF_UNIX socket path", address)
            return
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        # Never block the event loop on a slow or full receiver; a lost datagram is
        # better than a stalled daemon (and the next tick sends another).
        self._sock.setblocking(False)

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def send(self, *assignments: str) -> bool:
        """Send ``KEY=value`` lines as one datagram; True when it was sent."""
        if self._sock is None or self._address is None or not assignments:
            return False
        payload = "\n".join(assignments).encode("utf-8", "replace")
        try:
            self._sock.sendto(payload, self._address)
        except OSError as exc:
            if not self._warned:  # once: a missing receiver must not flood the log
                self._warned = True
                _log.warning("cannot notify systemd at NOTIFY_SOCKET: %s", exc)
            return False
        return True

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class SystemdNotifier:
    """The daemon's side of ``Type=notify``: a periodic task plus lifecycle messages.

    ``status`` returns the current STATUS= text; it is called on the event loop at
    every tick and must be cheap.
    """

    def __init__(
        self,
        status: Callable[[], str],
        *,
        env: Mapping[str, str] | None = None,
        pid: int | None = None,
    ) -> None:
        env = os.environ if env is None else env
        pid = os.getpid() if pid is None else pid
        self._status = status
        self._notifier = Notifier(env.get("NOTIFY_SOCKET"))
        self.watchdog = watchdog_interval(env, pid) if self._notifier.enabled else None
        self._task: asyncio.Task[None] | None = None
        self._last_status = ""

    @classmethod
    def from_environ(cls, status: Callable[[], str]) -> SystemdNotifier:
        """Read the systemd variables and remove them from the environment.

        Removing them is what sd_notify(3)'s ``unset_environment`` does: a child
        process (a helper, a Spark job) must not talk to systemd in our name.
        """
        notifier = cls(status)
        for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
            os.environ.pop(name, None)
        return notifier

    @property
    def enabled(self) -> bool:
        return self._notifier.enabled

    def start(self) -> None:
        """Start the tick task (watchdog pings and STATUS refreshes)."""
        if self._notifier.enabled and self._task is None:
            self._task = asyncio.create_task(self._tick(), name="systemd-notify")

    def ready(self) -> None:
        """Recovery is done and HTTP listens: systemd may start dependent units."""
        self._last_status = self._status()
        self._notifier.send("READY=1", f"STATUS={self._last_status}")

    def status(self, text: str) -> None:
        self._last_status = text
        self._notifier.send(f"STATUS={text}")

    def stopping(self, text: str) -> None:
        self._last_status = text
        self._notifier.send("STOPPING=1", f"STATUS={text}")

    async def stop(self) -> None:
        """Stop the tick task and close the socket. Idempotent."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._notifier.close()

    async def _tick(self) -> None:
        every = min(self.watchdog, _STATUS_EVERY) if self.watchdog else _STATUS_EVERY
        while True:
            await asyncio.sleep(every)
            if self.watchdog is not None:
                self._notifier.send("WATCHDOG=1")
            try:
                text = self._status()
            except Exception:  # a status bug must not stop the watchdog
                _log.exception("cannot compute the systemd STATUS line")
                continue
            if text != self._last_status:
                self.status(text)


def status_line(service: Icespool) -> str:
    """The STATUS= text: what ``systemctl status icespool`` shows under the unit.

    O(tables) with a small constant (`Icespool.totals`): it is computed at every
    watchdog tick and on SIGTERM, with thousands of tables too.
    """
    if service.draining:
        return f"draining: committing {service.totals().pending} pending records"
    if not service.ready:
        recovery = service.recovery
        if recovery is not None and not recovery.finished:  # a large spool: how far it is
            return f"starting: {recovery.text()}"
        if service.start_wait is not None:  # e.g. the catalog does not answer
            return service.start_wait.reason()
        return "starting: recovering the spool, loading the catalog and tables"
    totals = service.totals()
    return (
        f"serving {totals.tables} tables: {totals.acked} records acked, "
        f"{totals.committed} committed, spool {human_bytes(totals.spool_bytes)}"
    )
