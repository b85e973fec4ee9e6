"""icespool's asyncio service: config, sources, routing, table writers, worker lanes, commits.

In-process use::

    from icespool import Icespool, load_config

    async with Icespool(load_config("icespool.toml")) as ice:
        writer = ice.writer("demo.events")
        await writer.append(record_batch)      # returns once spooled (acked)
        result = await writer.flush()          # one Iceberg snapshot
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from icespool._lazy import lazy_exports

if TYPE_CHECKING:
    from icespool.config import Config, load_config
    from icespool.errors import (
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
    from icespool.ingest import Column, TableInput
    from icespool.lanes import Lane, LaneClosedError, LanePool
    from icespool.service import Icespool
    from icespool.writer import FlushResult, TableWriter

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

# Imported when first used: see icespool._lazy.
__getattr__ = lazy_exports(
    __name__,
    {
        "icespool.config": (
            "Config",
            "load_config",
        ),
        "icespool.errors": (
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
        "icespool.ingest": (
            "Column",
            "TableInput",
        ),
        "icespool.lanes": (
            "Lane",
            "LaneClosedError",
            "LanePool",
        ),
        "icespool.service": ("Icespool",),
        "icespool.writer": (
            "FlushResult",
            "TableWriter",
        ),
    },
)
