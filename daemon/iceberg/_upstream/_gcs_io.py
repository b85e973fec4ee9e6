"""Overrides ``PyArrowFileIO._initialize_gcs_fs``: pyiceberg's pyarrow FileIO with a GCS
client that gives up retrying.

pyarrow's GCS client retries a failing call for 15 minutes by default (for a store that
refuses connections too) and pyiceberg 0.12 passes it no limit, nor any way to set one:
the client is built in the private ``_initialize_gcs_fs``. This is that method with
``retry_time_limit`` added; the ``gcs.*`` properties are read as pyiceberg 0.12 reads them.

Relies on (checked by ``_contract``): ``PyArrowFileIO._initialize_gcs_fs(self)`` being
where pyiceberg builds its GCS filesystem.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from urllib.parse import urlparse

from pyarrow.fs import FileSystem, GcsFileSystem
from pyiceberg.io import (
    GCS_DEFAULT_LOCATION,
    GCS_SERVICE_HOST,
    GCS_TOKEN,
    GCS_TOKEN_EXPIRES_AT_MS,
)
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.utils.datetime import millis_to_datetime

__all__ = ["GcsBoundedFileIO"]


class GcsBoundedFileIO(PyArrowFileIO):
    """pyiceberg's pyarrow FileIO whose GCS client stops retrying a call after
    ``retry_limit`` seconds (pyarrow's default is 15 minutes, for a store that refuses
    connections too). The ``gcs.*`` properties are read as pyiceberg 0.12 reads them.

    pyiceberg builds ``py-io-impl`` from properties alone, so the limit is a class
    attribute that ``catalog_properties`` sets (process-wide: a daemon has one catalog).
    """

    retry_limit = 60.0  # timeouts.storage_request's default

    def _initialize_gcs_fs(self) -> FileSystem:
        kwargs: dict[str, Any] = {"retry_time_limit": timedelta(seconds=type(self).retry_limit)}
        if access_token := self.properties.get(GCS_TOKEN):
            kwargs["access_token"] = access_token
        if expiration := self.properties.get(GCS_TOKEN_EXPIRES_AT_MS):
            kwargs["credential_token_expiration"] = millis_to_datetime(int(expiration))
        if bucket_location := self.properties.get(GCS_DEFAULT_LOCATION):
            kwargs["default_bucket_location"] = bucket_location
        if endpoint := self.properties.get(GCS_SERVICE_HOST):
            url = urlparse(endpoint)
            kwargs["scheme"] = url.scheme
            kwargs["endpoint_override"] = url.netloc
        return GcsFileSystem(**kwargs)
