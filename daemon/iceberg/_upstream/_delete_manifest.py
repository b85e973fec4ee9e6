"""Overrides ``ManifestWriterV2._meta`` and ``ManifestWriter._with_partition``: a manifest
of delete files, which pyiceberg 0.12 cannot write (v2 here; v3: ``_v3_manifests``).

Relies on (checked by ``_contract``): ``ManifestWriterV2``'s constructor ``(spec, schema,
output_file, snapshot_id, avro_compression)``, its ``_meta`` property and
``_with_partition(format_version)`` (the manifest's Avro schema, ``data_file`` as
field 2 with ``equality_ids`` as field 135).
"""

from __future__ import annotations

from typing import Final

from pyiceberg.manifest import (
    ManifestContent,
    ManifestWriterV2,
)
from pyiceberg.schema import Schema
from pyiceberg.typedef import TableVersion
from pyiceberg.types import IntegerType, ListType, NestedField, StructType

__all__ = ["DeleteContent", "DeleteManifestWriter"]


class DeleteContent:
    """What makes a manifest writer's manifest one of delete files (pyiceberg 0.12
    writes data manifests only): its content, its ``content`` metadata, and
    ``equality_ids`` declared as the spec declares them.

    pyiceberg 0.12 declares ``equality_ids`` (field 135) as ``list<long>``; the spec
    (and Java, which casts the values to Integer) says ``list<int>``: Spark fails
    with a ClassCastException on such a manifest. Avro writes int and long alike
    (zig-zag varints), so only the declared type changes.
    """

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        meta: dict[str, str] = super()._meta  # type: ignore[misc]
        return {**meta, "content": "deletes"}

    def _with_partition(self, format_version: TableVersion) -> Schema:
        schema: Schema = super()._with_partition(format_version)  # type: ignore[misc]
        return Schema(
            *[
                NestedField(2, "data_file", _int_equality_ids(field.field_type), required=True)
                if field.field_id == 2 and isinstance(field.field_type, StructType)
                else field
                for field in schema.fields
            ]
        )


class DeleteManifestWriter(DeleteContent, ManifestWriterV2):
    """A v2 manifest of delete files."""


def _int_equality_ids(data_file: StructType) -> StructType:
    return StructType(
        *[
            NestedField(
                field.field_id,
                field.name,
                ListType(element_id=136, element_type=IntegerType(), element_required=True),
                required=False,
                doc=field.doc,
            )
            if field.field_id == _EQUALITY_IDS_FIELD
            else field
            for field in data_file.fields
        ]
    )


_EQUALITY_IDS_FIELD: Final = 135
