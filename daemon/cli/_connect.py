"""``icespool check-config --connect``: what would fail or degrade at start, found now.

Steps, each run whatever the others found: the HTTP token files, the catalog (tables,
declared schemas against existing tables, storage: `icespool.iceberg.check_catalog`),
and each ``[[kafka]]`` source (brokers with the configured security, topics:
`icespool.kafka._check`). A passing step gives lines, a failing one its reason; the
command exits 2 when any failed. Imported only under --connect: the catalog side of
pyiceberg, pyarrow and aiokafka are what the other commands must not load.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from icespool.config import Config
from icespool.errors import ConfigError, IcespoolError

__all__ = ["Finding", "run_checks"]

#: (passed, line): what a step found, or why it failed.
Finding = tuple[bool, str]


def run_checks(config: Config, kafka_timeout: float) -> list[Finding]:
    """Every step's findings, in step order; each Kafka source's check takes at most
    ``kafka_timeout`` seconds (connect, list the topics, say why a connect failed)."""
    steps: list[Callable[[], list[Finding]]] = [
        lambda: _passed(_token_files(config)),
        lambda: _passed(_catalog(config)),
    ]
    if config.kafka:
        steps.append(lambda: asyncio.run(_kafka(config, kafka_timeout)))
    findings: list[Finding] = []
    for step in steps:
        try:
            findings += step()
        except ConfigError as exc:
            findings += [(False, problem.line()) for problem in exc.problems]
        except IcespoolError as exc:
            findings += [(False, line) for line in str(exc).splitlines()]
    return findings


def _passed(lines: list[str]) -> list[Finding]:
    return [(True, line) for line in lines]


def _token_files(config: Config) -> list[str]:
    """Every token file the daemon reads (the admin's too) is readable and holds one
    token; `ConfigError` naming the key and the file. No token is printed."""
    from icespool.http import load_tokens

    http = config.http
    named = [("http.auth_token_file", http.auth_token_file)] if http.auth_token_file else []
    named += [(f"http.tokens[{i}].token_file", t.token_file) for i, t in enumerate(http.tokens)]
    if not named:
        return []
    load_tokens(http)
    return [f"{key}: {path} is readable and holds a token" for key, path in named]


def _catalog(config: Config) -> list[str]:
    from icespool.iceberg import check_catalog

    return check_catalog(config)


async def _kafka(config: Config, seconds: float) -> list[Finding]:
    """One finding per source, the sources checked at the same time."""
    from icespool.kafka._check import check_source

    outcomes = await asyncio.gather(
        *(check_source(source, i, seconds) for i, source in enumerate(config.kafka)),
        return_exceptions=True,
    )
    findings: list[Finding] = []
    for outcome in outcomes:
        if isinstance(outcome, IcespoolError):
            findings.append((False, str(outcome)))
        elif isinstance(outcome, BaseException):
            raise outcome
        else:
            findings.append((True, outcome))
    return findings
