"""Real ``icespool run`` daemons with one upsert table each, fed NDJSON changes over HTTP:
the parts `bench_upsert_reads.py` and `bench_cdc.py --live` share.

A daemon runs this tree (the interpreter's ``icespool``) or, given ``tree`` (a checkout
of another revision with its ``make pkgroot`` done), that tree: the before and after of
one run.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from bench_write_path import _LIVE, free_port, icespool_command, to_toml

COLUMNS = [
    {"name": "id", "type": "long", "required": True},
    {"name": "score", "type": "long"},
    {"name": "city", "type": "string"},
]
CITIES = [f"city-{i:02d}" for i in range(50)]


@dataclass
class Daemon:
    table: str
    port: int
    proc: subprocess.Popen[bytes]
    log: Path
    failed_posts: int = 0
    changes: int = 0
    commits: list[float] = field(default_factory=list)


def catalog_props(directory: Path, database: str | None) -> dict[str, Any]:
    """A SQL catalog on the PostgreSQL ``database`` (SQLite in ``directory`` if None)."""
    uri = (
        f"postgresql+psycopg2://postgres@127.0.0.1:5432/{database}"
        if database is not None
        else f"sqlite:///{directory / 'catalog.db'}"
    )
    return {
        "name": "bench",
        "type": "sql",
        "uri": uri,
        "warehouse": (directory / "warehouse").as_uri(),
    }


def start(
    directory: Path,
    catalog: dict[str, Any],
    table: str,
    *,
    batch_timeout: str,
    format_version: int,
    tree: Path | None = None,
    spool: Path | None = None,
) -> Daemon:
    """``icespool run`` with the upsert table ``table`` (key ``id``), its spool in
    ``spool`` (default: its own directory under ``directory``)."""
    port = free_port()
    config = directory / f"{table}.toml"
    raw = {
        "catalog": catalog,
        "spool": {"dir": str(spool or directory / f"spool-{table}")},
        "http": {"listen": f"127.0.0.1:{port}"},
        "defaults": {"batch_timeout": batch_timeout},
        "log": {"level": "info", "format": "json"},
        "tables": [
            {
                "name": table,
                "create": True,
                "schema": COLUMNS,
                "key": ["id"],
                "properties": {"format-version": str(format_version)},
            }
        ],
    }
    config.write_text(to_toml(raw))
    log = directory / f"{table}.log"
    env = dict(os.environ)
    command = icespool_command()
    if tree is not None:
        env["PYTHONPATH"] = str(tree / "build" / "pkgroot")
        command = [sys.executable, "-m", "icespool"]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*command, "run", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    _LIVE.add(proc)
    return Daemon(table, port, proc, log)


def stop(daemons: list[Daemon]) -> None:
    for daemon in daemons:
        daemon.proc.terminate()
    for daemon in daemons:
        try:
            daemon.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            daemon.proc.kill()
            daemon.proc.wait()


async def ready(session: aiohttp.ClientSession, daemon: Daemon) -> None:
    for _ in range(600):
        try:
            async with session.get(f"http://127.0.0.1:{daemon.port}/readyz") as resp:
                if resp.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        if daemon.proc.poll() is not None:
            raise SystemExit(f"{daemon.table}: the daemon exited; see {daemon.log}")
        await asyncio.sleep(0.1)
    raise SystemExit(f"{daemon.table}: not ready after 60s; see {daemon.log}")


def body(rows: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def _upsert(rng: random.Random, key: int) -> dict[str, Any]:
    return {"id": key, "score": rng.randrange(10**6), "city": rng.choice(CITIES), "_op": "upsert"}


def changes(rng: random.Random, count: int, keys: int, deletes: float) -> bytes:
    """``count`` changes of random keys below ``keys``, a ``deletes`` share of them deletes."""
    rows: list[dict[str, Any]] = []
    for _ in range(count):
        key = rng.randrange(keys)
        if rng.random() < deletes:
            rows.append({"id": key, "_op": "delete"})
        else:
            rows.append(
                {
                    "id": key,
                    "score": rng.randrange(10**6),
                    "city": rng.choice(CITIES),
                    "_op": "upsert",
                }
            )
    return body(rows)


async def post(session: aiohttp.ClientSession, daemon: Daemon, data: bytes, count: int) -> None:
    url = f"http://127.0.0.1:{daemon.port}/v1/tables/{daemon.table}/changes"
    headers = {"Content-Type": "application/x-ndjson"}
    try:
        async with session.post(url, data=data, headers=headers) as resp:
            if resp.status == 200:
                daemon.changes += count
            else:
                daemon.failed_posts += 1
    except aiohttp.ClientError:
        daemon.failed_posts += 1


async def load_keys(session: aiohttp.ClientSession, daemons: list[Daemon], keys: int) -> None:
    """Every key once (one body per 10,000), to every daemon."""
    rng = random.Random(3)
    for begin in range(0, keys, 10_000):
        rows = [_upsert(rng, i) for i in range(begin, min(keys, begin + 10_000))]
        data = body(rows)
        await asyncio.gather(*(post(session, d, data, len(rows)) for d in daemons))


def commit_ms(daemon: Daemon) -> list[float]:
    """The duration of each commit of the daemon's table, from its JSON log."""
    out: list[float] = []
    for line in daemon.log.read_text(errors="replace").splitlines():
        if "committed " not in line:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("table") == daemon.table and "duration_ms" in record:
            out.append(float(record["duration_ms"]))
    return out


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def metrics(session: aiohttp.ClientSession, daemon: Daemon) -> dict[str, float]:
    """The daemon's samples for its table, by metric name and labels other than table."""
    async with session.get(f"http://127.0.0.1:{daemon.port}/metrics") as resp:
        text = await resp.text()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or f'table="{daemon.table}"' not in line:
            continue
        name, _, value = line.rpartition(" ")
        labels = ",".join(
            part
            for part in name.split("{", 1)[1].rstrip("}").split(",")
            if not part.startswith("table=")
        )
        out[f"{name.split('{', 1)[0]}{{{labels}}}" if labels else name.split("{", 1)[0]] = float(
            value
        )
    return out
