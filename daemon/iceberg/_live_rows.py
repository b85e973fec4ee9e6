"""Where live rows are: a live data file with what delete files naming it take (its
sequence number, spec and first row id), and the positions of some rows in such files.

The key index (``icespool.cdc``) finds them; the delete file writers here take them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from pyiceberg.manifest import DataFile

__all__ = ["LiveData", "Located"]


@dataclass(frozen=True)
class LiveData:
    """A live data file, its data sequence number and spec, and (format v3) the
    ``_row_id`` of its first row (None: the table tracks no row lineage)."""

    file: DataFile
    sequence_number: int
    spec_id: int
    first_row_id: int | None = None


@dataclass(frozen=True, slots=True)
class Located:
    """Where the live rows of some keys are, at the index's snapshot: the positions
    (sorted) in each data file, and those files (their partition and spec, which the
    delete files naming them take)."""

    positions: Mapping[str, np.ndarray]
    files: Mapping[str, LiveData]

    @property
    def rows(self) -> int:
        return sum(len(p) for p in self.positions.values())
