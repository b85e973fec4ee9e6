"""Schema evolution: which changes incoming data asks of a table.

Per table policy (``evolve`` in ``[[tables]]``):

- ``none``: the table's schema is fixed; records that do not fit are refused
  (HTTP 400) or dead-lettered (Kafka).
- ``add-columns``: a field in the input that the table lacks (nested struct
  fields too) becomes a new optional column, committed before the data.
- ``add-and-widen``: also Iceberg's legal promotions: int -> long, float ->
  double, decimal(P,S) -> decimal(P',S) with P' > P.

Anything else (a type change that is not a promotion, a required field missing)
is refused with `SchemaChangeError`, which names the column and the policy.

Whatever the policy, a table grows to at most ``max_columns`` columns (nested
fields, list elements and map keys and values counted, as Iceberg gives each one a
field id): a change past it is refused whole with `SchemaChangeError`, since every
commit writes the whole schema into the table's metadata.

Planning is pure (an existing Iceberg schema and the Arrow schema of the input);
``icespool.iceberg.commit_evolution`` plans on the refreshed table and commits the
plan, again after a conflict.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BooleanType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
)

from icespool.errors import SchemaError
from icespool.schema._grammar import render_type, type_columns
from icespool.schema._infer import infer_schema

__all__ = [
    "EvolutionPlan",
    "Policy",
    "SchemaChangeError",
    "check_width",
    "plan_evolution",
]

Policy = Literal["none", "add-columns", "add-and-widen"]


class SchemaChangeError(SchemaError):
    """The input needs a schema change the table's policy does not allow."""


@dataclass(frozen=True, slots=True)
class EvolutionPlan:
    """Changes to make: new optional fields and type promotions (dotted paths)."""

    adds: tuple[tuple[tuple[str, ...], IcebergType], ...] = ()
    widens: tuple[tuple[tuple[str, ...], IcebergType], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.adds or self.widens)

    def describe(self) -> str:
        parts = [f"add {'.'.join(p)} {render_type(t)}" for p, t in self.adds]
        parts += [f"widen {'.'.join(p)} to {render_type(t)}" for p, t in self.widens]
        return ", ".join(parts)

    @property
    def added_columns(self) -> int:
        """Columns the plan adds, nested ones counted (widening adds none)."""
        return sum(type_columns(t) for _, t in self.adds)


def check_width(table: str, columns: int, max_columns: int, first: str) -> None:
    """Refuse a table of ``columns`` columns past ``max_columns`` (`SchemaChangeError`
    naming ``first``, the first column the change brings, or ``?``)."""
    if columns > max_columns:
        raise SchemaChangeError(
            first,
            f"table {table} would have {columns} columns (nested fields counted), more "
            f"than its max_columns = {max_columns}; raise max_columns for the table or "
            "send fewer distinct fields",
        )


def _promotion(current: IcebergType, wanted: IcebergType) -> IcebergType | None:
    """The promoted type when ``current`` may legally become ``wanted`` (or wider)."""
    if isinstance(current, IntegerType) and isinstance(wanted, LongType):
        return LongType()
    if isinstance(current, FloatType) and isinstance(wanted, DoubleType):
        return DoubleType()
    if (
        isinstance(current, DecimalType)
        and isinstance(wanted, DecimalType)
        and wanted.scale == current.scale
        and wanted.precision > current.precision
    ):
        return DecimalType(wanted.precision, current.scale)
    return None


def _fits(incoming: IcebergType, current: IcebergType, *, exact: bool) -> bool:
    """Values of ``incoming`` can be written to a ``current`` column as they are."""
    if incoming == current or _promotion(incoming, current) is not None:
        return True
    if exact:
        return False
    # Inferred from JSON: numbers are long/double and text is string; the decoder
    # converts those to the column's exact type (text to dates, decimals, uuids...).
    if isinstance(current, StructType | ListType | MapType):
        return False
    numeric = (IntegerType, LongType, FloatType, DoubleType, DecimalType)
    if isinstance(incoming, StringType):
        return not isinstance(current, (*numeric, BooleanType)) or isinstance(current, DecimalType)
    if isinstance(incoming, LongType | DoubleType):
        return isinstance(current, (*numeric, TimestampType, TimestamptzType))
    return False


def plan_evolution(
    existing: Schema,
    incoming: pa.Schema,
    policy: Policy,
    *,
    only: Collection[str] | None = None,
    exact: bool = True,
) -> EvolutionPlan:
    """The changes ``existing`` needs to take data shaped like ``incoming``.

    ``only`` restricts planning to those top-level columns (the ones a decoder
    reported). ``exact``: the incoming types are the data's real types (Arrow
    input); with inferred JSON types, a mismatch that the decoder can convert is
    not a change. Raises `SchemaChangeError` naming the column when the policy
    forbids what the data needs.
    """
    try:
        inferred = infer_schema(incoming)
    except SchemaError as exc:
        raise SchemaChangeError(exc.column, exc.problem) from None
    adds: list[tuple[tuple[str, ...], IcebergType]] = []
    widens: list[tuple[tuple[str, ...], IcebergType]] = []
    by_name = {f.name: f for f in existing.fields}
    for field in inferred.fields:
        if only is not None and field.name not in only:
            continue
        _plan_field((field.name,), field, by_name.get(field.name), policy, exact, adds, widens)
    return EvolutionPlan(tuple(adds), tuple(widens))


def _plan_field(
    path: tuple[str, ...],
    incoming: NestedField,
    current: NestedField | None,
    policy: Policy,
    exact: bool,
    adds: list[tuple[tuple[str, ...], IcebergType]],
    widens: list[tuple[tuple[str, ...], IcebergType]],
) -> None:
    name = ".".join(path)
    if current is None:
        if policy == "none":
            raise SchemaChangeError(
                name, 'not in the table schema (evolve = "none"; set evolve = "add-columns")'
            )
        adds.append((path, incoming.field_type))
        return
    wanted, have = incoming.field_type, current.field_type
    if isinstance(wanted, StructType) and isinstance(have, StructType):
        children = {f.name: f for f in have.fields}
        for child in wanted.fields:
            _plan_field(
                (*path, child.name), child, children.get(child.name), policy, exact, adds, widens
            )
        return
    if wanted == have:
        return
    promoted = _promotion(have, wanted)
    if promoted is not None:
        if policy != "add-and-widen":
            raise SchemaChangeError(
                name,
                f"values need {render_type(wanted)} but the column is {render_type(have)} "
                f'(evolve = "{policy}"; "add-and-widen" allows this promotion)',
            )
        widens.append((path, promoted))
        return
    if not _fits(wanted, have, exact=exact):
        raise SchemaChangeError(
            name,
            f"values are {render_type(wanted)} but the column is {render_type(have)}, "
            "which is not a legal Iceberg promotion",
        )
