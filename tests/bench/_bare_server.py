"""The bare limit of an HTTP ack, as a server: what any daemon on this stack must pay.

Run: python tests/bench/_bare_server.py PORT_FILE DIR

An aiohttp server on uvloop (127.0.0.1, a free port written to PORT_FILE) that takes
``POST /records`` (NDJSON of the bench's events), decodes the body with ONE
``pyarrow.json`` call in a thread (the table's Arrow types, as `_events.decode_body`)
and answers 200 with the row count: no guards, no schema checks, no spool, no catalog.
Decoded tables pile up and are written as one zstd Parquet file per 1,000,000 rows in
another thread (then deleted), so the server also pays for encoding what it acks, as
the bare throughput limit does, beside its acks. ``POST /flush`` waits for the pile.
bench_write_path's latency mode paces the same load at it as at the daemon: its ack
latency is the floor under the daemon's.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import uvloop
from _events import decode_body
from aiohttp import web

FILE_ROWS = 1_000_000


class _Pile:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.tables: list[pa.Table] = []
        self.rows = 0
        self.files = 0
        self.writing: asyncio.Task[None] | None = None

    def add(self, table: pa.Table) -> None:
        self.tables.append(table)
        self.rows += table.num_rows
        if self.rows >= FILE_ROWS and self.writing is None:
            self.writing = asyncio.create_task(self.write())

    async def write(self) -> None:
        tables, self.tables, self.rows = self.tables, [], 0
        path = self.directory / f"bare-server-{self.files}.parquet"
        self.files += 1
        await asyncio.to_thread(_write, pa.concat_tables(tables), path)
        self.writing = None

    async def flush(self) -> None:
        while self.writing is not None:
            await self.writing
        if self.tables:
            await self.write()


def _write(table: pa.Table, path: Path) -> None:
    pq.write_table(table, path, compression="zstd")
    path.unlink()


async def main(port_file: Path, directory: Path) -> None:
    pile = _Pile(directory)

    async def records(request: web.Request) -> web.Response:
        body = await request.read()
        table = await asyncio.to_thread(decode_body, body)
        pile.add(table)
        return web.json_response({"accepted": table.num_rows})

    async def flush(request: web.Request) -> web.Response:
        await pile.flush()
        return web.json_response({"files": pile.files})

    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/records", records)
    app.router.add_post("/flush", flush)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    site = web.SockSite(runner, sock)
    await site.start()
    port_file.write_text(str(sock.getsockname()[1]))
    await asyncio.Event().wait()  # until killed


if __name__ == "__main__":
    uvloop.run(main(Path(sys.argv[1]), Path(sys.argv[2])))
