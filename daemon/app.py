"""`icespool run` and `icespool replay`: start, serve, drain with a bounded grace period.

Signal handlers only set an event. The first SIGTERM/SIGINT starts the drain
(ingest answers 503, every table commits with reason ``shutdown``); a second one
exits at once with status 130 — safe, because everything acked is in the spool
and is committed at the next start.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
from collections.abc import Callable, Sequence
from pathlib import Path

import uvloop

from daemon.config import Config
from daemon.errors import IcespoolError
from daemon.http_api import start_http
from daemon.reload import reload
from daemon.sd_notify import SystemdNotifier, status_line
from daemon.service import Icespool
from spool import SpoolError, SpoolLockedError

__all__ = ["SHUTDOWN_GRACE_SECONDS", "replay", "run_daemon"]

_log = logging.getLogger("icespool.app")
SHUTDOWN_GRACE_SECONDS = 30.0
_EXIT_FAILED = 1
_EXIT_FORCED = 130


def run_daemon(config: Config, reload_config: Callable[[], Config] | None = None) -> int:
    """Run until SIGTERM/SIGINT; returns the process exit status.

    ``reload_config`` loads the config again on SIGHUP (the CLI passes its own loader,
    so command-line overrides survive a reload); without it SIGHUP is only logged.
    """
    return uvloop.run(_serve(config, reload_config))


def replay(config: Config, *, segments: Sequence[str] = (), all_quarantined: bool = False) -> int:
    """Commit everything the spool holds, then exit (no HTTP, no Kafka).

    ``segments`` (or ``all_quarantined``): quarantined segments to restore and
    commit too, each exactly once. Exit status 1 names what could not be committed.
    """
    return uvloop.run(_replay(config, segments, all_quarantined))


async def _serve(config: Config, reload_config: Callable[[], Config] | None = None) -> int:
    stop = asyncio.Event()
    hangup = asyncio.Event()
    _install_signal_handlers(stop, hangup)
    _prepare_local_dirs(config)
    try:
        token = _read_token(config.http.auth_token_file)
    except (OSError, IcespoolError) as exc:
        _log.error("cannot read http.auth_token_file: %s", exc)
        return _EXIT_FAILED
    service = Icespool(config)
    # Started before recovery so the watchdog is fed while a large spool replays.
    systemd = SystemdNotifier.from_environ(lambda: status_line(service))
    systemd.start()
    try:
        await service.start()
    except SpoolLockedError as exc:
        _log.error("%s", exc)
        await systemd.stop()
        return _EXIT_FAILED
    except (IcespoolError, OSError) as exc:
        _log.error("cannot start: %s", exc)
        await systemd.stop()
        return _EXIT_FAILED
    try:
        http = await start_http(
            service,
            config.http.host,
            config.http.port,
            auth_token=token,
            max_body_bytes=config.http.max_body_bytes,
        )
    except OSError as exc:
        _log.error("cannot listen on %s: %s", config.http.listen, exc)
        await service.stop()
        await systemd.stop()
        return _EXIT_FAILED
    # Everything alive now (modules, catalog, schemas) lives as long as the process;
    # moving it out of the collector's view keeps full collections short (they
    # otherwise paused ingest for 30-45 ms every ~10 s).
    gc.freeze()
    _log.info(
        "icespool ready: http://%s:%d, tables %s, spool %s",
        config.http.host,
        http.port,
        ", ".join(service.table_names) or "(none)",
        config.spool.dir,
        extra={"port": http.port, "tables": service.table_names},
    )
    # After the ready line: recovery is done and the socket accepts, as READY=1 promises.
    systemd.ready()
    reloader = asyncio.create_task(_reload_on_hangup(service, hangup, reload_config))
    await stop.wait()
    reloader.cancel()
    _log.info("shutting down: committing pending records (grace %.0fs)", SHUTDOWN_GRACE_SECONDS)
    service.draining = True  # ingest answers 503 from now on; status stays readable
    systemd.stopping(status_line(service))
    await service.stop(grace=SHUTDOWN_GRACE_SECONDS)
    await http.stop()
    await systemd.stop()  # after the drain: the watchdog is fed while tables commit
    _log.info("stopped cleanly")
    return 0


async def _reload_on_hangup(
    service: Icespool, hangup: asyncio.Event, reload_config: Callable[[], Config] | None
) -> None:
    while True:
        await hangup.wait()
        hangup.clear()
        if reload_config is None:
            _log.warning("SIGHUP ignored: this daemon was started without a config loader")
            continue
        await reload(service, reload_config)


async def _replay(config: Config, segments: Sequence[str], all_quarantined: bool) -> int:
    _prepare_local_dirs(config)
    service = Icespool(config)
    try:
        await service.start()  # start() commits every recovered segment first
    except (IcespoolError, OSError) as exc:
        _log.error("replay failed: %s", exc)
        return _EXIT_FAILED
    failed: list[str] = []
    wanted = list(dict.fromkeys(segments))
    if all_quarantined:
        wanted += [q.id for q in service.quarantined() if q.id and q.table and q.id not in wanted]
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


def _prepare_local_dirs(config: Config) -> None:
    """Create the local directories the embedded default points at (SQLite won't)."""
    config.spool.dir.mkdir(parents=True, exist_ok=True)
    uri = config.catalog.uri or ""
    if uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)


def _read_token(path: Path | str | None) -> str | None:
    if not path:
        return None
    token = Path(path).read_text().strip()
    if not token:
        raise IcespoolError(f"http.auth_token_file {path} is empty")
    return token
