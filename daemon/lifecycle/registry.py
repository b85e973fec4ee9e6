"""The daemon's tables by name: their writers, and loading or creating them.

`TableRegistry` loads (or creates) the configured tables at start, registers a
writer per table, creates ``infer = true`` and ``auto_create`` tables from their
first batch, and keeps the tables that could not be loaded (degraded, with why)
for the background reload that `icespool.lifecycle.service.Icespool` runs.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from icespool.config import Config, KafkaConfig, TableConfig
from icespool.errors import BackpressureError, UnknownTableError
from icespool.iceberg import (
    create_inferred,
    create_with,
    existing_table,
    load_declared,
    table_names,
)
from icespool.kafka import OffsetBook, dead_letter_schema
from icespool.maintenance import MaintenanceScheduler, created_table_properties
from icespool.metrics import Metrics
from icespool.runtime.fanout import CATALOG_CONCURRENCY, fan_out
from icespool.runtime.lanes import LanePool
from icespool.schema import Policy, arrow_schema_for
from icespool.spool import Spool
from icespool.write.ingest import AUTO_CREATED
from icespool.write.pressure import PressureRelief
from icespool.write.writer import TableWriter

__all__ = ["RELOAD_INTERVAL", "TableRegistry"]

_log = logging.getLogger("icespool.service")
# How often tables that could not be loaded are tried again.
RELOAD_INTERVAL = 10.0


class TableRegistry:
    """The writers by table name, and the tables not served yet (created from their
    first records, or degraded because they could not be loaded)."""

    def __init__(
        self,
        config: Config,
        *,
        spool: Spool,
        pool: LanePool,
        metrics: Metrics,
        maintenance: MaintenanceScheduler,
        pressure: PressureRelief,
        commit_refusal: Callable[[], str | None],
    ) -> None:
        self.config = config
        self._spool = spool
        self._pool = pool
        self._metrics = metrics
        self._maintenance = maintenance
        self._pressure = pressure
        self._commit_refusal = commit_refusal
        # Set in `Icespool.start` once the catalog answers.
        self.catalog: Catalog | None = None
        self.writers: dict[str, TableWriter] = {}
        self._books: dict[str, OffsetBook] = {}
        self._awaiting_schema: dict[str, TableConfig] = {}
        self._creating: dict[str, asyncio.Lock] = {}
        # Tables that could not be loaded: (their config, why). Retried in the background.
        self.unloaded: dict[str, tuple[TableConfig | None, str]] = {}

    def writer(self, name: str) -> TableWriter:
        """The writer of ``name``; raises why it has none."""
        try:
            return self.writers[name]
        except KeyError:
            if name in self.unloaded:
                raise BackpressureError(
                    f"table {name!r} is degraded: {self.unloaded[name][1]}; "
                    f"retrying every {RELOAD_INTERVAL:.0f}s",
                    retry_after=RELOAD_INTERVAL,
                ) from None
            if name in self._awaiting_schema:
                raise UnknownTableError(
                    f"table {name!r} is created from its first records (infer = true) "
                    "and has none yet"
                ) from None
            raise UnknownTableError(
                f"table {name!r} is not configured; add it to [[tables]]"
            ) from None

    def degraded(self) -> dict[str, str]:
        """Tables that cannot commit now, with the reason (empty when all are fine)."""
        found = {name: reason for name, (_, reason) in self.unloaded.items()}
        for name, writer in self.writers.items():
            if writer.degraded is not None:
                found[name] = writer.degraded
        return found

    async def add_writer(
        self,
        name: str,
        table_config: TableConfig | None,
        *,
        create: bool = False,
        table: Any = None,
        evolve: Policy | None = None,
    ) -> TableWriter:
        if table is None:
            table = await self._open_table(name, table_config, create=create)
        return self._register(name, table_config, table, evolve=evolve)

    async def _open_table(
        self, name: str, table_config: TableConfig | None, *, create: bool = False
    ) -> Table:
        """Load ``name`` from the catalog (in a thread); ``create``: a dead-letter
        table, with our schema, created when missing."""
        catalog = self.require_catalog()
        defaults = created_table_properties(self.config, table_config)
        if create:
            return await asyncio.to_thread(
                create_with, catalog, name, dead_letter_schema(), defaults
            )
        return await asyncio.to_thread(load_declared, catalog, name, table_config, defaults)

    def _register(
        self,
        name: str,
        table_config: TableConfig | None,
        table: Table,
        *,
        evolve: Policy | None = None,
    ) -> TableWriter:
        """Start serving ``name`` with a loaded ``table`` (not started: see `TableWriter.start`)."""
        settings = self.config.writer_settings(name)
        loop = asyncio.get_running_loop()
        writer = TableWriter(
            name,
            table,
            arrow_schema_for(table),
            settings,
            self._spool,
            self._pool.lane(name),
            self._metrics,
            evolve=evolve or (table_config.evolve if table_config else "none"),
            claims=self.book(name).claims,
            key=table_config.key if table_config else (),
            commit_refusal=self._commit_refusal,
            on_spool_refused=self._pressure.refused,
            # Maintenance turns equality deletes into position deletes within seconds.
            on_equality_deletes=functools.partial(
                loop.call_soon_threadsafe, self._maintenance.soon, name
            ),
        )
        self.writers[name] = writer
        self._maintenance.add(name)
        return writer

    async def load_all(self) -> None:
        """Load (or create) every declared table, then the Kafka sources' dead-letter
        tables and the tables their ``auto_create`` made in earlier runs.

        Loads run `CATALOG_CONCURRENCY` at a time (1,000 tables one after the other took
        15 s); writers are registered in config order. A table that cannot be loaded
        is marked degraded alone; the others serve.
        """
        declared = self.config.tables

        async def load(table_config: TableConfig) -> Table | None:
            if table_config.infer and table_config.columns is None:
                # None: created from the first batch it receives.
                return await asyncio.to_thread(
                    existing_table, self.require_catalog(), table_config.name
                )
            return await self._open_table(table_config.name, table_config)

        loaded = await fan_out("loading tables", declared, load, limit=CATALOG_CONCURRENCY)
        for table_config, outcome in zip(declared, loaded, strict=True):
            name = table_config.name
            if isinstance(outcome, Exception):  # this table only: the others serve
                self.mark_unloaded(name, table_config, outcome)
            elif outcome is None:
                self._awaiting_schema[name] = table_config
            else:
                self._register(name, table_config, outcome)
        for kafka in self.config.kafka:
            dead_letters = kafka.dead_letter_table
            if dead_letters is not None and dead_letters not in self.writers:
                try:
                    await self.add_writer(dead_letters, None, create=True)
                except Exception as exc:  # its source waits for it; the rest serve
                    self.mark_unloaded(dead_letters, None, exc)
            if kafka.auto_create:
                names = await asyncio.to_thread(self._auto_created, kafka)
                opened = await fan_out(
                    "loading auto-created tables",
                    names,
                    lambda name: self._open_table(name, None),
                    limit=CATALOG_CONCURRENCY,
                )
                for name, result in zip(names, opened, strict=True):
                    if isinstance(result, Exception):
                        # Like any route's table: its records stay spooled, retried.
                        self.mark_unloaded(name, None, result)
                    elif name not in self.writers:
                        self._register(name, None, result, evolve=AUTO_CREATED)

    def mark_unloaded(self, name: str, table_config: TableConfig | None, exc: Exception) -> None:
        reason = f"cannot load the table: {type(exc).__name__}: {exc}"
        before = self.unloaded.get(name)
        self.unloaded[name] = (table_config, reason)
        self._metrics.table_degraded.labels(table=name).set(1)
        if before is not None and before[1] == reason:
            return  # said already; the reload round sums up who still fails
        _log.error(
            "%s: %s; its records stay spooled, the other tables serve, retrying every %.0fs",
            name,
            reason,
            RELOAD_INTERVAL,
            extra={"table": name, "error": reason},
        )

    async def reload(self, name: str, table_config: TableConfig | None) -> TableWriter | None:
        """Try a degraded table again: its writer (not started) once it loads, None
        (still degraded) when it does not."""
        dead_letters = any(k.dead_letter_table == name for k in self.config.kafka)
        try:
            table = await self._open_table(name, table_config, create=dead_letters)
        except Exception as exc:
            self.mark_unloaded(name, table_config, exc)
            return None
        evolve = None if table_config is not None or dead_letters else self._route_policy(name)
        writer = self._register(name, table_config, table, evolve=evolve)
        del self.unloaded[name]
        self._metrics.table_degraded.labels(table=name).set(0)
        _log.info("%s: loaded; committing its spooled records", name)
        return writer

    def _route_policy(self, name: str) -> Policy | None:
        """The evolve policy of an undeclared table: a Kafka ``auto_create`` route's
        table adds columns as when it was created; any other keeps its schema."""
        for kafka in self.config.kafka:
            if kafka.auto_create and kafka.targets([name]):
                return AUTO_CREATED
        return None

    # ------------------------------------------------------------------ tables from data

    def awaiting_schema(self, name: str) -> bool:
        """Whether ``name`` is an ``infer = true`` table not created yet."""
        return name in self._awaiting_schema and name not in self.writers

    async def create_from(
        self, name: str, incoming: pa.Schema, *, evolve: Policy | None = None
    ) -> TableWriter:
        """Create ``name`` with the schema inferred from ``incoming`` (its first batch)
        and start its writer; another replica's table of that name is used as it is."""
        lock = self._creating.setdefault(name, asyncio.Lock())
        async with lock:
            if name in self.writers:
                return self.writers[name]
            table_config = self._awaiting_schema.get(name)
            settings = self.config.writer_settings(name)
            table = await asyncio.to_thread(
                create_inferred,
                self.require_catalog(),
                name,
                incoming,
                table_config,
                created_table_properties(self.config, table_config),
                max_columns=settings.max_columns,
            )
            writer = await self.add_writer(name, table_config, table=table, evolve=evolve)
            writer.start()
            self._awaiting_schema.pop(name, None)
            _log.info(
                "%s: created from the first batch's schema: %s",
                name,
                ", ".join(f"{f.name} {f.field_type}" for f in table.schema().fields),
                extra={"table": name},
            )
            return writer

    def _auto_created(self, kafka: KafkaConfig) -> list[str]:
        """Tables a Kafka source created in an earlier run (they match its template)."""
        assert self.catalog is not None and kafka.table_template is not None
        namespace = kafka.table_template.split(".", 1)[0]
        listed = table_names(self.catalog, namespace)
        return [n for n in kafka.targets(listed) if n not in self.writers]

    def require_catalog(self) -> Catalog:
        assert self.catalog is not None, "the catalog is loaded in start()"
        return self.catalog

    def book(self, name: str) -> OffsetBook:
        """The Kafka offset bookkeeping of table ``name`` (its writer's claims)."""
        book = self._books.get(name)
        if book is None:
            book = self._books[name] = OffsetBook(name, self._metrics)
        return book

    def load_properties(self, name: str) -> dict[str, str]:
        """A table's current properties, read with a Table of its own (blocking)."""
        assert self.catalog is not None
        return dict(self.catalog.load_table(name).metadata.properties)

    def load_fresh(self, name: str) -> Any:
        """A Table object of its own for ``name`` (blocking)."""
        assert self.catalog is not None
        return self.catalog.load_table(name)
