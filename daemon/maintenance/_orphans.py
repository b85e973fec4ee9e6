"""Placeholder of i13-compact's module (data files written but never committed): the
interface of the design file, so the scheduler's orphan task imports. The real module
replaces this file when the branches are merged."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pyiceberg.table import Table

__all__ = ["OrphanResult", "remove_orphans"]


@dataclass(frozen=True)
class OrphanResult:
    """What ``remove_orphans`` removed."""

    removed: int = 0


def remove_orphans(
    table: Table, *, older_than_s: float, is_spooled: Callable[[str], bool]
) -> OrphanResult:
    raise NotImplementedError("orphan removal is i13-compact's part")
