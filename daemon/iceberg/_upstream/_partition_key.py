"""Seeds ``PartitionKey.partition``: a partition key whose values are already physical.

pyiceberg's ``PartitionKey.partition`` (a ``functools.cached_property``) converts each
field value from its Python form (``datetime``, ``date``...) to the physical one
manifests store, and refuses the physical ints the vectorized transforms already
produce for time columns. The encoder has those ints, so it fills the cache with the
record it built: pyiceberg then never converts them.

Relies on (checked by ``_contract``): ``PartitionKey.partition`` being a
``functools.cached_property`` (stored in the instance ``__dict__`` under its name).
"""

from __future__ import annotations

from typing import Any

from pyiceberg.partitioning import PartitionFieldValue, PartitionKey, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.typedef import Record

__all__ = ["physical_partition_key"]


def physical_partition_key(
    spec: PartitionSpec, schema: Schema, values: list[Any], record: Record
) -> PartitionKey:
    """The ``PartitionKey`` of ``values`` (physical, one per field of ``spec``) whose
    ``partition`` is ``record`` as given."""
    key = PartitionKey(
        field_values=[
            PartitionFieldValue(field=field, value=value)
            for field, value in zip(spec.fields, values, strict=True)
        ],
        partition_spec=spec,
        schema=schema,
    )
    key.__dict__["partition"] = record
    return key
