"""Placeholder of i13-compact's module (bin-packing the daemon's small files): the
interface of the design file, so the scheduler's compaction task imports. The real
module replaces this file when the branches are merged."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pyiceberg.manifest import DataFile
from pyiceberg.table import Table

__all__ = [
    "CompactionPlan",
    "CompactionResult",
    "IoBudget",
    "commit_rewrite",
    "plan_compaction",
    "rewrite",
]


class IoBudget:
    """Bytes/s token bucket shared by compaction (and anything else heavy)."""

    def __init__(self, bytes_per_second: int) -> None:
        self.bytes_per_second = bytes_per_second


@dataclass(frozen=True)
class CompactionPlan:
    """Files of one partition bin to rewrite into bigger ones."""


@dataclass(frozen=True)
class CompactionResult:
    """What ``commit_rewrite`` committed."""


def plan_compaction(
    table: Table,
    *,
    target_file_size: int,
    min_input_files: int = 5,
    max_bytes: int,
    own_file: Callable[[str], bool],
) -> list[CompactionPlan]:
    raise NotImplementedError("compaction is i13-compact's part")


def rewrite(table: Table, plan: CompactionPlan, *, budget: IoBudget) -> list[DataFile]:
    raise NotImplementedError("compaction is i13-compact's part")


def commit_rewrite(
    table: Table, plan: CompactionPlan, new_files: list[DataFile]
) -> CompactionResult:
    raise NotImplementedError("compaction is i13-compact's part")
