"""The ``icespool`` command: run, replay, check-config, spark-conf, dead-letters.

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
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from daemon.config import (
    Config,
    ConfigFileError,
    env_overrides,
    load_config,
    redacted,
    render_toml,
    resolve_config_path,
)
from daemon.errors import ConfigError, IcespoolError, SparkConfError

__all__ = ["build_parser", "main"]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2

_LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def _version() -> str:
    try:
        return metadata.version("icespool")
    except metadata.PackageNotFoundError:  # running from a source tree without installing
        return "unknown"


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
    parser.add_argument("--version", action="version", version=f"icespool {_version()}")
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
        help="also load the catalog, list it and look up every configured table "
        "(exit 2 when it is unreachable or a table is missing)",
    )

    spark = sub.add_parser(
        "spark-conf", help="print the Spark settings that read the daemon's catalog"
    )
    _add_config_option(spark)
    _add_spark_conf_options(spark)
    _add_dead_letters_parser(sub)
    return parser


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
    config = load_config(args.config)
    updates: dict[str, Any] = {}
    if getattr(args, "log_level", None):
        updates["level"] = args.log_level
    if getattr(args, "log_format", None):
        updates["format"] = args.log_format
    if updates:
        config = config.model_copy(update={"log": config.log.model_copy(update=updates)})
    return config


def _cmd_check_config(args: argparse.Namespace) -> int:
    config = _load(args)
    data = redacted(config)
    if args.format == "json":
        print(json.dumps(data, indent=2, ensure_ascii=False))
        return _check_connect(config) if args.connect else EXIT_OK
    path = resolve_config_path(args.config)
    source = f"config file {path}" if path is not None else "embedded default (no config file)"
    header = [f"icespool effective config from the {source}"]
    overrides = sorted(env_overrides())
    if overrides:
        header.append(f"environment overrides: {', '.join(overrides)}")
    header.append("secrets are shown as ***")
    print(render_toml(data, header="\n".join(header)), end="")
    return _check_connect(config) if args.connect else EXIT_OK


def _check_connect(config: Config) -> int:
    # Imported here: pyiceberg is heavy and only --connect needs it.
    from daemon.iceberg import check_catalog

    sys.stdout.flush()
    try:
        lines = check_catalog(config)
    except IcespoolError as exc:
        _error(str(exc))
        return EXIT_USAGE
    for line in lines:
        print(line, file=sys.stderr)  # stdout stays valid TOML/JSON
    return EXIT_OK


def _app() -> Any:
    # Imported lazily: the CLI (check-config, --help) must work without the daemon's heavy
    # imports, and import_module keeps type checking independent of daemon.app's state.
    return importlib.import_module("daemon.app")


def _configure_logging(config: Config) -> None:
    from daemon.logs import configure_logging

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
    from daemon.spark_conf import RUNTIME_DIR_ENV, render, spark_settings

    config = _load(args)
    runtime_dir = args.runtime_dir or os.environ.get(RUNTIME_DIR_ENV) or None
    try:
        settings = spark_settings(
            config,
            catalog_name=args.catalog_name,
            runtime_dir=runtime_dir,
            include_secrets=args.include_secrets,
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


# ---------------------------------------------------------------------- dead-letters


def _add_dead_letters_parser(sub: Any) -> None:
    dead = sub.add_parser("dead-letters", help="work with Kafka dead-letter tables")
    actions = dead.add_subparsers(dest="action", required=True, metavar="ACTION")
    replay = actions.add_parser(
        "replay",
        help="ask the running daemon to re-ingest dead letters into their tables (exactly "
        "once) and remove them from the dead-letter table",
    )
    _add_config_option(replay)
    replay.add_argument(
        "--table",
        metavar="NAME",
        help="the dead-letter table (default: the only one the config names)",
    )
    replay.add_argument("--reason", help="only dead letters with this reason (e.g. invalid)")
    replay.add_argument("--topic", help="only records of this topic")
    replay.add_argument("--partition", type=int, metavar="N", help="only this partition")
    replay.add_argument("--from-offset", type=int, metavar="N", help="first offset (inclusive)")
    replay.add_argument("--to-offset", type=int, metavar="N", help="last offset (inclusive)")
    replay.add_argument(
        "--since", metavar="TIME", help="dead-lettered at or after (ISO-8601, default UTC)"
    )
    replay.add_argument("--until", metavar="TIME", help="dead-lettered before (ISO-8601)")
    replay.add_argument("--target-table", metavar="NAME", help="only records meant for it")
    replay.add_argument(
        "--limit", type=int, metavar="N", help="at most N dead letters (default 10000)"
    )
    replay.add_argument(
        "--url",
        metavar="URL",
        help="the daemon's base URL (default: from [http] listen in the config)",
    )
    replay.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="how long to wait for the daemon's answer (default 600)",
    )


def _cmd_dead_letters(args: argparse.Namespace) -> int:
    """`icespool dead-letters replay`: one POST to the running daemon, which holds the
    spool lock and the writers (an offline replay would need it stopped)."""
    import urllib.error
    import urllib.request

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
    filters = {
        key: getattr(args, key)
        for key in (
            "reason",
            "topic",
            "partition",
            "from_offset",
            "to_offset",
            "since",
            "until",
            "target_table",
            "limit",
        )
        if getattr(args, key) is not None
    }
    base = args.url or _local_url(config)
    if base is None:
        _error(f"[http] listen is {config.http.listen!r}; pass the daemon's address with --url")
        return EXIT_USAGE
    headers = {"Content-Type": "application/json"}
    if config.http.auth_token_file:
        token = Path(config.http.auth_token_file).read_text().strip()
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(
        f"{base.rstrip('/')}/v1/tables/{table}/replay",
        data=json.dumps(filters).encode(),
        headers=headers,
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=args.timeout) as response:
            body = response.read().decode()
    except urllib.error.HTTPError as exc:
        text = exc.read().decode(errors="replace")
        try:
            answer = json.loads(text)
        except ValueError:
            answer = {"error": text}
        if "replayed" in answer:
            print(json.dumps(answer, indent=2))  # what was done before the error
        _error(f"the daemon answered {exc.code}: {answer.get('error', text)}")
        return EXIT_FAILURE
    except (urllib.error.URLError, OSError) as exc:
        _error(f"cannot reach the daemon at {base}: {exc}; is `icespool run` running?")
        return EXIT_FAILURE
    print(json.dumps(json.loads(body), indent=2))
    return EXIT_OK


def _local_url(config: Config) -> str | None:
    host, port = config.http.host, config.http.port
    if port == 0:
        return None
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


_COMMANDS = {
    "run": _cmd_run,
    "replay": _cmd_replay,
    "check-config": _cmd_check_config,
    "spark-conf": _cmd_spark_conf,
    "dead-letters": _cmd_dead_letters,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``icespool`` console script; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        return _COMMANDS[args.command](args)
    except ConfigFileError as exc:
        _error(str(exc))
        return EXIT_USAGE
    except ConfigError as exc:
        for problem in exc.problems:  # every mistake of the config, one per line
            _error(problem.line())
        return EXIT_USAGE
    except ModuleNotFoundError as exc:
        if exc.name != "daemon.app":
            raise
        _error(f"'icespool {args.command}' needs the daemon (daemon.app), which is not built yet")
        return EXIT_USAGE
    except IcespoolError as exc:
        _error(str(exc))
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return 130
