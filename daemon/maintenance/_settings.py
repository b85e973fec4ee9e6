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

from daemon.config import Config

__all__ = ["MAX_SNAPSHOT_AGE_PROPERTY", "MIN_SNAPSHOTS_PROPERTY", "MaintenanceSettings", "resolve"]

MAX_SNAPSHOT_AGE_PROPERTY: Final = "history.expire.max-snapshot-age-ms"
MIN_SNAPSHOTS_PROPERTY: Final = "history.expire.min-snapshots-to-keep"


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


def _positive_int(properties: Mapping[str, str], key: str) -> int | None:
    """A standard property's value, or None when unset or not a positive integer (a
    value Iceberg's own expiry would refuse too: the daemon's default applies)."""
    try:
        value = int(properties.get(key, ""))
    except ValueError:
        return None
    return value if value > 0 else None


def resolve(config: Config, name: str, properties: Mapping[str, str]) -> MaintenanceSettings:
    """The settings of table ``name`` whose current properties are ``properties``."""
    effective = config.maintenance_for(name)  # the section with the table's override
    override = next(
        (t.maintenance for t in config.tables if t.name == name and t.maintenance is not None),
        None,
    )
    explicit = set(override.overrides()) if override is not None else set()
    max_age = effective.max_snapshot_age
    if "max_snapshot_age" not in explicit:
        age_ms = _positive_int(properties, MAX_SNAPSHOT_AGE_PROPERTY)
        if age_ms is not None:
            max_age = age_ms / 1000
    min_snapshots = effective.min_snapshots
    if "min_snapshots" not in explicit:
        min_snapshots = _positive_int(properties, MIN_SNAPSHOTS_PROPERTY) or min_snapshots
    declared = any(t.name == name for t in config.tables)
    writer = config.table_settings(name) if declared else config.defaults
    return MaintenanceSettings(
        enabled=effective.enabled,
        interval=effective.interval,
        run_timeout=effective.run_timeout,
        max_snapshot_age=max_age,
        min_snapshots=min_snapshots,
        # The cap never drops below the minimum, whichever of them a property set.
        max_snapshots=max(effective.max_snapshots, min_snapshots),
        max_deletes_per_run=effective.max_deletes_per_run,
        compaction=effective.compaction,
        compaction_min_files=effective.compaction_min_files,
        compaction_max_bytes_per_run=effective.compaction_max_bytes_per_run,
        target_file_size=writer.target_file_size,
        orphan_older_than=effective.orphan_older_than,
        apply_to_existing=effective.apply_to_existing,
        lease_ttl=effective.resolved_lease_ttl,
    )
