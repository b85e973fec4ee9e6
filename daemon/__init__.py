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
    from icespool.lifecycle.service import Icespool
    from icespool.runtime.lanes import Lane, LaneClosedError, LanePool
    from icespool.write.ingest import Column, TableInput
    from icespool.write.result import FlushResult
    from icespool.write.writer import TableWriter

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
        "icespool.write.ingest": (
            "Column",
            "TableInput",
        ),
        "icespool.runtime.lanes": (
            "Lane",
            "LaneClosedError",
            "LanePool",
        ),
        "icespool.lifecycle.service": ("Icespool",),
        "icespool.write.result": ("FlushResult",),
        "icespool.write.writer": ("TableWriter",),
    },
)
