"""icespool's asyncio service: config, sources, routing, table writers, encode pool, commits."""

from __future__ import annotations

__all__: list[str] = []
