"""SIGHUP: re-read the config file and apply what can change without a restart.

Applied at once: the writer settings (``[defaults]`` and each table's overrides of
``max_batch_records``, ``max_batch_bytes``, ``batch_timeout``, ``target_file_size``,
``compression``, ``row_group_records``, ``max_queue_bytes``, ``max_nesting_depth``,
``max_columns``) and ``[log]``. Every writer reads its settings at each trigger
check, flush and schema change, so handing it the new ones
(`icespool.write.writer.TableWriter.apply_settings`) is enough.

Also applied: the HTTP secrets (``http.auth_token_file``, ``http.tokens``,
``http.tls_cert_file``/``tls_key_file`` while TLS stays on): the daemon reads the token
files and the certificate again on every SIGHUP (`icespool.http.HttpServer.reload`),
so rotating one is rewriting its file and sending SIGHUP.

Everything else (catalog, spool, the rest of http, encode, Kafka sources, tables added or
removed, a table's schema or partitioning) is wired into long-lived objects at start;
those changes are reported at warning by key, and take effect at the next restart.
Secret values are never printed: not-applied keys are listed by name only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from icespool.config import Config, HttpConfig, TableConfig, WriterSettings
from icespool.errors import ConfigError
from icespool.logs import configure_logging

if TYPE_CHECKING:  # only for annotations: the service module imports pyiceberg
    from icespool.lifecycle.service import Icespool

__all__ = ["RELOADABLE_TABLE_KEYS", "ReloadPlan", "apply_reload", "plan_reload", "reload"]

_log = logging.getLogger("icespool.reload")

RELOADABLE_TABLE_KEYS = tuple(WriterSettings.model_fields)
# Sections that are built into long-lived objects at start (sockets, catalog, spool, pool).
_RESTART_SECTIONS = ("catalog", "spool", "http", "encode", "timeouts")
# Keys of [http] applied by a reload (prefixes of the flattened keys, tokens[i].x too).
_HTTP_SECRETS = ("auth_token_file", "tokens", "tls_cert_file", "tls_key_file")


@dataclass(frozen=True)
class ReloadPlan:
    """What a reload changes: the config to run with, and what it could not apply."""

    config: Config
    applied: tuple[str, ...]
    not_applied: tuple[str, ...]
    # Effective writer settings per running table that changed.
    settings: Mapping[str, WriterSettings] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return bool(self.applied or self.not_applied)


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> dict[str, Any]:
    if isinstance(value, dict):
        for key, item in value.items():
            _flatten(item, f"{prefix}.{key}" if prefix else str(key), out)
    elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        for i, item in enumerate(value):
            _flatten(item, f"{prefix}[{i}]", out)
    else:
        out[prefix] = value
    return out


def _dump(model: Any) -> dict[str, Any]:
    # The JSON dump spells sizes and durations as a config file does ("256MiB", "60s").
    data: dict[str, Any] = model.model_dump(mode="json", by_alias=True)
    return data


def _changed_keys(old: Any, new: Any, prefix: str) -> list[str]:
    a = _flatten(_dump(old), prefix, {})
    b = _flatten(_dump(new), prefix, {})
    return sorted(k for k in a.keys() | b.keys() if a.get(k, None) != b.get(k, None))


def _describe(key: str, old: Any, new: Any) -> str:
    return f"{key}: {_json_value(old)} -> {_json_value(new)}"


def _json_value(value: Any) -> str:
    return "(default)" if value is None else str(value)


def plan_reload(old: Config, new: Config, running_tables: Iterable[str]) -> ReloadPlan:
    """Compare the running config with a freshly loaded one; pure, nothing is applied."""
    applied: list[str] = []
    not_applied: list[str] = []

    for section in _RESTART_SECTIONS:
        not_applied += _changed_keys(getattr(old, section), getattr(new, section), section)
    # HTTP secrets are re-read on every SIGHUP; turning TLS on or off needs a new listener.
    secrets = _HTTP_SECRETS if old.http.tls == new.http.tls else _HTTP_SECRETS[:2]
    http_applied = [k for k in not_applied if k.removeprefix("http.").startswith(secrets)]
    not_applied = [k for k in not_applied if k not in http_applied]
    applied += [f"{key} (re-read)" for key in http_applied]
    http = old.http.model_copy(
        update={key: getattr(new.http, key) for key in secrets if key in HttpConfig.model_fields}
    )

    old_kafka = [_dump(k) for k in old.kafka]
    new_kafka = [_dump(k) for k in new.kafka]
    if old_kafka != new_kafka:
        a = _flatten(old_kafka, "kafka", {}) if old_kafka else {}
        b = _flatten(new_kafka, "kafka", {}) if new_kafka else {}
        keys = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        not_applied += keys or ["kafka"]

    old_defaults, new_defaults = _dump(old.defaults), _dump(new.defaults)
    for key in RELOADABLE_TABLE_KEYS:
        if old_defaults[key] != new_defaults[key]:
            applied.append(_describe(f"defaults.{key}", old_defaults[key], new_defaults[key]))
    old_log, new_log = _dump(old.log), _dump(new.log)
    for key in old_log:
        if old_log[key] != new_log[key]:
            applied.append(_describe(f"log.{key}", old_log[key], new_log[key]))

    old_tables = {t.name: t for t in old.tables}
    new_tables = {t.name: t for t in new.tables}
    for name in old_tables.keys() - new_tables.keys():
        not_applied.append(f"tables[{name!r}] removed (its writer runs until restart)")
    for name in new_tables.keys() - old_tables.keys():
        not_applied.append(f"tables[{name!r}] added (created and served after a restart)")
    merged: list[TableConfig] = []
    for table in old.tables:
        fresh = new_tables.get(table.name)
        if fresh is None:
            merged.append(table)
            continue
        before, after = _dump(table), _dump(fresh)
        for key in sorted(before.keys() | after.keys()):
            if before.get(key) == after.get(key):
                continue
            label = f"tables[{table.name!r}].{key}"
            if key in RELOADABLE_TABLE_KEYS:
                applied.append(_describe(label, before.get(key), after.get(key)))
            else:
                not_applied.append(label)
        merged.append(
            table.model_copy(update={k: getattr(fresh, k) for k in RELOADABLE_TABLE_KEYS})
        )

    effective = old.model_copy(
        update={"defaults": new.defaults, "log": new.log, "tables": merged, "http": http}
    )
    settings: dict[str, WriterSettings] = {}
    for name in running_tables:
        if name in old_tables and name not in new_tables:
            continue  # removed from the file: it keeps what it runs with until restart
        before_s, after_s = old.writer_settings(name), effective.writer_settings(name)
        if before_s != after_s:
            settings[name] = after_s
    return ReloadPlan(effective, tuple(applied), tuple(sorted(not_applied)), settings)


def apply_reload(service: Icespool, plan: ReloadPlan) -> None:
    """Install ``plan`` in a running `Icespool` service (on its event loop)."""
    old_log = service.config.log
    for name, settings in plan.settings.items():
        service.table_writer(name).apply_settings(settings)
    service.config = plan.config
    new_log = plan.config.log
    if new_log.format != old_log.format:
        configure_logging(new_log.level, new_log.format)
    elif new_log.level != old_log.level:
        logging.getLogger().setLevel(new_log.level.upper())


async def reload(service: Icespool, load: Callable[[], Config]) -> ReloadPlan | None:
    """Load the config again (``load``), apply what can be applied and log the outcome.

    A config that does not load or validate changes nothing: the daemon keeps running
    with the config it has, and the error names the key.
    """
    if service.draining:
        _log.warning("SIGHUP ignored: the daemon is shutting down")
        return None
    try:
        # Reading the file is blocking I/O; validation is quick but runs with it.
        new = await asyncio.to_thread(load)
    except ConfigError as exc:
        where = "; ".join(problem.line() for problem in exc.problems)
        _log.error("SIGHUP: config not reloaded, keeping the running config: %s", where)
        return None
    except OSError as exc:
        _log.error("SIGHUP: config not reloaded, keeping the running config: %s", exc)
        return None
    plan = plan_reload(service.config, new, service.table_names)
    apply_reload(service, plan)
    if not plan.changed:
        _log.info("SIGHUP: config reloaded, nothing changed")
        return plan
    if plan.applied:
        _log.info(
            "SIGHUP: applied %s",
            "; ".join(plan.applied),
            extra={"applied": list(plan.applied), "tables": sorted(plan.settings)},
        )
    if plan.not_applied:
        _log.warning(
            "SIGHUP: not applied (needs a restart): %s",
            "; ".join(plan.not_applied),
            extra={"not_applied": list(plan.not_applied)},
        )
    return plan
