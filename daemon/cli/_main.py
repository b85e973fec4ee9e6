"""The ``icespool`` command: run, replay, status, tables, check-config, spark-conf,
dead-letters.

argparse rather than click/typer: four subcommands with a handful of options need no
dependency, and the standard library's help and error output are good enough.

Exit codes: 0 success, 1 runtime failure, 2 bad usage or bad config.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from icespool.errors import ConfigError, IcespoolError, SparkConfError

# The config model (pydantic, the type grammar) is imported by the commands that load a
# config, not by --help, --version or a status call given --url and --token-file.
if TYPE_CHECKING:
    from icespool.config import Config

__all__ = ["EXIT_FAILURE", "EXIT_OK", "EXIT_USAGE", "build_parser", "main"]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2

#: Seconds one [[kafka]] source's check-config --connect may take.
_KAFKA_CHECK_TIMEOUT = 15.0
_LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def _version() -> str:
    from importlib import metadata  # scans the installed distributions: only for --version

    try:
        return metadata.version("icespool")
    except metadata.PackageNotFoundError:  # running from a source tree without installing
        return "unknown"


class _VersionAction(argparse.Action):
    """argparse's "version" action, with the version looked up only when asked for."""

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(f"icespool {_version()}")
        parser.exit()


def _add_config_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="PATH",
        help="TOML config file (default: $ICESPOOL_CONFIG, else the embedded default: "
        "everything local under ./icespool-data, HTTP on 127.0.0.1:8080)",
    )


def _add_log_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-format", choices=("text", "json"), help="overrides [log] format")
    parser.add_argument(
        "--log-level", type=str.lower, choices=_LOG_LEVELS, help="overrides [log] level"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="icespool",
        description="Ingestion daemon: Kafka/HTTP -> durable Arrow IPC spool -> Parquet -> "
        "Apache Iceberg.",
    )
    parser.add_argument(
        "--version",
        action=_VersionAction,
        nargs=0,
        help="show program's version number and exit",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run the daemon in the foreground")
    _add_config_option(run)
    _add_log_options(run)

    replay = sub.add_parser("replay", help="commit whatever the spool holds, then exit")
    _add_config_option(replay)
    _add_log_options(replay)
    replay.add_argument(
        "--segment",
        action="append",
        default=[],
        metavar="ID",
        help="also restore this quarantined segment and commit it once (repeatable, or a "
        "comma list); it goes back to quarantine, with the new reason, if it still fails",
    )
    replay.add_argument(
        "--all-quarantined",
        action="store_true",
        help="restore and commit every quarantined segment whose table is known",
    )

    check = sub.add_parser(
        "check-config", help="validate and print the effective config (secrets redacted)"
    )
    _add_config_option(check)
    check.add_argument(
        "--format",
        choices=("toml", "json"),
        default="toml",
        help="output format (default: toml, which is valid config input again)",
    )
    check.add_argument(
        "--connect",
        action="store_true",
        help="also check what the daemon needs at start: the token files, the catalog, "
        "every configured table and its declared schema, the storage, and each Kafka "
        "source's brokers and topics (exit 2 naming every step that fails)",
    )
    check.add_argument(
        "--kafka-timeout",
        type=_positive_seconds,
        default=_KAFKA_CHECK_TIMEOUT,
        metavar="SECONDS",
        help=f"how long each Kafka source's check may take (default: {_KAFKA_CHECK_TIMEOUT:g})",
    )

    status = sub.add_parser(
        "status", help="ask the running daemon what it is doing (GET /v1/status)"
    )
    _add_config_option(status)
    _add_daemon_options(status, json_help="print the raw /v1/status JSON")
    status.add_argument(
        "--watch",
        nargs="?",
        const=2.0,
        type=_positive_seconds,
        metavar="SECONDS",
        help="redraw every SECONDS (default 2) until Ctrl-C; on a pipe, print successive snapshots",
    )

    tables = sub.add_parser(
        "tables", help="list the running daemon's tables (--offline: the config's and catalog's)"
    )
    _add_config_option(tables)
    _add_daemon_options(
        tables,
        json_help="print JSON: an object of each table's /v1/status entry with its "
        "'degraded' reason (null when it is not); --offline: a list of "
        '{"table", "source"}',
    )
    tables.add_argument(
        "--offline",
        action="store_true",
        help="no daemon: list the configured tables and those in the catalog namespaces "
        "they use (reads the catalog)",
    )

    spark = sub.add_parser(
        "spark-conf", help="print the Spark settings that read the daemon's catalog"
    )
    _add_config_option(spark)
    _add_spark_conf_options(spark)
    _add_dead_letters_parser(sub)
    return parser


def _add_daemon_options(parser: argparse.ArgumentParser, *, json_help: str) -> None:
    _add_connection_options(parser)
    parser.add_argument(
        "--timeout",
        type=_positive_seconds,
        metavar="SECONDS",
        help="give up on a request after this long (default: 5 s; --offline: the "
        "catalog's start-up timeout)",
    )
    parser.add_argument("--json", action="store_true", help=json_help)


def _add_connection_options(parser: argparse.ArgumentParser) -> None:
    """How a command reaches the running daemon (its URL, token, CA)."""
    parser.add_argument(
        "--url",
        metavar="URL",
        help="the daemon's base URL, e.g. http://127.0.0.1:8080 or https://host:8443 "
        "(default: from the config's [http] listen)",
    )
    parser.add_argument(
        "--token-file",
        metavar="FILE",
        help="file holding the bearer token (default: the config's http.auth_token_file)",
    )
    parser.add_argument(
        "--cafile", metavar="FILE", help="CA bundle that signed an https daemon's certificate"
    )


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value <= 86400:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0 and at most 86400 seconds")
    return value


def _add_spark_conf_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--format",
        choices=("spark-submit", "properties", "json"),
        default="spark-submit",
        help="spark-submit: '--conf k=v' lines; properties: spark-defaults.conf lines; "
        "json: one object (default: spark-submit)",
    )
    parser.add_argument(
        "--catalog-name",
        metavar="NAME",
        help="Spark catalog name (default: [catalog] name; a sql catalog must keep it)",
    )
    from icespool.spark.conf import DEFAULT_SPARK, SPARK_RUNTIMES

    parser.add_argument(
        "--spark",
        choices=tuple(SPARK_RUNTIMES),
        default=DEFAULT_SPARK,
        help="the Spark line whose Iceberg runtime is named (or taken from --runtime-dir): "
        f"{', '.join(SPARK_RUNTIMES)} (default: {DEFAULT_SPARK})",
    )
    parser.add_argument(
        "--runtime-dir",
        metavar="DIR",
        help="local Iceberg Spark runtime (make spark-runtime) whose jars go into spark.jars "
        "(default: $ICESPOOL_SPARK_RUNTIME; neither: spark.jars.packages from Maven)",
    )
    parser.add_argument(
        "--include-secrets",
        action="store_true",
        help="print passwords and tokens the catalog needs (otherwise left out and named "
        "on stderr)",
    )


def _error(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)


def _load(args: argparse.Namespace) -> Config:
    from icespool.config import load_config

    config = load_config(args.config)
    updates: dict[str, Any] = {}
    if getattr(args, "log_level", None):
        updates["level"] = args.log_level
    if getattr(args, "log_format", None):
        updates["format"] = args.log_format
    if updates:
        config = config.model_copy(update={"log": config.log.model_copy(update=updates)})
    return config


def _note_relative_default(args: argparse.Namespace) -> None:
    """The embedded default's data directory is ./icespool-data of the working directory.
    A command that reads it, run from another directory than the daemon's, would look at
    a catalog that is not there: say so on stderr (stdout stays the command's output)."""
    from icespool.config import DEFAULT_DATA_DIR, resolve_config_path

    if resolve_config_path(args.config) is None and not os.path.isdir(DEFAULT_DATA_DIR):
        print(
            f"note: no --config (nor ICESPOOL_CONFIG): the embedded default's data directory "
            f"is ./{DEFAULT_DATA_DIR} of the working directory, "
            f"{os.path.abspath(DEFAULT_DATA_DIR)}, which does not exist; run this where "
            "`icespool run` runs, or pass --config",
            file=sys.stderr,
        )


def _cmd_check_config(args: argparse.Namespace) -> int:
    from icespool.config import env_overrides, redacted, render_toml, resolve_config_path

    if args.connect:
        _note_relative_default(args)
    config = _load(args)
    _check_http_files(config)
    data = redacted(config)
    if args.format == "json":
        print(json.dumps(data, indent=2, ensure_ascii=False))
        return _check_connect(config, args.kafka_timeout) if args.connect else EXIT_OK
    path = resolve_config_path(args.config)
    source = f"config file {path}" if path is not None else "embedded default (no config file)"
    header = [f"icespool effective config from the {source}"]
    overrides = sorted(env_overrides())
    if overrides:
        header.append(f"environment overrides: {', '.join(overrides)}")
    header.append("secrets are shown as ***")
    print(render_toml(data, header="\n".join(header)), end="")
    return _check_connect(config, args.kafka_timeout) if args.connect else EXIT_OK


def _check_http_files(config: Config) -> None:
    """The TLS certificate and key load, and the named token files read (ConfigError
    naming the key otherwise); values are never printed."""
    from icespool.http import load_tokens, server_context

    server_context(config.http)
    load_tokens(config.http, admin_file=False)


def _check_connect(config: Config, kafka_timeout: float) -> int:
    # Imported here: the checks load pyiceberg's catalog side, pyarrow and aiokafka.
    from icespool.cli._connect import run_checks

    sys.stdout.flush()
    findings = run_checks(config, kafka_timeout)
    for passed, line in findings:
        # stderr: stdout stays valid TOML/JSON.
        print(line if passed else f"error: {line}", file=sys.stderr)
    return EXIT_OK if all(passed for passed, _ in findings) else EXIT_USAGE


def _app() -> Any:
    # Imported lazily: the CLI (check-config, --help) must work without the daemon's heavy
    # imports, and import_module keeps type checking independent of icespool.app's state.
    return importlib.import_module("icespool.app")


def _configure_logging(config: Config) -> None:
    from icespool.logs import configure_logging

    configure_logging(config.log.level, config.log.format)


def _cmd_run(args: argparse.Namespace) -> int:
    config = _load(args)
    _configure_logging(config)
    # SIGHUP re-runs the same loading (file, environment, command-line overrides).
    result = _app().run_daemon(config, reload_config=lambda: _load(args))
    return result if isinstance(result, int) else EXIT_OK


def _cmd_replay(args: argparse.Namespace) -> int:
    config = _load(args)
    _configure_logging(config)
    segments = [part.strip() for arg in args.segment for part in arg.split(",") if part.strip()]
    result = _app().replay(config, segments=segments, all_quarantined=args.all_quarantined)
    return result if isinstance(result, int) else EXIT_OK


def _cmd_spark_conf(args: argparse.Namespace) -> int:
    from icespool.spark.conf import RUNTIME_DIR_ENV, render, spark_settings

    _note_relative_default(args)
    config = _load(args)
    runtime_dir = args.runtime_dir or os.environ.get(RUNTIME_DIR_ENV) or None
    try:
        settings = spark_settings(
            config,
            catalog_name=args.catalog_name,
            runtime_dir=runtime_dir,
            include_secrets=args.include_secrets,
            spark=args.spark,
        )
    except SparkConfError as exc:
        _error(str(exc))
        return EXIT_USAGE
    print(render(settings.conf, args.format), end="")
    for key in settings.omitted_secrets:
        print(
            f"note: secret {key} left out; add it at submit time, or rerun with "
            "--include-secrets and keep the output private",
            file=sys.stderr,
        )
    return EXIT_OK


def _status_fetcher(args: argparse.Namespace) -> tuple[str, Callable[[], dict[str, Any]]]:
    """The daemon's URL, and a function that asks it for its status once."""
    from icespool.cli._client import DEFAULT_TIMEOUT, daemon_url, fetch_status, read_token

    config = _load(args) if args.config or not args.url or not args.token_file else None
    url = args.url or daemon_url(_require(config))
    token_file = args.token_file or getattr(_require(config).http, "auth_token_file", None)
    token = read_token(token_file)
    timeout = args.timeout or DEFAULT_TIMEOUT
    return url, lambda: fetch_status(url, token=token, cafile=args.cafile, timeout=timeout)


def _require(config: Config | None) -> Config:
    assert config is not None  # loaded whenever --url or --token-file is missing
    return config


def _cmd_status(args: argparse.Namespace) -> int:
    from icespool.cli._view import render_status

    url, fetch = _status_fetcher(args)

    def render(status: dict[str, Any]) -> str:
        if args.json:
            # Watching: one compact line per snapshot (NDJSON), for scripts.
            indent = None if args.watch else 2
            return json.dumps(status, indent=indent) + "\n"
        return _rendered(render_status, status, url)

    if args.watch is None:
        print(render(fetch()), end="")
        return EXIT_OK
    return _watch(fetch, render, args.watch)


def _watch(
    fetch: Callable[[], dict[str, Any]], render: Callable[[dict[str, Any]], str], every: float
) -> int:
    """Redraw until Ctrl-C (exit 0). A daemon that goes away (restart) is shown, not fatal;
    a refused token is (it will not fix itself)."""
    from icespool.cli._client import DaemonRequestError

    tty = sys.stdout.isatty()
    try:
        while True:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            try:
                text = render(fetch())
            except DaemonRequestError as exc:
                if exc.status in (401, 403):
                    raise
                text = f"error: {exc}\n"
            if tty:  # clear the screen, cursor home: one view redrawn in place
                sys.stdout.write(f"\x1b[H\x1b[2J{stamp}  every {every:g}s, Ctrl-C to stop\n\n")
            elif not text.startswith("{"):
                sys.stdout.write(f"--- {stamp}\n")
            sys.stdout.write(text)
            sys.stdout.flush()
            time.sleep(every)
    except KeyboardInterrupt:
        return EXIT_OK
    except BrokenPipeError:  # `icespool status --watch | head`
        sys.stderr.close()
        return EXIT_OK


def _rendered(render: Callable[..., str], status: dict[str, Any], *args: Any) -> str:
    """A view of ``status``; a status of an unexpected shape (another program on the
    port, a daemon of another version) is an error naming that, not a traceback."""
    from icespool.cli._client import DaemonRequestError

    try:
        return render(status, *args)
    except (TypeError, KeyError, AttributeError, ValueError) as exc:
        raise DaemonRequestError(
            f"the daemon's /v1/status has an unexpected shape ({type(exc).__name__}: {exc}); "
            "is this an icespool daemon of this version?"
        ) from None


def _cmd_tables(args: argparse.Namespace) -> int:
    if args.offline:
        return _tables_offline(args)
    from icespool.cli._view import render_tables

    _, fetch = _status_fetcher(args)
    status = fetch()
    if args.json:
        tables = dict(status.get("tables") or {})
        degraded = status.get("degraded") or {}
        for name in set(tables) | set(degraded):
            tables[name] = {**tables.get(name, {}), "degraded": degraded.get(name)}
        print(json.dumps(tables, indent=2))
        return EXIT_OK
    print(_rendered(render_tables, status), end="")
    return EXIT_OK


def _tables_offline(args: argparse.Namespace) -> int:
    from icespool.iceberg import catalog_tables

    _note_relative_default(args)
    config = _load(args)
    rows = catalog_tables(config, timeout=args.timeout)
    if args.json:
        print(json.dumps([{"table": name, "source": source} for name, source in rows], indent=2))
    elif not rows:
        print("no tables")
    else:
        width = max(len(name) for name, _ in rows)
        for name, source in rows:
            print(f"{name.ljust(width)}  {source}")
    return EXIT_OK


# ---------------------------------------------------------------------- dead-letters


def _add_dead_letters_parser(sub: Any) -> None:
    dead = sub.add_parser("dead-letters", help="work with Kafka dead-letter tables")
    actions = dead.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser(
        "list",
        help="count the dead letters of a dead-letter table by target table and reason, "
        "with the first and last time (read from the catalog; no daemon needed)",
    )
    _add_dead_letter_filters(listing)
    listing.add_argument("--json", action="store_true", help="print JSON")
    replay = actions.add_parser(
        "replay",
        help="ask the running daemon to re-ingest dead letters into their tables (exactly "
        "once) and remove them from the dead-letter table",
    )
    _add_dead_letter_filters(replay)
    replay.add_argument(
        "--limit", type=int, metavar="N", help="at most N dead letters (default 10000)"
    )
    _add_connection_options(replay)
    replay.add_argument(
        "--timeout",
        type=_positive_seconds,
        default=600.0,
        metavar="SECONDS",
        help="how long to wait for the daemon's answer (default 600)",
    )


def _add_dead_letter_filters(parser: argparse.ArgumentParser) -> None:
    """--config, --table and the filters `dead-letters list` and `replay` share."""
    _add_config_option(parser)
    parser.add_argument(
        "--table",
        metavar="NAME",
        help="the dead-letter table (default: the only one the config names)",
    )
    parser.add_argument("--reason", help="only dead letters with this reason (e.g. invalid)")
    parser.add_argument("--topic", help="only records of this topic")
    parser.add_argument("--partition", type=int, metavar="N", help="only this partition")
    parser.add_argument("--from-offset", type=int, metavar="N", help="first offset (inclusive)")
    parser.add_argument("--to-offset", type=int, metavar="N", help="last offset (inclusive)")
    parser.add_argument(
        "--since", metavar="TIME", help="dead-lettered at or after (ISO-8601, default UTC)"
    )
    parser.add_argument("--until", metavar="TIME", help="dead-lettered before (ISO-8601)")
    parser.add_argument("--target-table", metavar="NAME", help="only records meant for it")


def _cmd_dead_letters(args: argparse.Namespace) -> int:
    """`icespool dead-letters list`: read from the catalog. `replay`: one POST to the
    running daemon, which holds the spool lock and the writers (an offline replay would
    need it stopped)."""
    if args.action == "list":
        _note_relative_default(args)
    config = _load(args)
    table = args.table
    if table is None:
        tables = sorted({k.dead_letter_table for k in config.kafka if k.dead_letter_table})
        if len(tables) != 1:
            _error(
                "name the dead-letter table with --table; the config has "
                + (", ".join(tables) if tables else "none")
            )
            return EXIT_USAGE
        table = tables[0]
    from icespool.kafka import REPLAY_FILTER_KEYS

    filters = {
        key: getattr(args, key)
        for key in REPLAY_FILTER_KEYS
        if getattr(args, key, None) is not None
    }
    if args.action == "list":
        from icespool.cli._dead_letters import list_dead_letters
        from icespool.errors import BadInputError

        try:
            print(list_dead_letters(config, table, filters, as_json=args.json), end="")
        except BadInputError as exc:
            _error(str(exc))
            return EXIT_USAGE
        return EXIT_OK
    from icespool.cli._client import DaemonRequestError, daemon_url, post_json, read_token

    url = args.url or daemon_url(config)
    token = read_token(args.token_file or config.http.auth_token_file)
    try:
        answer = post_json(
            url,
            f"/v1/tables/{table}/replay",
            filters,
            token=token,
            cafile=args.cafile,
            timeout=args.timeout,
        )
    except DaemonRequestError as exc:
        if exc.answer and "replayed" in exc.answer:
            print(json.dumps(exc.answer, indent=2))  # what was done before the error
        raise
    print(json.dumps(answer, indent=2))
    return EXIT_OK


_COMMANDS = {
    "run": _cmd_run,
    "replay": _cmd_replay,
    "status": _cmd_status,
    "tables": _cmd_tables,
    "check-config": _cmd_check_config,
    "spark-conf": _cmd_spark_conf,
    "dead-letters": _cmd_dead_letters,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``icespool`` console script; returns the exit code."""
    args = build_parser().parse_args(argv)
    from icespool.config import ConfigFileError

    try:
        code = _COMMANDS[args.command](args)
        sys.stdout.flush()  # a reader gone away shows here, in the handler below
        return code
    except ConfigFileError as exc:
        _error(str(exc))
        return EXIT_USAGE
    except ConfigError as exc:
        for problem in exc.problems:  # every mistake of the config, one per line
            _error(problem.line())
        return EXIT_USAGE
    except ModuleNotFoundError as exc:
        if exc.name != "icespool.app":
            raise
        _error(f"'icespool {args.command}' needs the daemon (icespool.app), which is not built yet")
        return EXIT_USAGE
    except IcespoolError as exc:
        _error(str(exc))
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`icespool tables --json | head`): what it wanted it got.
        # stdout goes to /dev/null so the interpreter's last flush finds no pipe either.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
