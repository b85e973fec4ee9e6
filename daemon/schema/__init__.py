"""Schemas: the column-type grammar, declarations -> Iceberg, Arrow conformance,
inference, differences and evolution.

A leaf of the daemon: it imports nothing of config, decode, Kafka or the writer, so
config validates types and partitions with the same code that builds the tables.

    _grammar     type, partition and sort grammar of the config (strings -> terms)
    _declare     declared columns / partition_by / sort_by -> pyiceberg objects
    _arrow       the Arrow schema of a table; conform and cast batches to it
    _ranges      values Iceberg readers can hold (dates, times, decimals)
    _infer       an Iceberg schema from a first batch; declared vs existing diff
    _evolution   which schema change incoming data asks for (iceberg commits it)
    _key         which columns Iceberg allows as a key; the change batches' op column
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from icespool._lazy import lazy_exports

if TYPE_CHECKING:
    from icespool.schema._arrow import (
        FIELD_ID_KEY,
        arrow_schema_for,
        cast_array,
        check_required_children,
        conform,
        fill_masked_children,
    )
    from icespool.schema._declare import (
        parse_partition_spec,
        parse_schema,
        parse_sort_order,
        parse_type,
    )
    from icespool.schema._evolution import (
        EvolutionPlan,
        Policy,
        SchemaChangeError,
        check_width,
        plan_evolution,
    )
    from icespool.schema._grammar import (
        PRIMITIVE_TYPES,
        TYPE_HELP,
        PartitionTerm,
        count_columns,
        parse_partition,
        parse_sort,
        parse_type_string,
        render_type,
        transform_accepts,
        type_columns,
    )
    from icespool.schema._infer import (
        MAX_INFERRED_FIELDS,
        SchemaDifference,
        infer_schema,
        schema_diff,
    )
    from icespool.schema._key import OP_COLUMN, key_type_problem
    from icespool.schema._ranges import (
        HUGE_EXPONENT,
        OutOfRange,
        find_out_of_range,
        has_huge_exponent,
        temporal_bounds,
    )

__all__ = [
    "FIELD_ID_KEY",
    "HUGE_EXPONENT",
    "MAX_INFERRED_FIELDS",
    "OP_COLUMN",
    "PRIMITIVE_TYPES",
    "TYPE_HELP",
    "EvolutionPlan",
    "OutOfRange",
    "PartitionTerm",
    "Policy",
    "SchemaChangeError",
    "SchemaDifference",
    "arrow_schema_for",
    "cast_array",
    "check_required_children",
    "check_width",
    "conform",
    "count_columns",
    "fill_masked_children",
    "find_out_of_range",
    "has_huge_exponent",
    "infer_schema",
    "key_type_problem",
    "parse_partition",
    "parse_partition_spec",
    "parse_schema",
    "parse_sort",
    "parse_sort_order",
    "parse_type",
    "parse_type_string",
    "plan_evolution",
    "render_type",
    "schema_diff",
    "temporal_bounds",
    "transform_accepts",
    "type_columns",
]

# Imported when first used: see icespool._lazy.
__getattr__ = lazy_exports(
    __name__,
    {
        "icespool.schema._arrow": (
            "FIELD_ID_KEY",
            "arrow_schema_for",
            "cast_array",
            "check_required_children",
            "conform",
            "fill_masked_children",
        ),
        "icespool.schema._key": ("OP_COLUMN", "key_type_problem"),
        "icespool.schema._declare": (
            "parse_partition_spec",
            "parse_schema",
            "parse_sort_order",
            "parse_type",
        ),
        "icespool.schema._evolution": (
            "EvolutionPlan",
            "Policy",
            "SchemaChangeError",
            "check_width",
            "plan_evolution",
        ),
        "icespool.schema._grammar": (
            "PRIMITIVE_TYPES",
            "TYPE_HELP",
            "PartitionTerm",
            "count_columns",
            "parse_partition",
            "parse_sort",
            "parse_type_string",
            "render_type",
            "transform_accepts",
            "type_columns",
        ),
        "icespool.schema._infer": (
            "MAX_INFERRED_FIELDS",
            "SchemaDifference",
            "infer_schema",
            "schema_diff",
        ),
        "icespool.schema._ranges": (
            "HUGE_EXPONENT",
            "OutOfRange",
            "find_out_of_range",
            "has_huge_exponent",
            "temporal_bounds",
        ),
    },
)
