"""The one interface every source decodes through: a `Decoder` per wire format, chosen
by `decoder_for` from the format.

    Kafka  format "json"   `JsonValues`     each value one JSON object
           format "raw"    `RawValues`      key, value and headers as they are
           format "avro"   `AvroValues`     Confluent wire format or one .avsc schema
           format "protobuf"     `ProtobufValues`    Confluent wire format, registry
           format "json-schema"  `JsonSchemaValues`  Confluent wire format, registry
           changes         `KeyedChanges`   Debezium envelopes or keyed rows (JSON or
                                            Avro) -> one change batch per table
    HTTP   NDJSON          `NdjsonBody`     all or nothing; with changes: the table's
           JSON array      `JsonArrayBody`  columns plus "_op" per row
           Arrow IPC       `ArrowBody`

A decoder turns `Records` (binary values, plus keys and headers where the format
needs them) into rows in the `Target` table's schema (`Decoded`). Kafka's decoders
are lenient: each record that fails is a `DeadRecord` with its reason, the others
go on. HTTP's are all or nothing: a body is one record, decoded whole or refused.
Either way the table may be evolved for what failed (`Decoder.evolve_request`) and
the records decoded again (`icespool.write.ingest`).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Final, Protocol

import pyarrow as pa

from icespool.decode._body import ARROW_STREAM, JSON, NDJSON, ArrowBody, JsonArrayBody, NdjsonBody
from icespool.decode._decoded import Decoded, EvolveRequest
from icespool.decode._json_values import JsonValues
from icespool.decode._keyed import KeyedChanges
from icespool.decode._raw import RawValues
from icespool.decode._records import Records, Target
from icespool.errors import BadInputError

if TYPE_CHECKING:
    from icespool.config import KafkaConfig

__all__ = ["Decoder", "decoder_for"]

_BODIES: Final[dict[str, type[NdjsonBody | JsonArrayBody | ArrowBody]]] = {
    NDJSON: NdjsonBody,
    JSON: JsonArrayBody,
    ARROW_STREAM: ArrowBody,
}


class Decoder(Protocol):
    """One wire format's decoder. ``decode`` and ``incoming`` block: callers run them
    off the event loop."""

    def decode(self, records: Records, target: Target) -> Decoded:
        """``records`` in ``target``'s schema. Lenient decoders list the records that
        fail in `Decoded.dead`; all-or-nothing ones return a column failure in
        `Decoded.error` and raise every other (`BadInputError` naming where)."""

    def evolve_request(
        self, records: Records, decoded: Decoded, target: Target
    ) -> EvolveRequest | None:
        """What ``target``'s schema would need for the records ``decoded`` (their
        decode into it) failed on; None: no schema change would help. Cheap (asked on
        the event loop): reading the records again belongs in the request's
        ``incoming``, which runs in a thread."""

    def incoming(self, records: Records, target: Target) -> pa.Schema:
        """The records' own Arrow schema: what a table created for them gets."""

    def rephrase(self, error: BadInputError) -> BadInputError:
        """``error``, raised for these records, as this format names where it is (a
        JSON array's index rather than a line)."""


def decoder_for(
    format: str, *, changes: str = "none", source: KafkaConfig | None = None
) -> Decoder:
    """The decoder of ``format``: an HTTP Content-Type (``changes = "keyed"``: a change
    body), or a Kafka source's ``format`` ("json", "raw", "avro", "protobuf",
    "json-schema") with its ``changes``
    ("none", "keyed", "debezium"), key format, metadata columns, record size bound and
    Avro schemas from ``source`` (its ``[[kafka]]`` section)."""
    if format in _BODIES:
        return _BODIES[format](changes=changes != "none")
    if source is None:
        raise ValueError(f"unknown body format {format!r}")
    columns, max_bytes = source.metadata_columns, source.max_record_bytes
    avro = None
    if format == "avro":
        from icespool.decode._avro_registry import avro_schemas  # fastavro: only for avro

        # Made at the first decode (and again while that fails), then kept with its
        # registry cache for as long as the source runs.
        avro = functools.cache(functools.partial(avro_schemas, source))
    if changes in ("keyed", "debezium"):
        return KeyedChanges(
            "debezium" if changes == "debezium" else "keyed",
            avro=avro,
            key_format=source.key_format,
            source_columns=columns,
            max_record_bytes=max_bytes,
        )
    if avro is not None:
        from icespool.decode._avro import AvroValues  # fastavro: only for format avro

        return AvroValues(avro, source_columns=columns, max_record_bytes=max_bytes)
    if format == "protobuf":
        from icespool.decode._protobuf import ProtobufValues  # protobuf: only for this format
        from icespool.decode._registry_sources import registry_schemas

        return ProtobufValues(
            functools.cache(functools.partial(registry_schemas, source, format)),
            source_columns=columns,
            max_record_bytes=max_bytes,
        )
    if format == "json-schema":
        from icespool.decode._json_schema_values import JsonSchemaValues
        from icespool.decode._registry_sources import registry_schemas

        return JsonSchemaValues(
            functools.cache(functools.partial(registry_schemas, source, format)),
            source_columns=columns,
            max_record_bytes=max_bytes,
        )
    if format == "raw":
        return RawValues(source_columns=columns, max_record_bytes=max_bytes)
    if format == "json":
        return JsonValues(source_columns=columns, max_record_bytes=max_bytes)
    raise ValueError(f"unknown value format {format!r}")
