"""What a commit claims besides its rows: the source positions the rows come from.

A source that must be exactly-once by position (Kafka) attaches metadata to each
spooled batch and gives the table's writer a `ClaimsFactory`. For every commit the
writer asks it for a fresh `Claims`, which

- drops rows the table already holds (`filter`, against the table's properties),
- says what to add to the snapshot summary and which table properties to set in
  the same commit (`summary`, `properties`; the latter raises `ClaimsMovedError`
  when another writer committed some of the same positions meanwhile),
- and, when the commit's segments are quarantined instead, keeps their positions
  from being recorded as held by anything else (`withhold`).

The writer knows nothing of what the positions are; sources without positions
(HTTP, the Python API) use `NO_CLAIMS`, which lets every batch through.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import pyarrow as pa

from icespool.iceberg import ClaimsMovedError

__all__ = ["NO_CLAIMS", "Claims", "ClaimsFactory", "ClaimsMovedError"]


class Claims(Protocol):
    def filter(
        self,
        batches: Sequence[pa.RecordBatch],
        metas: Sequence[Mapping[str, object] | None],
        properties: Mapping[str, str],
    ) -> list[pa.RecordBatch]:
        """The rows of ``batches`` the table (``properties``) does not hold yet."""

    def summary(self) -> dict[str, str]:
        """Snapshot summary entries naming what this commit covers."""

    def properties(self, current: Mapping[str, str]) -> dict[str, str]:
        """Table properties to set in the commit, decided on ``current``."""

    def withhold(self) -> None:
        """The commit's segments were quarantined: their positions are not held."""

    def positional(self, meta: Mapping[str, object] | None) -> bool:
        """Whether `filter` drops the rows of a batch with ``meta`` that the table holds,
        by their source positions (then the writer need not drop them itself)."""


ClaimsFactory = Callable[[], Claims]


class _NoClaims:
    def filter(
        self,
        batches: Sequence[pa.RecordBatch],
        metas: Sequence[Mapping[str, object] | None],
        properties: Mapping[str, str],
    ) -> list[pa.RecordBatch]:
        del metas, properties
        return list(batches)

    def summary(self) -> dict[str, str]:
        return {}

    def properties(self, current: Mapping[str, str]) -> dict[str, str]:
        del current
        return {}

    def withhold(self) -> None:
        pass

    def positional(self, meta: Mapping[str, object] | None) -> bool:
        del meta
        return False


def NO_CLAIMS() -> Claims:
    """Claims for batches without source positions: every row goes in."""
    return _NoClaims()
