"""icespool's own commit requirements: conditions the catalog checks at the swap that
Iceberg has no requirement for (a maintenance lease's property, the refs an expiry
relies on), and which catalogs can honour them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Literal

from pydantic import Field
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import ValidatableTableRequirement

from icespool.errors import CommitError

__all__ = ["AssertProperty", "AssertUnreferenced", "refuse_unchecked", "validates_locally"]


class AssertProperty(ValidatableTableRequirement):
    """Compare-and-swap on one table property: the commit lands only if ``key`` still
    has ``value`` (None: absent) in the metadata it is applied to.

    Iceberg has no such requirement, so only a catalog that validates requirements
    itself, against the metadata it swaps (`validates_locally`), can honour it; a REST
    catalog would send it to a server that does not know it. `refuse_unchecked` refuses
    it elsewhere rather than commit unguarded.
    """

    type: Literal["icespool-assert-property"] = Field(default="icespool-assert-property")
    key: str
    value: str | None = None

    def validate(self, base_metadata: TableMetadata | None) -> None:  # type: ignore[override]
        if base_metadata is None:
            raise CommitFailedException("Requirement failed: current table metadata is missing")
        current = base_metadata.properties.get(self.key)
        if current != self.value:
            raise CommitFailedException(
                f"Requirement failed: property {self.key} is {current!r}, expected {self.value!r}"
            )


class AssertUnreferenced(ValidatableTableRequirement):
    """No branch or tag points at any of ``snapshot_ids`` (an expiry must not remove a
    ref someone created, or a branch rolled back, since it chose what to expire:
    removing a snapshot drops the refs that point at it). Local validation only, as
    `AssertProperty`; elsewhere `commit_expiry` asserts every ref's position instead."""

    type: Literal["icespool-assert-unreferenced"] = Field(default="icespool-assert-unreferenced")
    snapshot_ids: list[int]

    def validate(self, base_metadata: TableMetadata | None) -> None:  # type: ignore[override]
        if base_metadata is None:
            raise CommitFailedException("Requirement failed: current table metadata is missing")
        wanted = set(self.snapshot_ids)
        for name, ref in base_metadata.refs.items():
            if ref.snapshot_id in wanted:
                raise CommitFailedException(
                    f"Requirement failed: ref {name} now points at snapshot {ref.snapshot_id}, "
                    "which this commit would expire"
                )


_LOCAL_REQUIREMENTS: Final = (AssertProperty, AssertUnreferenced)


def validates_locally(catalog: Catalog) -> bool:
    """Whether ``catalog`` checks a commit's requirements itself against the metadata it
    then swaps by compare-and-swap, so `AssertProperty` / `AssertUnreferenced` hold.

    pyiceberg's SqlCatalog does (``_update_and_stage_table`` validates every requirement
    on the metadata it loaded, and the UPDATE swaps metadata_location only if it is still
    that one; `IcespoolSqlCatalog` validates on the base it swaps from), and so does its
    GlueCatalog (the same validation, then UpdateTable conditional on the table's
    VersionId). REST sends requirements to the server, which knows only Iceberg's own.
    """
    if isinstance(catalog, SqlCatalog):
        return True
    try:
        from pyiceberg.catalog.glue import GlueCatalog  # the glue extra (boto3)
    except ImportError:
        return False
    return isinstance(catalog, GlueCatalog)


def refuse_unchecked(
    catalog: Catalog, requirements: Sequence[ValidatableTableRequirement], *, table: str
) -> None:
    """Raise `CommitError` (before anything is sent) when ``requirements`` hold one of
    icespool's own kinds and ``catalog`` cannot check it."""
    if any(isinstance(r, _LOCAL_REQUIREMENTS) for r in requirements) and not validates_locally(
        catalog
    ):
        raise CommitError(
            f"table {table}: catalog type {type(catalog).__name__} cannot check icespool's "
            "commit requirements (a maintenance lease); nothing was committed"
        )
