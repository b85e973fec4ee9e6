"""FileIOs misbehaving while the test says so: deletes that fail (maintenance that keeps
failing on an otherwise healthy table), data files slow to open (an object store's latency).

Configure it as the catalog's ``py-io-impl = "support.failing_io.RefusingDeletes"``;
``RefusingDeletes.refusing`` is the test's switch (process-wide: in-process daemons only).
"""

from __future__ import annotations

import threading
import time

from pyiceberg.io import InputFile, OutputFile
from pyiceberg.io.pyarrow import PyArrowFileIO

__all__ = ["RefusingDeletes", "SlowDataReads"]


class RefusingDeletes(PyArrowFileIO):
    """PyArrowFileIO whose ``delete`` raises PermissionError while ``refusing`` is set."""

    refusing = threading.Event()
    refused = 0

    def delete(self, location: str | InputFile | OutputFile) -> None:
        if RefusingDeletes.refusing.is_set():
            RefusingDeletes.refused += 1
            raise PermissionError(f"test: deletes are refused ({location})")
        super().delete(location)


class SlowDataReads(PyArrowFileIO):
    """PyArrowFileIO whose opening of a data file (``.parquet``) takes ``delay``
    seconds: an object store's per-request latency, which many small files multiply.
    ``SlowDataReads.delay`` is the test's switch (process-wide: in-process daemons only)."""

    delay = 0.0

    def new_input(self, location: str) -> InputFile:
        if SlowDataReads.delay and location.endswith(".parquet"):
            time.sleep(SlowDataReads.delay)
        return super().new_input(location)
