"""Width: hundreds and thousands of tables in one daemon (issue 13).

Every per-table cost must be O(1) in the number of tables. Measured here as what
breaks when it is not: the systemd STATUS line read each table's series back from
the metric registry, collecting the whole registry once per table (O(tables^2):
SIGTERM with 1,000 tables never finished); a 300-table drain must end within its
grace with every acked id committed exactly once; ``auto_create`` must stop at
``[[kafka]] max_tables`` and dead-letter the rest with the reason, and create the
tables of a fetch a bounded number at a time. Figures with 1,000 and 10,000 tables:
tests/bench/bench_tables.py.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import itertools
import json
import logging
import signal
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
import pyarrow as pa
import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.exceptions import NoSuchTableError
from support.daemon_harness import CATALOG_NAME, NDJSON, Daemon, DaemonDir, ndjson
from support.fixture_types import MakeConfig
from support.kafka_harness import SESSION_TIMEOUT, Broker, create_topic, produce, unique_name
from support.many_tables import declared_tables, make_tables
from support.service_helpers import metric, table_rows, wait_rows

from icespool.config import Config
from icespool.kafka import _handover
from icespool.kafka._fetch import Fetch
from icespool.kafka._routing import DynamicRouter
from icespool.lifecycle.sd_notify import status_line
from icespool.lifecycle.service import Icespool
from icespool.runtime.fanout import fan_out

# ------------------------------------------------------------------ cost per table


def _service_config(make_config: MakeConfig, names: list[str], spool: Path) -> Config:
    return make_config(
        tables=declared_tables(names), defaults={"batch_timeout": "1h"}, spool={"dir": str(spool)}
    )


async def _ack(service: Icespool, batch: pa.RecordBatch, name: str) -> int:
    return await service.writer(name).append(batch)


def _count_calls(target: Any, method: str) -> list[None]:
    """Count calls of ``target.method`` (one entry per call) from now on."""
    calls: list[None] = []
    original = getattr(target, method)

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(None)
        return original(*args, **kwargs)

    setattr(target, method, counting)
    return calls


async def _costs(service: Icespool, runs: int = 20) -> dict[str, float]:
    """The fastest of ``runs`` calls (robust to other work on the machine), in s, with
    the garbage collector off while timing (a collection inside one call of the small
    case made its cost look tenfold)."""
    calls: dict[str, Callable[[], object]] = {
        "status_line": lambda: status_line(service),
        "status": service.status,
        "metrics": lambda: (service.refresh_gauges(), service.metrics.exposition()),
    }
    best: dict[str, float] = {}
    gc.collect()
    gc.disable()
    try:
        for name, call in calls.items():
            times = []
            for _ in range(runs):
                started = time.perf_counter()
                call()
                times.append(time.perf_counter() - started)
            best[name] = min(times)
    finally:
        gc.enable()
    return best


async def test_status_metrics_and_the_status_line_cost_o1_per_table(
    make_config: MakeConfig, tmp_path: Path
) -> None:
    batch = pa.record_batch({"id": pa.array([1, 2], pa.int64()), "v": ["a", "b"]})
    costs: dict[int, dict[str, float]] = {}
    (tmp_path / "icespool-data").mkdir()  # the SQLite catalog's directory
    for count in (100, 1000):
        names = [f"w{count}.t{i:04d}" for i in range(count)]
        config = _service_config(make_config, names, tmp_path / f"spool-{count}")
        await asyncio.to_thread(
            make_tables, config.catalog.name, config.catalog.properties(), names
        )
        service = Icespool(config)
        await service.start()
        try:
            # Every tenth table holds acked records (the others their series at zero):
            # acking into all would mostly time the open segments' seal at stop.
            acking = names[::10]
            await fan_out("acking", acking, functools.partial(_ack, service, batch), limit=32)
            registry = service.metrics.registry
            collections = _count_calls(registry, "collect")
            line = status_line(service)
            assert line.startswith(f"serving {count} tables: {2 * len(acking)} records acked, 0 ")
            assert collections == [], "the STATUS line must not collect the metric registry"
            service.status()
            assert collections == []
            service.refresh_gauges()
            text = service.metrics.exposition().decode()
            assert len(collections) == 1, "one scrape collects the registry once"
            assert f'icespool_queue_records{{table="{names[-10]}"}} 2.0' in text
            assert f'icespool_queue_records{{table="{names[-1]}"}} 0.0' in text
            service.draining = True
            pending = 2 * len(acking)
            assert status_line(service) == f"draining: committing {pending} pending records"
            service.draining = False
            assert len(collections) == 1
            costs[count] = await _costs(service)
        finally:
            # Not the commits of 1,100 tables: what is acked stays in this test's spool.
            await service.stop(grace=0.5)
    # 10x the tables: linear is ~10x, the old STATUS line was ~100x (O(tables^2)).
    for call in ("status_line", "status", "metrics"):
        ratio = costs[1000][call] / costs[100][call]
        assert ratio < 40, f"{call}: {ratio:.1f}x for 10x the tables ({costs})"


# ------------------------------------------------------------------ drain


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    """A datagram socket standing in for systemd, and its NOTIFY_SOCKET value."""
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.setblocking(False)
    try:
        yield sock, str(path)
    finally:
        sock.close()


def _datagrams(sock: socket.socket) -> list[tuple[float, list[str]]]:
    out = []
    while True:
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return out
        out.append((time.monotonic(), data.decode().split("\n")))


async def _listen(sock: socket.socket, into: list[tuple[float, list[str]]]) -> None:
    """Append every datagram with its arrival time until cancelled."""
    loop = asyncio.get_running_loop()
    while True:
        data = await loop.sock_recv(sock, 65536)
        into.append((time.monotonic(), data.decode().split("\n")))


def _ids(home: DaemonDir, names: list[str]) -> dict[str, list[int]]:
    catalog = load_catalog(CATALOG_NAME, **home.catalog_properties)

    def read(name: str) -> list[int]:
        ids: list[int] = (
            catalog.load_table(name).scan(selected_fields=("id",)).to_arrow()["id"].to_pylist()
        )
        return ids

    try:
        with ThreadPoolExecutor(8) as pool:
            return dict(zip(names, pool.map(read, names), strict=True))
    finally:
        catalog.engine.dispose()  # type: ignore[attr-defined]


async def test_sigterm_with_300_tables_commits_every_acked_id_once_within_the_grace(
    tmp_path: Path, receiver: tuple[socket.socket, str]
) -> None:
    sock, address = receiver
    count, rows, grace = 300, 5, 30
    names = [f"wide.t{i:03d}" for i in range(count)]
    home = DaemonDir(tmp_path / "d")
    declarations = "".join(
        f'\n[[tables]]\nname = "{n}"\ncreate = true\nschema = ['
        '{ name = "id", type = "long", required = true }, { name = "v", type = "string" }]\n'
        for n in names
    )
    home.write_config(
        batch_timeout="1h",
        encode_workers=4,
        extra=declarations + f'\n[timeouts]\nshutdown_grace = "{grace}s"\n',
    )
    await asyncio.to_thread(make_tables, CATALOG_NAME, home.catalog_properties, names)
    daemon = Daemon(home)
    # A watchdog ping every second from the event loop: a drain that blocks the loop
    # (as the O(tables^2) STATUS line did) stops the pings.
    daemon.start(env={"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "2000000"})
    try:
        await daemon.wait_ready(within=60)
        acked = {name: [i * rows + k for k in range(rows)] for i, name in enumerate(names)}
        async with aiohttp.ClientSession() as session:

            async def post(name: str) -> None:
                body = ndjson({"id": i, "v": name} for i in acked[name])
                async with session.post(
                    daemon.records_url(name), data=body, headers={"Content-Type": NDJSON}
                ) as resp:
                    assert (resp.status, await resp.json()) == (200, {"accepted": rows})

            results = await fan_out("posting", names, post, limit=16)
            assert [r for r in results if r is not None] == []
        _datagrams(sock)  # what was sent before SIGTERM
        messages: list[tuple[float, list[str]]] = []
        listening = asyncio.create_task(_listen(sock, messages))
        sent = time.monotonic()
        daemon.signal(signal.SIGTERM)
        try:
            assert await daemon.wait_exit(grace + 10) == 0
        finally:
            listening.cancel()
        took = time.monotonic() - sent
        log = daemon.log()
        assert took < grace, f"drain of {count} tables took {took:.1f}s\n{daemon.tail()}"
        assert f"shutdown: committing {count + 1} tables ({count * rows} records pending)" in log
        assert "stopped cleanly" in log, daemon.tail()
        assert home.spool_files() == []
        stopping = [(t, lines) for t, lines in messages if "STOPPING=1" in lines]
        assert stopping, messages
        assert stopping[0][1] == [
            "STOPPING=1",
            f"STATUS=draining: committing {count * rows} pending records",
        ]
        assert stopping[0][0] - sent < 2.0, "STOPPING=1 must come at once"
        pings = [t for t, lines in messages if lines == ["WATCHDOG=1"]]
        if took > 3:  # the loop stayed responsive through the drain
            gaps = [b - a for a, b in itertools.pairwise([sent, *pings])]
            assert max(gaps) < 3.0, gaps
        found = await asyncio.to_thread(_ids, home, names)
        wrong = {n: sorted(ids) for n, ids in found.items() if sorted(ids) != acked[n]}
        assert wrong == {}, f"{len(wrong)} tables differ, e.g. {next(iter(wrong.items()))}"
    finally:
        daemon.cleanup()


# ------------------------------------------------------------------ auto_create cap


async def test_auto_create_stops_at_max_tables_and_dead_letters_the_rest(
    make_config: MakeConfig,
    broker: Broker,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One table per reading of a fetch (256 in the daemon): the fetch naming a, b, c
    # and d is read again until a and b exist, and nothing is handed meanwhile.
    monkeypatch.setattr(_handover, "CREATE_PER_FETCH", 1)
    caplog.set_level(logging.INFO, logger="icespool.kafka")
    topic = unique_name("width-routes")
    await create_topic(broker.bootstrap, topic, 1)
    kinds = ["a", "b", "c", "a", "d", "b", "c"]
    await produce(broker.bootstrap, topic, [{"kind": k, "id": i} for i, k in enumerate(kinds)])
    config = make_config(
        tables=[],
        defaults={"batch_timeout": "1s"},
        kafka=[
            {
                "bootstrap_servers": broker.bootstrap,
                "topics": [topic],
                "group_id": f"g-{topic}",
                "session_timeout": SESSION_TIMEOUT,
                "offset_commit_interval": "1s",
                "route_field": "kind",
                "table_template": "capped.{value}",
                "auto_create": True,
                "max_tables": 2,
            }
        ],
    )
    async with Icespool(config) as service:
        dead_table = "capped.kafka_dead_letter"
        a = await wait_rows(service, "capped.a", 2)
        b = await wait_rows(service, "capped.b", 2)
        dead = await wait_rows(service, dead_table, 3)
        await asyncio.sleep(1.5)  # nothing more arrives late
        a, b, dead = [
            await asyncio.to_thread(table_rows, service, t)
            for t in ("capped.a", "capped.b", dead_table)
        ]
        assert sorted(r["id"] for r in a) == [0, 3]
        assert sorted(r["id"] for r in b) == [1, 5]
        got = sorted((d["offset"], d["target_table"], d["reason"]) for d in dead)
        assert got == [
            (2, "capped.c", "table_limit"),
            (4, "capped.d", "table_limit"),
            (6, "capped.c", "table_limit"),
        ]
        for d in dead:
            assert "max_tables = 2" in d["error"], d["error"]
            assert json.loads(d["value"])["kind"] in ("c", "d")
        for name in ("capped.c", "capped.d"):
            assert metric(
                service, "icespool_dead_letters_total", table=name, reason="table_limit"
            ) == (2 if name == "capped.c" else 1)
            with pytest.raises(NoSuchTableError):
                await asyncio.to_thread(service._load_fresh, name)
        assert "max_tables" in caplog.text and "table_limit" in caplog.text
        assert f"1 new routes of {topic}[0] still to create" in caplog.text


# ------------------------------------------------------------------ the pieces


async def test_fan_out_is_bounded_keeps_order_and_isolates_failures() -> None:
    running = peak = 0

    async def run(i: int) -> int:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.001 * (i % 3))
        running -= 1
        if i == 7:
            raise ValueError("seven")
        return i * 10

    results = await fan_out("test", list(range(50)), run, limit=4)
    assert peak == 4
    assert [r for i, r in enumerate(results) if i != 7] == [i * 10 for i in range(50) if i != 7]
    assert isinstance(results[7], ValueError)
    assert await fan_out("empty", [], run, limit=4) == []


def test_routing_membership_and_the_table_cap(make_config: MakeConfig) -> None:
    config = make_config(
        tables=[],
        kafka=[
            {
                "bootstrap_servers": "127.0.0.1:9",
                "topics": ["t"],
                "route_field": "kind",
                "table_template": "ns.{value}",
                "auto_create": True,
                "max_tables": 3,
            }
        ],
    )
    kafka = config.kafka[0]
    router = DynamicRouter(kafka, ["ns.a", "other.b"], 64)
    assert (router.targets, router.room) == (["ns.a"], 2)
    router.add("ns.b")
    router.add("ns.b")
    assert (router.targets, router.room) == (["ns.a", "ns.b"], 1)
    values = [b'{"kind":"a"}', b'{"kind":"b"}', b'{"kind":"c"}']
    fetch = Fetch("t", 0, pa.array([0, 1, 2]).to_numpy(), values, [None] * 3, [0] * 3, [[]] * 3)
    by_table, dead = router.route(fetch)
    assert {t: rows.tolist() for t, rows in by_table.items()} == {"ns.a": [0], "ns.b": [1]}
    assert [(d.index, d.reason, t) for d, t in dead] == [(2, "unknown_route", "ns.c")]
    router.add("ns.c")
    assert router.room == 0
    fetch = Fetch("t", 0, pa.array([0]).to_numpy(), [b'{"kind":"d"}'], [None], [0], [[]])
    _, dead = router.route(fetch)
    assert [(d.reason, t) for d, t in dead] == [("table_limit", "ns.d")]
    assert "max_tables = 3" in dead[0][0].error


def test_table_lookup_follows_a_reloaded_table_list(make_config: MakeConfig) -> None:
    config = make_config(tables=declared_tables(["ns.a", "ns.b"]))
    assert config.table("ns.b").name == "ns.b"
    other = make_config(tables=declared_tables(["ns.c"])).tables
    reloaded = config.model_copy(update={"tables": other})
    assert reloaded.table_settings("ns.c") == reloaded.defaults.model_copy(
        update=reloaded.table("ns.c").overrides()
    )
    with pytest.raises(Exception, match="not configured"):
        reloaded.table("ns.a")
    assert config.table("ns.a").name == "ns.a"
