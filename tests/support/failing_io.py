"""A FileIO whose deletes fail while the test says so: maintenance that keeps failing
(an object store that refuses deletes) on an otherwise healthy table.

Configure it as the catalog's ``py-io-impl = "support.failing_io.RefusingDeletes"``;
``RefusingDeletes.refusing`` is the test's switch (process-wide: in-process daemons only).
"""

from __future__ import annotations

import threading

from pyiceberg.io import InputFile, OutputFile
from pyiceberg.io.pyarrow import PyArrowFileIO

__all__ = ["RefusingDeletes"]


class RefusingDeletes(PyArrowFileIO):
    """PyArrowFileIO whose ``delete`` raises PermissionError while ``refusing`` is set."""

    refusing = threading.Event()
    refused = 0

    def delete(self, location: str | InputFile | OutputFile) -> None:
        if RefusingDeletes.refusing.is_set():
            RefusingDeletes.refused += 1
            raise PermissionError(f"test: deletes are refused ({location})")
        super().delete(location)
