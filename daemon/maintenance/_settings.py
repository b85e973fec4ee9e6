"""One table's maintenance settings: ``[maintenance]``, its ``[[tables]]`` override, and
the table's own standard retention properties.

Precedence, most specific first: the table's ``maintenance = {...}`` in the daemon's
config (an operator's explicit word for this table), then the table's standard Iceberg
properties (``history.expire.*``: what Spark's and Java's expiry honour too, set by
whoever owns the table), then ``[maintenance]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from icespool.config import Config, MaintenanceConfig, TableConfig, TimeoutsConfig
from icespool.iceberg import MAX_SNAPSHOT_AGE_MS, MIN_SNAPSHOTS_TO_KEEP, table_defaults
from icespool.iceberg._properties import int_property
from icespool.runtime.retry import CONFLICTS

__all__ = [
    "MAX_SNAPSHOT_AGE_PROPERTY",
    "MIN_SNAPSHOTS_PROPERTY",
    "MaintenanceSettings",
    "commit_window",
    "created_table_properties",
    "effective",
    "resolve",
]

MAX_SNAPSHOT_AGE_PROPERTY: Final = MAX_SNAPSHOT_AGE_MS
MIN_SNAPSHOTS_PROPERTY: Final = MIN_SNAPSHOTS_TO_KEEP


@dataclass(frozen=True, slots=True)
class MaintenanceSettings:
    """What one maintenance run of one table does (durations in seconds)."""

    enabled: bool
    interval: float
    run_timeout: float
    max_snapshot_age: float
    min_snapshots: int
    max_snapshots: int
    max_deletes_per_run: int
    compaction: bool
    compaction_min_files: int
    compaction_max_bytes_per_run: int
    target_file_size: int
    orphan_older_than: float
    apply_to_existing: bool
    lease_ttl: float


def commit_window(timeouts: TimeoutsConfig) -> float:
    """The longest a daemon sharing these ``[timeouts]`` may take from writing a data
    file to committing it (``commit_files``: its attempts, each a refresh and a swap
    in the catalog and the manifest writes in storage, and the backoff between them).

    The orphan sweep protects this replica's own files by its spool, another
    replica's only by their age: a file younger than this may still be committed.
    """
    attempt = 2 * timeouts.catalog_request + timeouts.storage_attempts * timeouts.storage_request
    pauses = sum(
        min(CONFLICTS.cap, CONFLICTS.base * (1 << n)) for n in range(CONFLICTS.attempts - 1)
    )
    return CONFLICTS.attempts * attempt + pauses


def effective(config: Config, table: TableConfig | None) -> MaintenanceConfig:
    """``[maintenance]`` overlaid by the table's ``maintenance = {...}`` (if any)."""
    if table is None or table.maintenance is None:
        return config.maintenance
    return config.maintenance.model_copy(update=table.maintenance.overrides())


def created_table_properties(config: Config, table: TableConfig | None) -> dict[str, str]:
    """The properties a table the daemon creates gets (``iceberg.table_defaults``) with
    the retention of its effective ``[maintenance]``, so Spark's expire_snapshots and
    the daemon's expiry apply the same policy."""
    merged = effective(config, table)
    return table_defaults(
        max_snapshot_age_ms=int(merged.max_snapshot_age * 1000),
        min_snapshots_to_keep=merged.min_snapshots,
    )


def resolve(
    config: Config,
    table: TableConfig | None,
    properties: Mapping[str, str],
    *,
    name: str | None = None,
) -> MaintenanceSettings:
    """The settings of a table (``table``: its ``[[tables]]`` entry, None for tables
    not declared: dead-letter and auto-created ones) whose properties are ``properties``.

    A retention property that is no positive integer (a value Iceberg's own expiry would
    refuse too) is logged naming the table (``name``, else the entry's) and the
    daemon's setting applies."""
    label = name or (table.name if table is not None else "(undeclared)")
    merged = effective(config, table)
    explicit = set(table.maintenance.overrides()) if table and table.maintenance else set()
    max_age = merged.max_snapshot_age
    if "max_snapshot_age" not in explicit:
        age_ms = int_property(properties, MAX_SNAPSHOT_AGE_PROPERTY, None, table=label)
        if age_ms is not None:
            max_age = age_ms / 1000
    min_snapshots = merged.min_snapshots
    if "min_snapshots" not in explicit:
        min_snapshots = (
            int_property(properties, MIN_SNAPSHOTS_PROPERTY, None, table=label) or min_snapshots
        )
    writer = config.defaults.model_copy(update=table.overrides()) if table else config.defaults
    return MaintenanceSettings(
        enabled=merged.enabled,
        interval=merged.interval,
        run_timeout=merged.run_timeout,
        max_snapshot_age=max_age,
        min_snapshots=min_snapshots,
        # The cap never drops below the minimum, whichever of them a property set.
        max_snapshots=max(merged.max_snapshots, min_snapshots),
        max_deletes_per_run=merged.max_deletes_per_run,
        compaction=merged.compaction,
        compaction_min_files=merged.compaction_min_files,
        compaction_max_bytes_per_run=merged.compaction_max_bytes_per_run,
        target_file_size=writer.target_file_size,
        # Never below what another replica may still be committing (commit_window):
        # removing such a file would leave its commit pointing at nothing.
        orphan_older_than=max(merged.orphan_older_than, commit_window(config.timeouts)),
        apply_to_existing=merged.apply_to_existing,
        lease_ttl=merged.resolved_lease_ttl,
    )
