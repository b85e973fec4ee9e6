"""`icespool run` and `icespool replay`: start, serve, drain with a bounded grace period.

Signal handlers only set an event. The first SIGTERM/SIGINT starts the drain
(ingest answers 503, every table commits with reason ``shutdown``); a second one
exits at once with status 130 — safe, because everything acked is in the spool
and is committed at the next start.

Shutdown always ends within the grace plus a few seconds. A call still stuck in a
dependency then (beyond every timeout) is named in the log and the process exits
with status 75 without waiting for it: its records stay in the spool and the next
start commits them (once: commits are idempotent per segment). A SIGTERM while the
daemon is still starting (e.g. waiting for an unreachable catalog) ends it the same way.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import resource
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import uvloop

from icespool.config import Config, TimeoutsConfig
from icespool.errors import ConfigError, IcespoolError
from icespool.http import HttpServer, load_tokens, server_context, start_http
from icespool.http._conn import ConnectionLimits
from icespool.lifecycle.readiness import log_readiness
from icespool.lifecycle.reload import reload
from icespool.lifecycle.sd_notify import SystemdNotifier, status_line
from icespool.lifecycle.service import Icespool
from icespool.runtime.blocking import TrackedExecutor
from icespool.spool import FileSystem, SpoolError, SpoolLockedError
from icespool.write.encode_pool import flush_calls

__all__ = [
    "AFTER_GRACE_SECONDS",
    "EXIT_STUCK",
    "SHUTDOWN_GRACE_SECONDS",
    "replay",
    "run_daemon",
]

_log = logging.getLogger("icespool.app")
#: The default of ``timeouts.shutdown_grace``.
SHUTDOWN_GRACE_SECONDS = TimeoutsConfig().shutdown_grace
# Closing sources, the encode pool, the spool and HTTP after the grace: a SIGTERM always
# ends the process within grace + this (systemd's TimeoutStopSec and Kubernetes'
# terminationGracePeriodSeconds must be longer).
AFTER_GRACE_SECONDS = 5.0
#: A blocking call was still stuck when the shutdown deadline passed (EX_TEMPFAIL).
EXIT_STUCK = 75
_EXIT_FAILED = 1
# The started line names this many tables, then counts the rest.
_STARTED_LISTS = 20
_EXIT_FORCED = 130


def run_daemon(
    config: Config,
    reload_config: Callable[[], Config] | None = None,
    *,
    fs: FileSystem | None = None,
) -> int:
    """Run until SIGTERM/SIGINT; returns the process exit status.

    ``reload_config`` loads the config again on SIGHUP (the CLI passes its own loader,
    so command-line overrides survive a reload); without it SIGHUP is only logged.
    ``fs`` is the spool's file-system seam (tests inject faults and crash points).
    """
    return uvloop.run(_serve(config, reload_config, fs))


def replay(config: Config, *, segments: Sequence[str] = (), all_quarantined: bool = False) -> int:
    """Commit everything the spool holds, then exit (no HTTP, no Kafka).

    ``segments`` (or ``all_quarantined``): quarantined segments to restore and
    commit too, each exactly once. Exit status 1 names what could not be committed.
    """
    return uvloop.run(_replay(config, segments, all_quarantined))


async def _serve(
    config: Config, reload_config: Callable[[], Config] | None, fs: FileSystem | None
) -> int:
    stop = asyncio.Event()
    hangup = asyncio.Event()
    _install_signal_handlers(stop, hangup)
    _prepare_local_dirs(config)
    _raise_open_files_limit()
    try:
        # Read before recovery: a missing token file or a bad certificate fails at once.
        tokens = load_tokens(config.http)
        tls = server_context(config.http)
    except ConfigError as exc:
        _log.error("cannot start: config key %r: %s", exc.key, exc.problem)
        return _EXIT_FAILED
    grace = config.timeouts.shutdown_grace
    executor = TrackedExecutor()
    asyncio.get_running_loop().set_default_executor(executor)
    service = Icespool(config, fs=fs)
    # Started before recovery so the watchdog is fed while a large spool replays.
    systemd = SystemdNotifier.from_environ(lambda: status_line(service))
    systemd.start()
    try:
        # Listening before the start: while it waits (a catalog that does not answer, a
        # long recovery) /healthz, /readyz (saying what it waits for), /metrics and
        # /v1/status answer, and the record endpoints answer 503 + Retry-After.
        http = await start_http(
            service,
            config.http.host,
            config.http.port,
            tokens=tokens,
            tls=tls,
            limits=ConnectionLimits(
                header_timeout=config.http.header_timeout,
                idle_timeout=config.http.idle_timeout,
                max_per_ip=config.http.max_connections_per_ip,
            ),
            max_body_bytes=config.http.max_body_bytes,
        )
    except OSError as exc:
        _log.error(
            "cannot listen on %s: %s; give another address in [http] listen or as "
            "ICESPOOL__HTTP__LISTEN (e.g. ICESPOOL__HTTP__LISTEN=127.0.0.1:8081)",
            config.http.listen,
            exc,
        )
        await systemd.stop()
        return _EXIT_FAILED
    scheme = "https" if http.tls else "http"
    _log.info(
        "icespool listening: %s://%s:%d (not ready until the spool is recovered and the "
        "catalog and tables are loaded)",
        scheme,
        config.http.host,
        http.port,
        extra={"port": http.port},
    )
    starting = asyncio.ensure_future(service.start(wait_for_catalog=True))
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        deadline = time.monotonic() + grace + AFTER_GRACE_SECONDS
        _log.info("stopping before start-up finished; the spool keeps every acked record")
        service.draining = True  # the record endpoints say so while it stops
        starting.cancel()  # start() aborts: pool stopped, spool closed
        await asyncio.wait({starting}, timeout=grace)
        await http.stop()
        await systemd.stop()
        await _exit_if_stuck(executor, deadline)
        _log.info("stopped")
        return 0
    stopped.cancel()
    try:
        starting.result()
    except SpoolLockedError as exc:
        _log.error("%s", exc)
        await http.stop()
        await systemd.stop()
        return _EXIT_FAILED
    except (IcespoolError, OSError) as exc:
        _log.error("cannot start: %s", exc)
        await http.stop()
        await systemd.stop()
        return _EXIT_FAILED
    # Everything alive now (modules, catalog, schemas) lives as long as the process;
    # moving it out of the collector's view keeps full collections short (they
    # otherwise paused ingest for 30-45 ms every ~10 s).
    gc.freeze()
    names = service.table_names
    listed = ", ".join(names[:_STARTED_LISTS]) or "(none)"
    if len(names) > _STARTED_LISTS:  # one line, not 10,000 names (GET /v1/status lists all)
        listed += f" and {len(names) - _STARTED_LISTS} more ({len(names)} tables)"
    url = f"{scheme}://{config.http.host}:{http.port}"
    # Started, not ready: a Kafka source may still be connecting. "icespool ready" is
    # logged by log_readiness once /readyz says so.
    _log.info(
        "icespool started: %s, tables %s, spool %s",
        url,
        listed,
        config.spool.dir,
        extra={"port": http.port, "tables": names[:_STARTED_LISTS], "table_count": len(names)},
    )
    # After the started line: recovery is done and the socket accepts, as READY=1 promises
    # (it means started; /readyz is the readiness probe).
    systemd.ready()
    # Serving: SIGHUP reloads and the readiness log run beside, and end with it.
    async with asyncio.TaskGroup() as group:
        reloader = group.create_task(_reload_on_hangup(service, http, hangup, reload_config))
        readiness = group.create_task(log_readiness(service.not_ready_reason, url, http.port))
        await stop.wait()
        reloader.cancel()
        readiness.cancel()
    deadline = time.monotonic() + grace + AFTER_GRACE_SECONDS
    _log.info("shutting down: committing pending records (grace %gs)", grace)
    service.draining = True  # ingest answers 503 from now on; status stays readable
    systemd.stopping(status_line(service))
    left = 0
    try:
        async with asyncio.timeout(grace + AFTER_GRACE_SECONDS):
            left = await service.stop(grace=grace)
            await http.stop()
    except TimeoutError:
        _log.error("shutdown took longer than %gs; stopping anyway", grace + AFTER_GRACE_SECONDS)
    await systemd.stop()  # after the drain: the watchdog is fed while tables commit
    await _exit_if_stuck(executor, deadline)
    if left:
        # Not "cleanly": an operator draining a replica must not delete this volume.
        _log.warning(
            "stopped with %d segments still in the spool; the next start or `icespool "
            "replay` commits them",
            left,
        )
    else:
        _log.info("stopped cleanly")
    return 0


async def _exit_if_stuck(executor: TrackedExecutor, deadline: float) -> None:
    """Exit now (status 75) if a blocking call is still running at ``deadline``.

    Returning would let the loop's close join that thread, i.e. wait for a dependency
    that may never answer. Nothing is lost: what was not committed is in the spool.
    """

    def running() -> list[tuple[str, float]]:
        # Flushes encode and commit in threads of their own (icespool.write.encode_pool).
        return executor.running() + flush_calls()

    waiting = running()
    if waiting:
        _log.info(
            "waiting up to %.1fs for %d blocking calls: %s",
            deadline - time.monotonic(),
            len(waiting),
            ", ".join(call for call, _ in waiting),
        )
    # Polled: the calls end in other threads, which cannot set a loop's Event.
    while running() and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    stuck = running()
    if not stuck:
        return
    for call, seconds in stuck:
        _log.error("blocking call %s still running after %.1fs", call, seconds)
    _log.error(
        "exiting with status %d without waiting for %d stuck calls; every acked record "
        "is in the spool and the next start commits it",
        EXIT_STUCK,
        len(stuck),
    )
    logging.shutdown()  # os._exit skips the handlers' flush
    os._exit(EXIT_STUCK)


async def _reload_on_hangup(
    service: Icespool,
    http: HttpServer,
    hangup: asyncio.Event,
    reload_config: Callable[[], Config] | None,
) -> None:
    while True:
        await hangup.wait()
        hangup.clear()
        if reload_config is None:
            _log.warning("SIGHUP ignored: this daemon was started without a config loader")
            continue
        try:
            if await reload(service, reload_config) is None:
                continue
            # Token files and the certificate are read again even when their paths did
            # not change: rotating one is rewriting its file and sending SIGHUP.
            done = await http.reload(service.config.http)
        except ConfigError as exc:
            _log.error(
                "SIGHUP: HTTP tokens and TLS certificate not reloaded, keeping the running "
                "ones: %s",
                "; ".join(problem.line() for problem in exc.problems),
            )
            continue
        except Exception:  # a bug in applying a reload must not take the daemon down
            _log.exception("SIGHUP: reload failed; keeping the running config")
            continue
        _log.info("SIGHUP: HTTP reloaded %s", "; ".join(done))


async def _replay(config: Config, segments: Sequence[str], all_quarantined: bool) -> int:
    _prepare_local_dirs(config)
    # On a terminal, one progress line is redrawn in place (the log keeps its own lines).
    line = sys.stderr if sys.stderr.isatty() else None
    service = Icespool(config, progress_line=line)
    try:
        await service.start()  # start() commits every recovered segment first
    except (IcespoolError, OSError) as exc:
        _log.error("replay failed: %s", exc)
        return _EXIT_FAILED
    failed: list[str] = []
    wanted = list(dict.fromkeys(segments))
    if all_quarantined:
        # Also entries whose reason file was lost (a full disk while quarantining): the
        # segment itself names its table, and one that does not verify fails by name.
        wanted += [q.id for q in service.quarantined() if q.id and q.id not in wanted]
    for segment_id in wanted:
        try:
            result = await service.replay_quarantined(segment_id)
        except (IcespoolError, SpoolError, OSError) as exc:
            _log.error("segment %s: %s", segment_id, exc)
            failed.append(segment_id)
            continue
        _log.info(
            "segment %s committed to %s (snapshot %s)",
            segment_id,
            result.table,
            result.snapshot_id,
            extra={"segment": segment_id, "table": result.table},
        )
    degraded = service.degraded()
    await service.stop()
    for name, reason in degraded.items():
        _log.error("table %s could not commit: %s", name, reason)
    left = service.status()["spool"]["segments"]
    if left or failed:
        _log.error(
            "replay finished with %d segments still in the spool%s%s",
            left,
            f" (tables {', '.join(sorted(degraded))})" if degraded else "",
            f"; not committed from quarantine: {', '.join(failed)}" if failed else "",
        )
        return _EXIT_FAILED
    quarantined = service.quarantined()
    if quarantined:
        _log.warning(
            "replay finished; %d segments stay in quarantine (icespool replay --segment ID "
            "retries one): %s",
            len(quarantined),
            ", ".join(f"{q.id} ({q.table}: {q.reason})" for q in quarantined),
        )
    _log.info("replay finished: the spool is empty")
    return 0


def _install_signal_handlers(stop: asyncio.Event, hangup: asyncio.Event | None = None) -> None:
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        if stop.is_set():
            _log.warning("second signal: exiting now; acked records stay in the spool")
            os._exit(_EXIT_FORCED)
        _log.info("received %s", signal.Signals(signum).name)
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    if hangup is not None:
        loop.add_signal_handler(signal.SIGHUP, hangup.set)


def _raise_open_files_limit() -> None:
    """Raise the soft limit of open files to the hard one.

    Every table holding acked records keeps its open spool segment's file open, so
    thousands of busy tables need thousands of descriptors; a soft limit of 1,024 (a
    common default, below the hard limit) would refuse appends with EMFILE.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == resource.RLIM_INFINITY or soft >= hard:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (OSError, ValueError) as exc:
        _log.warning("cannot raise the open-files limit from %d to %d: %s", soft, hard, exc)


def _prepare_local_dirs(config: Config) -> None:
    """Create the local directories the embedded default points at (SQLite won't)."""
    config.spool.dir.mkdir(parents=True, exist_ok=True)
    uri = config.catalog.uri or ""
    if uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
