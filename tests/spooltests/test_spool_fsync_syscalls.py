"""``spool.durability = "fsync"``, checked at the system-call level: a real `icespool run`
child under strace; for every HTTP 200 that acks records, an fdatasync (or fsync) of the
segment file must complete after that request's segment writes and before the 200 is
written to the socket. The same check run against ``page-cache`` must find violations,
so a build whose fsync mode never syncs fails here.

strace comes from Debian (TEST_DEB_PACKAGES in the Makefile).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
from collections import Counter
from pathlib import Path

import aiohttp
import pytest
from support.daemon_harness import Daemon, DaemonDir

_REQUESTS = 12
_SYSCALLS = "write,writev,pwrite64,sendto,sendmsg,fsync,fdatasync"
# 1234  writev(7</spool/t__events__0001.arrow>, ...) = 80   (-yy annotates every fd;
# strace pads the pid column, so short pids are followed by more than one space)
_LINE = re.compile(r"^(?P<pid>\d+)\s+(?P<call>\w+)\(\d+<(?P<what>[^>]*)>(?P<rest>.*)")
_RESUMED = re.compile(r"^(?P<pid>\d+)\s+<\.\.\. (?P<call>\w+) resumed>")


def _events(trace: str, spool: Path) -> list[str]:
    """Completed segment writes ("write"), segment syncs ("sync") and HTTP 200 writes
    ("ack"), in completion order.

    A call interrupted by another thread's is printed as "<unfinished ...>" and counted
    when its "<... resumed>" line says it returned.
    """
    events: list[str] = []
    unfinished: dict[str, str] = {}
    for line in trace.splitlines():
        resumed = _RESUMED.match(line)
        if resumed:
            event = unfinished.pop(resumed["pid"], None)
            if event is not None and "= -1 " not in line:
                events.append(event)
            continue
        match = _LINE.match(line)
        event = match and _classify(match["call"], match["what"], match["rest"], spool)
        if not match or not event:
            continue
        if "<unfinished ...>" in line:
            unfinished[match["pid"]] = event
        elif "= -1 " not in line:
            events.append(event)
    return events


def _classify(call: str, what: str, rest: str, spool: Path) -> str | None:
    segment = what.startswith(str(spool)) and what.endswith(".arrow")
    if segment and call in ("fsync", "fdatasync"):
        return "sync"
    if segment and call in ("write", "writev", "pwrite64"):
        return "write"
    if what.startswith("TCP:") and '"HTTP/1.1 200 ' in rest:
        return "ack"
    return None


def _unsynced_acks(events: list[str]) -> tuple[int, int]:
    """(acks counted, acks with no segment sync between their last write and them).

    Only acks after the first segment write count: earlier 200s answer /readyz.
    """
    acks = violations = 0
    written = synced = False
    for event in events:
        if event == "write":
            written, synced = True, False
        elif event == "sync":
            synced = True
        elif written:
            acks += 1
            violations += not synced
    return acks, violations


def _traced_pid(strace_pid: int) -> int:
    children = Path(f"/proc/{strace_pid}/task/{strace_pid}/children").read_text().split()
    assert len(children) == 1, f"strace should run one child, has {children}"
    return int(children[0])


@pytest.mark.parametrize("durability", ["fsync", "page-cache"])
async def test_every_ack_follows_an_fdatasync_of_its_segment(
    durability: str, tmp_path: Path
) -> None:
    strace = shutil.which("strace")
    assert strace is not None, "strace is missing: make test-deps installs it"
    home = DaemonDir(tmp_path / "d")
    home.write_config(durability=durability)
    trace_path = tmp_path / "strace.txt"
    daemon = Daemon(home)
    wrapper = [strace, "-f", "--seccomp-bpf", "-yy", "-s", "24", "-e", f"trace={_SYSCALLS}"]
    try:
        daemon.start(wrapper=[*wrapper, "-o", str(trace_path)])
        await daemon.wait_ready()
        async with aiohttp.ClientSession() as session:
            for n in range(_REQUESTS):  # one at a time: each 200 follows its own writes
                await daemon.ingest(session, [{"id": n * 10 + i, "v": "x"} for i in range(10)])
        os.kill(_traced_pid(daemon.pid or 0), signal.SIGTERM)
        assert await daemon.wait_exit(within=60) == 0, daemon.tail()
    finally:
        daemon.cleanup()
    trace = trace_path.read_text()
    events = _events(trace, Path(os.path.realpath(home.spool_dir)))  # strace shows real paths
    acks, unsynced = _unsynced_acks(events)
    sample = [line for line in trace.splitlines() if ".arrow" in line or "HTTP/" in line][:6]
    assert acks == _REQUESTS, (
        f"found {acks} acks in the trace, sent {_REQUESTS} requests; events "
        f"{Counter(events)}; sample:\n" + "\n".join(sample)
    )
    if durability == "fsync":
        assert unsynced == 0, f"{unsynced} of {acks} acks were sent before their segment synced"
    else:  # the check can tell: page-cache acks without syncing
        assert unsynced == _REQUESTS
