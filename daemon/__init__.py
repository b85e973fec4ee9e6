"""icespool's asyncio service: config, sources, routing, table writers, encode pool, commits.

In-process use::

    from daemon import Icespool, load_config

    async with Icespool(load_config("icespool.toml")) as ice:
        writer = ice.writer("demo.events")
        await writer.append(record_batch)      # returns once spooled (acked)
        result = await writer.flush()          # one Iceberg snapshot
"""

from __future__ import annotations

from daemon.config import Config, load_config
from daemon.encode_pool import EncodePool, Lane, LaneClosedError
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
from daemon.service import Icespool
from daemon.writer import Column, FlushResult, TableWriter

__all__ = [
    "BackpressureError",
    "BadInputError",
    "CatalogError",
    "Column",
    "CommitError",
    "Config",
    "ConfigError",
    "EncodePool",
    "FlushResult",
    "Icespool",
    "IcespoolError",
    "Lane",
    "LaneClosedError",
    "SchemaError",
    "ShuttingDownError",
    "TableWriter",
    "UnknownTableError",
    "load_config",
]
