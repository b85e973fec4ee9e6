"""A loopback TCP proxy that makes a dependency refuse, go silent, slow down or reset.

    with TcpProxy(("127.0.0.1", 5432)) as proxy:      # listens on 127.0.0.1:proxy.port
        proxy.mode = "silent"                          # every connection stops answering

Modes (switch at any moment; they apply to open connections too):
- ``forward``: a plain proxy.
- ``refuse``: the listening socket is closed (connects get ECONNREFUSED) and open
  connections are reset.
- ``silent``: connections are accepted, nothing is forwarded either way, nothing is
  answered; the client only learns of it through its own timeout.
- ``slow``: every chunk is forwarded after ``delay`` seconds.
- ``reset``: new connections are accepted and reset at once; open ones are reset.
- ``lose_commits``: a plain proxy, except that a PostgreSQL ``COMMIT`` (a simple query,
  as psycopg2 sends it) is forwarded and its connection reset before the answer comes
  back: the transaction is committed, the client cannot know (the client must not use
  TLS, ``sslmode=disable``: the proxy reads the messages).

Threads, not asyncio: the proxy keeps working while a test blocks its own event loop.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
import time
from typing import Literal

__all__ = ["Mode", "TcpProxy"]

Mode = Literal["forward", "refuse", "silent", "slow", "reset", "lose_commits"]
# psycopg2's commit: a simple-query message "Q", its length (4 + 7), "COMMIT" and a NUL.
_PG_COMMIT = b"Q\x00\x00\x00\x0bCOMMIT\x00"
_TICK = 0.05


class TcpProxy:
    def __init__(self, upstream: tuple[str, int], *, delay: float = 1.0) -> None:
        self.upstream = upstream
        self.delay = delay
        self.port = 0
        self.connections = 0  # accepted so far, whatever the mode
        self.lost_answers = 0  # answers to a COMMIT dropped in ``lose_commits`` mode
        self._mode: Mode = "forward"
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._resets = 0  # _reset_all calls so far
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._threads: list[threading.Thread] = []

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> TcpProxy:
        self._listen()
        self._spawn(self._accept_loop)
        return self

    def __exit__(self, *exc: object) -> None:
        self._closed.set()
        self._close_listener()
        self._reset_all()
        for thread in self._threads:
            thread.join(timeout=5)

    @property
    def mode(self) -> Mode:
        return self._mode

    @mode.setter
    def mode(self, mode: Mode) -> None:
        with self._lock:
            self._mode = mode
        if mode == "refuse":
            self._close_listener()
        elif self._listener is None:
            self._listen()
        if mode in ("refuse", "reset"):
            self._reset_all()

    # ------------------------------------------------------------------ internals

    def _listen(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))  # the same port again after "refuse"
        listener.listen(128)
        listener.settimeout(_TICK)
        self.port = listener.getsockname()[1]
        self._listener = listener

    def _close_listener(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        thread.start()
        self._threads.append(thread)

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            listener = self._listener
            if listener is None:
                time.sleep(_TICK)
                continue
            try:
                client, _ = listener.accept()
            except (TimeoutError, OSError):
                continue
            self.connections += 1
            if self._mode == "reset":
                _reset(client)
                continue
            # Registered before its thread runs, with the resets so far: a reset that
            # comes first still ends it (never forwarded later, when the mode allows).
            with self._lock:
                self._open.add(client)
                epoch = self._resets
            self._spawn(self._serve, client, epoch)

    def _serve(self, client: socket.socket, epoch: int) -> None:
        upstream: socket.socket | None = None
        try:
            while not self._closed.is_set() and upstream is None:
                if self._mode == "silent":  # accepted, never answered
                    time.sleep(_TICK)
                    continue
                with self._lock:
                    reset_since = self._resets != epoch
                if reset_since or client.fileno() < 0:
                    _reset(client)
                    return
                upstream = socket.create_connection(self.upstream, timeout=5)
            if upstream is None:
                return
            with self._lock:
                self._open.add(upstream)
            self._pump(client, upstream)
        except OSError:
            pass
        finally:
            with self._lock:
                self._open.discard(client)
                if upstream is not None:
                    self._open.discard(upstream)
            for sock in (client, upstream):
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.close()

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        peer = {client: upstream, upstream: client}
        committing = False
        while not self._closed.is_set():
            if self._mode == "silent":
                time.sleep(_TICK)
                continue
            if client.fileno() < 0 or upstream.fileno() < 0:
                return
            readable, _, _ = select.select([client, upstream], [], [], _TICK)
            for sock in readable:
                data = sock.recv(65536)
                if not data:
                    return
                if self._mode == "slow":
                    time.sleep(self.delay)
                if sock is upstream and committing:
                    self.lost_answers += 1
                    _reset(client)
                    _reset(upstream)
                    return
                if sock is client and self._mode == "lose_commits" and _PG_COMMIT in data:
                    committing = True
                peer[sock].sendall(data)

    def _reset_all(self) -> None:
        with self._lock:
            self._resets += 1
            sockets = list(self._open)
            self._open.clear()
        for sock in sockets:
            _reset(sock)


def _reset(sock: socket.socket) -> None:
    """Close with RST instead of FIN: the peer sees 'connection reset'."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()
