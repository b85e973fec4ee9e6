"""icespool's asyncio service: config, sources, routing, table writers, worker lanes, commits.

In-process use::

    from daemon import Icespool, load_config

    async with Icespool(load_config("icespool.toml")) as ice:
        writer = ice.writer("demo.events")
        await writer.append(record_batch)      # returns once spooled (acked)
        result = await writer.flush()          # one Iceberg snapshot
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from daemon._lazy import lazy_exports

if TYPE_CHECKING:
    from daemon.config import Config, load_config
    from daemon.errors import (
        BackpressureError,
        BadInputError,
        CatalogError,
        CommitError,
        ConfigError,
        IcespoolError,
        SchemaError,
        ShuttingDownError,
        UnknownTableError,
    )
    from daemon.ingest import Column, TableInput
    from daemon.lanes import Lane, LaneClosedError, LanePool
    from daemon.service import Icespool
    from daemon.writer import FlushResult, TableWriter

__all__ = [
    "BackpressureError",
    "BadInputError",
    "CatalogError",
    "Column",
    "CommitError",
    "Config",
    "ConfigError",
    "FlushResult",
    "Icespool",
    "IcespoolError",
    "Lane",
    "LaneClosedError",
    "LanePool",
    "SchemaError",
    "ShuttingDownError",
    "TableInput",
    "TableWriter",
    "UnknownTableError",
    "load_config",
]

# Imported when first used: see daemon._lazy.
__getattr__ = lazy_exports(
    __name__,
    {
        "daemon.config": (
            "Config",
            "load_config",
        ),
        "daemon.errors": (
            "BackpressureError",
            "BadInputError",
            "CatalogError",
            "CommitError",
            "ConfigError",
            "IcespoolError",
            "SchemaError",
            "ShuttingDownError",
            "UnknownTableError",
        ),
        "daemon.ingest": (
            "Column",
            "TableInput",
        ),
        "daemon.lanes": (
            "Lane",
            "LaneClosedError",
            "LanePool",
        ),
        "daemon.service": ("Icespool",),
        "daemon.writer": (
            "FlushResult",
            "TableWriter",
        ),
    },
)
