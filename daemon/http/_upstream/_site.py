"""aiohttp's TCP site, listening through `Connections` (timeouts, per-IP cap).

aiohttp's ``TCPSite.start`` listens with the runner's server as the protocol factory;
the daemon must put its own protocol (``icespool.http._conn``: header and idle timers,
the per-IP cap) in front of every connection, and bound a TLS handshake by the header
timeout. ``ListeningSite`` is ``TCPSite.start`` with that factory and that bound: it
sets ``_server`` as ``TCPSite`` does, so ``runner.addresses`` and ``BaseSite.stop``
work on it unchanged.

Relies on (checked by ``_contract``): ``BaseSite.__init__`` keeping ``_ssl_context`` and
``_backlog`` and ``_server``, ``BaseSite.stop`` closing ``_server``, and
``BaseRunner.addresses`` reading each site's ``_server``.
"""

from __future__ import annotations

import asyncio
import ssl

from aiohttp import web

from icespool.http._conn import Connections

__all__ = ["ListeningSite"]

# Connections the kernel queues for accept while the loop is busy (Linux caps it at
# net.core.somaxconn, 4096 by default). With aiohttp's 128, a burst of connections from
# clients behind one ingress overflows the queue: the kernel drops their SYNs and the
# clients resend them after 1, 3, 7, 15 s, so requests wait tens of seconds unseen.
_BACKLOG = 4096


class ListeningSite(web.BaseSite):
    """aiohttp's TCP site, listening through `Connections` (timeouts, per-IP cap)."""

    def __init__(
        self,
        runner: web.AppRunner,
        host: str,
        port: int,
        tls: ssl.SSLContext | None,
        connections: Connections,
    ) -> None:
        super().__init__(runner, ssl_context=tls, backlog=_BACKLOG)
        self._host = host
        self._port = port
        self._connections = connections

    @property
    def name(self) -> str:
        return f"{'https' if self._ssl_context else 'http'}://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._connections.protocol,
            self._host,
            self._port,
            ssl=self._ssl_context,
            # A client that never finishes its handshake is a slow-header client too.
            ssl_handshake_timeout=(
                self._connections.limits.header_timeout if self._ssl_context else None
            ),
            backlog=self._backlog,
            reuse_address=True,
        )
