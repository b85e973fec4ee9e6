"""Where each row a compaction writes came from, and the rewrite's result carrying it.

Compaction reads its inputs as of its plan and commits later, in the table's lane. An
upsert table fed every second gets position deletes naming those inputs in between
(each commit of its writer merges them into one delete file per data file). Dropping
them with the inputs would bring their rows back in the new files; refusing the
compaction would starve it. With the lineage, the commit moves them instead: each row
the new deletes name is found in the output it was copied to, and the output gets a
position delete for it in the same snapshot.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import overload

import numpy as np
from pyiceberg.manifest import DataFile

__all__ = ["Lineage", "Rewritten"]


@dataclass(frozen=True)
class Lineage:
    """For each output file of a rewrite, the input (its path) and position each of
    its rows was copied from, in output order."""

    inputs: tuple[str, ...] = ()
    rows: Mapping[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def remap(self, dead: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Positions, in the outputs, of the input rows ``dead`` names (input path ->
        positions); outputs none of them reached are left out."""
        index = {path: number for number, path in enumerate(self.inputs)}
        wanted = {index[path]: positions for path, positions in dead.items() if path in index}
        found: dict[str, np.ndarray] = {}
        for output, (sources, positions) in self.rows.items():
            hit = np.zeros(len(sources), dtype=bool)
            for source, gone in wanted.items():
                hit |= (sources == source) & np.isin(positions, gone)
            if hit.any():
                found[output] = np.flatnonzero(hit).astype(np.int64)
        return found


@dataclass(frozen=True)
class Rewritten(Sequence[DataFile]):
    """The files a rewrite wrote (a sequence of them), with their `Lineage`."""

    files: tuple[DataFile, ...]
    lineage: Lineage = field(default_factory=Lineage)

    @overload
    def __getitem__(self, index: int) -> DataFile: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[DataFile]: ...
    def __getitem__(self, index: int | slice) -> DataFile | Sequence[DataFile]:
        return self.files[index]

    def __len__(self) -> int:
        return len(self.files)

    def __iter__(self) -> Iterator[DataFile]:
        return iter(self.files)
