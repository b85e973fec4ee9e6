"""The Hive Metastore catalog: a timeout on every Thrift call, one connection per call.

pyiceberg's HiveCatalog (pinned <0.13) talks to the metastore through one ``_HiveClient``
per catalog, which has two problems for the daemon:

- Its Thrift socket has no timeout: a metastore that accepts the connection and then
  never answers (a stalled JVM, a half-open TCP path) holds the calling thread forever.
- It is not safe across threads: each ``with client`` replaces the shared transport and
  closes it on the way out, so two threads' calls (two tables committing at once, a
  maintenance run beside a commit) close each other's connections mid-call.

``BoundedHiveCatalog`` gives the catalog a client whose every ``with`` opens a
connection of its own (what pyiceberg does from the second call on anyway), kept per
thread, with ``timeouts.catalog_connect`` to connect and ``timeouts.catalog_request`` for
every read and write on it after. Its ``restore_first_metadata`` writes back the first
metadata file of a table that the metastore deleted in a create race (see there).

Relies on (``_contract.HIVE_PINS``, checked when this module is imported, which only a Hive
catalog does: it needs thrift): ``_HiveClient.__init__(uri, ugi, kerberos_auth,
kerberos_service_name)`` and the attributes it sets, ``_init_thrift_transport``, and
``HiveCatalog.__init__`` building its client through ``_create_hive_client``.
"""

from __future__ import annotations

import posixpath
import threading
from types import TracebackType
from urllib.parse import urlparse

from hive_metastore.ThriftHiveMetastore import Client
from hive_metastore.ttypes import NoSuchObjectException
from pyiceberg.catalog import METADATA_LOCATION, URI
from pyiceberg.catalog.hive import (
    DEFAULT_PROPERTIES,
    HIVE_KERBEROS_AUTH,
    HIVE_KERBEROS_AUTH_DEFAULT,
    HIVE_KERBEROS_SERVICE_NAME,
    HIVE_KERBEROS_SERVICE_NAME_DEFAULT,
    HiveCatalog,
    _HiveClient,
)
from pyiceberg.io import load_file_io
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import TableProperties
from pyiceberg.table.metadata import new_table_metadata
from pyiceberg.table.sorting import SortOrder
from pyiceberg.utils.properties import property_as_bool
from thrift.protocol import TBinaryProtocol
from thrift.transport import TSocket, TTransport

from icespool.config import TimeoutsConfig
from icespool.iceberg._upstream._contract import HIVE_PINS, check_contract
from icespool.iceberg._upstream._v3_metadata import write_metadata

__all__ = ["BoundedHiveCatalog"]

check_contract(HIVE_PINS)


class _BoundedSocket(TSocket.TSocket):  # type: ignore[misc]
    """A Thrift socket that connects within ``connect`` seconds, then gives every read and
    write ``request`` seconds."""

    def __init__(self, host: str | None, port: int | None, connect: float, request: float):
        super().__init__(host, port)
        self._limits = (connect, request)

    def open(self) -> None:
        connect, request = self._limits
        self.setTimeout(connect * 1000)
        super().open()
        self.setTimeout(request * 1000)


class _BoundedHiveClient(_HiveClient):
    """``_HiveClient`` whose ``with`` opens a bounded connection of the calling thread's
    own and closes it on the way out."""

    def __init__(
        self,
        uri: str,
        limits: tuple[float, float],
        ugi: str | None,
        kerberos_auth: bool,
        kerberos_service_name: str,
    ) -> None:
        self._limits = limits
        self._opened = threading.local()
        super().__init__(uri, ugi, kerberos_auth, kerberos_service_name)

    def _init_thrift_transport(self) -> TTransport.TTransportBase:
        parts = urlparse(self._uri)
        sock = _BoundedSocket(parts.hostname, parts.port, *self._limits)
        if not self._kerberos_auth:
            return TTransport.TBufferedTransport(sock)
        return TTransport.TSaslClientTransport(
            sock, host=parts.hostname, service=self._kerberos_service_name
        )

    def __enter__(self) -> Client:
        transport = self._init_thrift_transport()
        transport.open()
        self._opened.transport = transport
        client = Client(TBinaryProtocol.TBinaryProtocol(transport))
        if self._ugi:
            client.set_ugi(*self._ugi)
        return client

    def __exit__(
        self,
        exctype: type[BaseException] | None,
        excinst: BaseException | None,
        exctb: TracebackType | None,
    ) -> None:
        transport = self._opened.__dict__.pop("transport", None)
        if transport is not None and transport.isOpen():
            transport.close()


class BoundedHiveCatalog(HiveCatalog):
    """pyiceberg's HiveCatalog whose every metastore call is bounded by ``timeouts`` and
    runs on a connection of the calling thread's own, and that writes v3 metadata
    (``_v3_metadata``)."""

    _write_metadata = staticmethod(write_metadata)

    def __init__(self, name: str, timeouts: TimeoutsConfig, **properties: str) -> None:
        # Read by _create_hive_client, which HiveCatalog.__init__ calls.
        self._icespool_limits = (timeouts.catalog_connect, timeouts.catalog_request)
        super().__init__(name, **properties)

    def _create_hive_client(self, properties: dict[str, str]) -> _HiveClient:  # type: ignore[override]
        # pyiceberg tries each of a comma-separated list of URIs until one constructs,
        # which never connects: the first one is what it uses. So is it here.
        uri = properties[URI].split(",")[0]
        return _BoundedHiveClient(
            uri,
            self._icespool_limits,
            properties.get("ugi"),
            property_as_bool(properties, HIVE_KERBEROS_AUTH, HIVE_KERBEROS_AUTH_DEFAULT),
            properties.get(HIVE_KERBEROS_SERVICE_NAME, HIVE_KERBEROS_SERVICE_NAME_DEFAULT),
        )

    def restore_first_metadata(
        self,
        identifier: tuple[str, ...],
        schema: Schema,
        spec: PartitionSpec,
        sort_order: SortOrder,
        properties: dict[str, str],
    ) -> tuple[str, bool] | None:
        """Write back the first metadata file of ``identifier`` when the metastore lists it
        as the table's current one and it is missing. Returns (its location, whether this
        call wrote it) while the table is at that file, which is then in place; None when
        it is not (no such table, a later metadata file).

        The metastore's create_database, when it loses a race with another client's after
        making the database's directory, deletes that directory recursively as it rolls
        back: with the first metadata file of a table created in it meanwhile. The table is
        then listed with a file nobody can read, for good. Only a table at its first
        metadata file (``00000-``) created from this very declaration (the metastore's
        table parameters hold each of its ``properties``, which name the daemon as the
        creator: this daemon or a replica created it) is written back: such a first file
        never holds a snapshot, so new metadata from the declaration at the same location
        is that table as created. A table that had a commit, or that another writer
        created (a first file may hold a snapshot, as a CREATE TABLE AS SELECT writes), is
        never touched."""
        database, name = self.identifier_to_database_and_table(identifier)
        try:
            with self._client as client:
                hive_table = client.get_table(dbname=database, tbl_name=name)
        except NoSuchObjectException:
            return None
        parameters = hive_table.parameters or {}
        location = str(parameters.get(METADATA_LOCATION) or "")
        if not location or not posixpath.basename(location).startswith("00000-"):
            return None
        table_properties = {**DEFAULT_PROPERTIES, **properties}
        if any(
            parameters.get(key) != value
            for key, value in table_properties.items()
            if key != TableProperties.FORMAT_VERSION  # metadata's field, not a property
        ):
            return None
        io = load_file_io({**self.properties, **table_properties}, location)
        if io.new_input(location).exists():
            return location, False
        metadata = new_table_metadata(
            schema, spec, sort_order, hive_table.sd.location, table_properties
        )
        try:
            write_metadata(metadata, io, location)
        except FileExistsError:
            return location, False  # another replica restored it meanwhile
        return location, True
