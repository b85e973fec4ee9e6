"""A flood of whole requests from one address against a real daemon: how many are served
on the first try, how soon, and how many descriptors the daemon holds meanwhile.

Run: PYTHONPATH=$PWD .venv/bin/python tests/bench/bench_http_flood.py [--n 2000 10000]
         [--before /work/main] [--trials 1]

For each N, N connections from 127.0.0.1 open at once, each sending one whole ingest
request (one NDJSON record, its id unique) at once, against a fresh `icespool run` child
with the default per-IP cap (256) and header timeout (10 s). Measured per run:

- first try: how many got 200, 503 (the cap), another answer, or no answer (reset,
  refused connect, timeout);
- ack time of the first-try 200s (connect to whole answer): p50, p99, max;
- then those not served retry after Retry-After until 200: the attempts, and the time
  until every record is acked; a flush then counts the ids in the table (each once);
- the daemon's peak open descriptors (sampled every 10 ms) and peak RSS (VmHWM).

The answers other than 200 (of every run together) are listed after the table. The
client shares the machine with the daemon: on 2 cores its own loop is part of the lag.

``--before DIR``: the same runs with the daemon's code from DIR (its PYTHONPATH), e.g.
main's worktree, so the old behaviour and this tree's are printed side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ (support)
import contextlib

from support.daemon_harness import Daemon, DaemonDir

_ANSWER_TIMEOUT = 120.0
BODIES: Counter[str] = Counter()  # the answers other than 200, for the report


def _request(i: int) -> bytes:
    body = b'{"id": %d}\n' % i
    head = (
        b"POST /v1/tables/t.events/records HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/x-ndjson\r\nConnection: close\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    )
    return head + body


async def _once(port: int, i: int) -> tuple[str, float, int]:
    """One request on a new connection: (outcome, seconds, Retry-After)."""
    started = time.perf_counter()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError as exc:
        return f"connect {type(exc).__name__}", time.perf_counter() - started, 1
    try:
        writer.write(_request(i))
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), _ANSWER_TIMEOUT)
    except (OSError, TimeoutError) as exc:
        return f"no answer ({type(exc).__name__})", time.perf_counter() - started, 1
    finally:
        writer.close()
    elapsed = time.perf_counter() - started
    if not answer:
        return "closed without answer", elapsed, 1
    head = answer.partition(b"\r\n\r\n")[0].decode(errors="replace").split("\r\n")
    status = head[0].split(" ")[1]
    retry = 1
    if status != "200":
        BODIES[status + " " + answer.partition(b"\r\n\r\n")[2].decode()[:200]] += 1
    for line in head[1:]:
        name, _, value = line.partition(": ")
        if name.lower() == "retry-after":
            retry = int(value)
    return status, elapsed, retry


@dataclass
class Result:
    label: str
    n: int
    first: Counter[str] = field(default_factory=Counter)
    acks: list[float] = field(default_factory=list)
    attempts: Counter[int] = field(default_factory=Counter)
    all_acked_s: float = 0.0
    ids_once: bool = False
    peak_fds: int = 0
    rss_mib: float = 0.0


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


class _FdSampler(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak, self.stop = pid, 0, threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(OSError):
                self.peak = max(self.peak, len(os.listdir(f"/proc/{self.pid}/fd")))
            time.sleep(0.01)


async def _flood(label: str, pythonpath: str, n: int, root: Path) -> Result:
    home = DaemonDir(root / f"{label}-{n}")
    home.write_config()
    daemon = Daemon(home)
    daemon.start(env={"PYTHONPATH": pythonpath})
    result = Result(label, n)
    try:
        port = await daemon.wait_ready()
        sampler = _FdSampler(daemon.pid or 0)
        sampler.start()
        started = time.perf_counter()

        async def until_acked(i: int) -> None:
            for attempt in range(1, 61):
                status, elapsed, retry = await _once(port, i)
                if attempt == 1:
                    result.first[status] += 1
                    if status == "200":
                        result.acks.append(elapsed)
                if status == "200":
                    result.attempts[attempt] += 1
                    return
                await asyncio.sleep(retry)
            result.attempts[-1] += 1

        await asyncio.gather(*(until_acked(i) for i in range(n)))
        result.all_acked_s = time.perf_counter() - started
        sampler.stop.set()
        sampler.join()
        result.peak_fds = sampler.peak
        status = Path(f"/proc/{daemon.pid}/status").read_text()
        hwm = next(line for line in status.splitlines() if line.startswith("VmHWM"))
        result.rss_mib = int(hwm.split()[1]) / 1024
        async with aiohttp.ClientSession() as session:
            await daemon.flush(session)
        rows, _ = await asyncio.to_thread(home.read_rows)
        result.ids_once = sorted(row["id"] for row in rows) == list(range(n))
    finally:
        daemon.kill()
        daemon.cleanup()
    return result


def _report(results: list[Result]) -> None:
    print(
        f"{'code':<8} {'N':>6} {'1st-try 200':>12} {'1st-try other':<34} {'p50 ms':>7} "
        f"{'p99 ms':>7} {'max ms':>7} {'all acked s':>11} {'max tries':>9} {'peak fds':>8} "
        f"{'RSS MiB':>7} ids once"
    )
    for r in results:
        ok = r.first.get("200", 0)
        other = ", ".join(f"{k}: {v}" for k, v in sorted(r.first.items()) if k != "200") or "-"
        print(
            f"{r.label:<8} {r.n:>6} {ok:>6} {100 * ok / r.n:>4.0f}% {other:<34} "
            f"{1000 * _pct(r.acks, 0.5):>7.0f} {1000 * _pct(r.acks, 0.99):>7.0f} "
            f"{1000 * max(r.acks, default=float('nan')):>7.0f} {r.all_acked_s:>11.1f} "
            f"{max(r.attempts):>9} {r.peak_fds:>8} {r.rss_mib:>7.0f} {r.ids_once}"
        )


async def _main(args: argparse.Namespace) -> None:
    here = str(Path(__file__).resolve().parents[2])
    variants = [("before", args.before)] if args.before else []
    variants.append(("after", here))
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-flood-") as tmp:
        for _ in range(args.trials):
            for n in args.n:
                for label, pythonpath in variants:
                    results.append(await _flood(label, pythonpath, n, Path(tmp)))
                    print(f"done: {label} N={n}", file=sys.stderr)
    _report(results)
    for body, count in BODIES.most_common():
        print(f"{count:>6} x {body}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, nargs="+", default=[2000, 10000])
    parser.add_argument("--before", help="the daemon's code for the 'before' runs")
    parser.add_argument("--trials", type=int, default=1)
    args = parser.parse_args()
    uvloop.run(_main(args))


if __name__ == "__main__":
    main()
