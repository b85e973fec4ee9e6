"""The Arrow schema a table's batches are cast to, and conforming batches to it.

Every batch is cast to the table's Arrow schema before it is spooled, with
vectorized casts only (no per-row Python on the hot path).
"""

from __future__ import annotations

from typing import Final

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema

from icespool.errors import SchemaError
from icespool.schema._ranges import find_out_of_range, has_huge_exponent

__all__ = [
    "FIELD_ID_KEY",
    "arrow_schema_for",
    "cast_array",
    "check_required_children",
    "conform",
    "fill_masked_children",
]

#: Arrow field-metadata key that carries the Iceberg field id (what the Parquet writer stores).
FIELD_ID_KEY: Final = b"PARQUET:field_id"


def _plain_offsets(data_type: pa.DataType) -> pa.DataType:
    """Replace large (64-bit offset) string/binary/list types by their plain forms, recursively.

    pyiceberg maps string/binary to the large variants, but its writer accepts the plain
    ones, and batches bounded by max_batch_bytes never need 64-bit offsets; plain types
    halve offset memory and are what JSON/IPC decoders produce, so casts become no-ops.
    """
    if pa.types.is_large_string(data_type):
        return pa.string()
    if pa.types.is_large_binary(data_type):
        return pa.binary()
    if pa.types.is_large_list(data_type) or pa.types.is_list(data_type):
        return pa.list_(_plain_field(data_type.value_field))
    if pa.types.is_map(data_type):
        return pa.map_(_plain_field(data_type.key_field), _plain_field(data_type.item_field))
    if pa.types.is_struct(data_type):
        return pa.struct([_plain_field(data_type.field(i)) for i in range(data_type.num_fields)])
    return data_type


def _plain_field(field: pa.Field) -> pa.Field:
    return field.with_type(_plain_offsets(field.type))


def arrow_schema_for(table: Schema | object) -> pa.Schema:
    """Return the Arrow schema batches for ``table`` are cast to before spooling.

    ``table`` is a pyiceberg ``Schema`` or anything with a ``schema()`` method returning
    one (a pyiceberg ``Table``). Fields carry their Iceberg field id in the
    ``PARQUET:field_id`` metadata and required columns are non-nullable.
    """
    schema = table if isinstance(table, Schema) else _schema_of(table)
    arrow = schema_to_pyarrow(schema, include_field_ids=True)
    return pa.schema([_plain_field(field) for field in arrow], metadata=arrow.metadata)


def _schema_of(table: object) -> Schema:
    getter = getattr(table, "schema", None)
    schema = getter() if callable(getter) else None
    if not isinstance(schema, Schema):
        raise TypeError(f"expected a pyiceberg Schema or Table, got {type(table).__name__}")
    return schema


def _field_id(field: pa.Field) -> bytes | None:
    metadata = field.metadata
    return metadata.get(FIELD_ID_KEY) if metadata else None


def _align_field_ids(values: pa.Array, source: pa.DataType, target: pa.DataType) -> pa.Array:
    """``values`` (of type ``source`` as the batch's schema declares it: the ids of
    the array's own type may be stale, a batch restamped by ``conform`` keeps them)
    with its nested fields matched to ``target``'s by Iceberg field id where both
    sides carry ids: a struct field renamed since takes its new name, one dropped from
    the table since is left out (as ``drop_extra`` leaves out a dropped column); types
    are left to the cast. ``values`` itself when nothing differs. Fields without ids
    on either side stay as they are (matched by name, as before)."""
    if pa.types.is_struct(target) and pa.types.is_struct(source):
        wanted = {fid: f for f in target.fields if (fid := _field_id(f)) is not None}
        if not wanted:
            return values
        children: list[pa.Array] = []
        fields: list[pa.Field] = []
        changed = False
        for index, field in enumerate(source.fields):
            field_id = _field_id(field)
            match = wanted.get(field_id) if field_id is not None else None
            if field_id is not None and match is None:
                changed = True  # dropped from the table since these values were written
                continue
            child = values.field(index)
            if match is not None:
                aligned = _align_field_ids(child, field.type, match.type)
                changed = changed or aligned is not child or match.name != field.name
                child, field = aligned, pa.field(match.name, aligned.type, field.nullable)
            children.append(child)
            fields.append(field.with_type(child.type))
        if not changed:
            return values
        if not fields:  # every field dropped: an empty struct with the same validity
            return pa.Array.from_buffers(
                pa.struct([]), len(values), [values.buffers()[0]], offset=values.offset
            )
        return pa.StructArray.from_arrays(children, fields=fields, mask=_null_mask(values))
    if pa.types.is_map(target) and pa.types.is_map(source):
        offsets, entries = _list_parts(values)
        key_values, item_values = entries.field(0), entries.field(1)
        keys = _align_field_ids(key_values, source.key_type, target.key_type)
        items = _align_field_ids(item_values, source.item_type, target.item_type)
        if keys is key_values and items is item_values:
            return values
        key_field, item_field = source.key_field, source.item_field
        map_type = pa.map_(key_field.with_type(keys.type), item_field.with_type(items.type))
        return pa.MapArray.from_arrays(offsets, keys, items, type=map_type, mask=_null_mask(values))
    is_list = pa.types.is_list(source) or pa.types.is_large_list(source)
    if pa.types.is_list(target) and is_list:
        offsets, elements = _list_parts(values)
        aligned = _align_field_ids(elements, source.value_type, target.value_type)
        if aligned is elements:
            return values
        element_field = source.value_field.with_type(aligned.type)
        if pa.types.is_large_list(source):
            return pa.LargeListArray.from_arrays(
                offsets, aligned, type=pa.large_list(element_field), mask=_null_mask(values)
            )
        return pa.ListArray.from_arrays(
            offsets, aligned, type=pa.list_(element_field), mask=_null_mask(values)
        )
    return values


def _renamed_or_dropped(source: pa.DataType, target: pa.DataType) -> bool:
    """Whether a nested field of ``source`` has another name or no place in ``target``
    by field id (types only: decides if ``_align_field_ids`` has anything to do)."""
    if pa.types.is_struct(target) and pa.types.is_struct(source):
        wanted = {fid: f for f in target.fields if (fid := _field_id(f)) is not None}
        for field in source.fields if wanted else ():
            field_id = _field_id(field)
            if field_id is None:
                continue
            match = wanted.get(field_id)
            if match is None or match.name != field.name:
                return True
            if _renamed_or_dropped(field.type, match.type):
                return True
        return False
    if pa.types.is_map(target) and pa.types.is_map(source):
        return _renamed_or_dropped(source.key_type, target.key_type) or _renamed_or_dropped(
            source.item_type, target.item_type
        )
    if pa.types.is_list(target) and (pa.types.is_list(source) or pa.types.is_large_list(source)):
        return _renamed_or_dropped(source.value_type, target.value_type)
    return False


def _list_parts(values: pa.Array) -> tuple[pa.Array, pa.Array]:
    """(offsets from 0, the child values they index) of a list or map array, also of a
    slice (Arrow refuses a validity mask with the offsets of a slice)."""
    offsets = values.offsets
    start = offsets[0].as_py()
    child = values.values.slice(start, offsets[-1].as_py() - start)
    return pc.subtract(offsets, pa.scalar(start, offsets.type)), child


def _cast_column(name: str, values: pa.Array | pa.ChunkedArray, target: pa.Field) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if values.type != target.type:
        if pa.types.is_nested(target.type):
            # Arrow's struct cast drops unknown fields and stringifies numbers without a
            # word; apply the same rules as for top-level columns, field by field.
            _check_nested_cast(name, values.type, target.type)
        try:
            values = _cast_values(values, target.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise SchemaError(
                name, f"cannot convert {values.type} to {target.type}: {exc}"
            ) from exc
    if not target.nullable and values.null_count:
        first = pc.index(pc.is_null(values), True).as_py()
        raise SchemaError(
            name, f"required column has {values.null_count} null value(s) (first at row {first})"
        )
    if _has_required_child(target.type):
        check_required_children(name, values, target.type)
    return values


def _child_fields(data_type: pa.DataType) -> list[tuple[str, pa.Field]]:
    """(path suffix, field) of a nested type's children, as Iceberg names them."""
    if pa.types.is_struct(data_type):
        return [(f".{f.name}", f) for f in data_type.fields]
    if pa.types.is_map(data_type):
        return [(".key", data_type.key_field), (".value", data_type.item_field)]
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        return [(".element", data_type.value_field)]
    return []


def _has_required_child(data_type: pa.DataType) -> bool:
    return any(
        not field.nullable or _has_required_child(field.type)
        for _, field in _child_fields(data_type)
    )


def _check_nested_cast(path: str, source: pa.DataType, target: pa.DataType) -> None:
    if pa.types.is_struct(target):
        if not pa.types.is_struct(source):
            raise SchemaError(path, f"expected a struct, got {source}")
        names = {field.name for field in target.fields}
        for field in source.fields:
            if field.name not in names:
                raise SchemaError(
                    f"{path}.{field.name}",
                    f"field is not in the table schema; the struct has {', '.join(names)}",
                )
            _check_nested_cast(f"{path}.{field.name}", field.type, target.field(field.name).type)
        return
    source_children = dict(_child_fields(source))
    target_children = _child_fields(target)
    if target_children:
        if [suffix for suffix, _ in target_children] != list(source_children):
            raise SchemaError(path, f"expected {target}, got {source}")
        for suffix, field in target_children:
            _check_nested_cast(f"{path}{suffix}", source_children[suffix].type, field.type)
        return
    if source == target:
        return
    if _is_text(target) and not _is_text(source):
        raise SchemaError(path, f"only text converts to a string field, got {source}")
    if _is_temporal(target) and not (_is_temporal(source) or _is_text(source)):
        raise SchemaError(
            path, "numbers are ambiguous as times; send ISO-8601 text or Arrow temporal values"
        )


def check_required_children(path: str, values: pa.Array, data_type: pa.DataType) -> None:
    """Raise ``SchemaError`` naming the nested path of a null in a required nested
    field, element or map value (struct fields count only where the struct is set)."""
    if not _has_required_child(data_type):
        return
    if pa.types.is_struct(data_type):
        for index, field in enumerate(data_type.fields):
            child = values.field(index)
            if not field.nullable:
                # The child array ignores the parent's validity: a null struct's
                # fields are don't-care, only present structs must fill them.
                bad = pc.and_(pc.is_null(child), pc.is_valid(values))
                if pc.any(bad).as_py():
                    row = pc.index(bad, True).as_py()
                    raise SchemaError(f"{path}.{field.name}", f"required field is null (row {row})")
            if _has_required_child(field.type):
                check_required_children(f"{path}.{field.name}", child, field.type)
        return
    for suffix, field in _child_fields(data_type):
        if pa.types.is_map(data_type):
            child = values.keys if suffix == ".key" else values.items
        else:
            child = values.flatten()
        if not field.nullable and child.null_count:
            raise SchemaError(f"{path}{suffix}", "required value is null")
        if _has_required_child(field.type):
            check_required_children(f"{path}{suffix}", child, field.type)


def _is_text(data_type: pa.DataType) -> bool:
    if pa.types.is_dictionary(data_type):
        return _is_text(data_type.value_type)
    return bool(
        pa.types.is_string(data_type)
        or pa.types.is_large_string(data_type)
        or pa.types.is_string_view(data_type)
    )


def _is_temporal(data_type: pa.DataType) -> bool:
    return bool(
        pa.types.is_timestamp(data_type)
        or pa.types.is_date(data_type)
        or pa.types.is_time(data_type)
    )


def cast_array(values: pa.Array, target: pa.DataType) -> pa.Array:
    """Cast one array to ``target`` with conform's rules, nested types included.

    Struct fields are matched by name (missing ones become null), and nested arrays
    are rebuilt with the target's child fields rather than cast by Arrow: Arrow's
    cast refuses a null in a required struct field even under a null struct, where
    Iceberg (and Parquet) do not care. Raises ``pa.ArrowInvalid`` and friends.
    """
    if values.type == target:
        return values
    if pa.types.is_struct(target):
        if not pa.types.is_struct(values.type):
            raise pa.ArrowInvalid(f"expected a struct, got {values.type}")
        positions = {field.name: i for i, field in enumerate(values.type.fields)}
        children = [
            cast_array(values.field(positions[field.name]), field.type)
            if field.name in positions
            else pa.nulls(len(values), field.type)
            for field in target.fields
        ]
        return pa.StructArray.from_arrays(
            children, fields=list(target.fields), mask=_null_mask(values)
        )
    if pa.types.is_map(target):
        if not pa.types.is_map(values.type):
            raise pa.ArrowInvalid(f"expected a map, got {values.type}")
        entries = values.values
        return pa.MapArray.from_arrays(
            values.offsets,
            cast_array(entries.field(0), target.key_type),
            cast_array(entries.field(1), target.item_type),
            type=target,
            mask=_null_mask(values),
        )
    if pa.types.is_list(target):
        if not (pa.types.is_list(values.type) or pa.types.is_large_list(values.type)):
            raise pa.ArrowInvalid(f"expected a list, got {values.type}")
        return pa.ListArray.from_arrays(
            values.offsets.cast(pa.int32()),
            cast_array(values.values, target.value_type),
            type=target,
            mask=_null_mask(values),
        )
    return _cast_values(values, target)


def fill_masked_children(values: pa.Array, data_type: pa.DataType) -> pa.Array:
    """Give required nested fields a placeholder where their parent struct is null.

    Arrow keeps whatever a null struct's children hold, but the Parquet writer refuses
    any null in a non-nullable child, even under a null parent, where Parquet stores
    nothing for it. Call after ``check_required_children`` has verified that present
    structs fill their required fields; returns ``values`` unchanged when nothing needs
    filling.
    """
    if not _has_required_child(data_type):
        return values
    if pa.types.is_struct(data_type):
        children = []
        for index, field in enumerate(data_type.fields):
            child = fill_masked_children(values.field(index), field.type)
            if not field.nullable and child.null_count:
                child = _placeholder(child, field.type)
            children.append(child)
        return pa.StructArray.from_arrays(
            children, fields=list(data_type.fields), mask=_null_mask(values)
        )
    if pa.types.is_map(data_type):
        entries = values.values
        return pa.MapArray.from_arrays(
            values.offsets,
            entries.field(0),
            fill_masked_children(entries.field(1), data_type.item_type),
            type=data_type,
            mask=_null_mask(values),
        )
    if pa.types.is_list(data_type):
        return pa.ListArray.from_arrays(
            values.offsets,
            fill_masked_children(values.values, data_type.value_type),
            type=data_type,
            mask=_null_mask(values),
        )
    return values


def _placeholder(values: pa.Array, data_type: pa.DataType) -> pa.Array:
    """``values`` with every slot valid, built from its own buffers and children.

    The slots that were null hold whatever their buffers hold (zeros, empty ranges);
    they sit under a null parent, which Parquet does not store. No value of the type
    is constructed: pyarrow cannot build scalars of a list or map holding a uuid, nor
    cast a number to every date or decimal type.
    """
    if isinstance(data_type, pa.BaseExtensionType):
        storage = values.storage if isinstance(values, pa.ExtensionArray) else values
        return pa.ExtensionArray.from_storage(
            data_type, _placeholder(storage, data_type.storage_type)
        )
    if pa.types.is_struct(data_type):
        children = [
            _placeholder(values.field(i), f.type) if not f.nullable else values.field(i)
            for i, f in enumerate(data_type.fields)
        ]
        return pa.StructArray.from_arrays(children, fields=list(data_type.fields))
    if pa.types.is_map(data_type):
        entries = values.values
        return pa.MapArray.from_arrays(
            values.offsets, entries.field(0), entries.field(1), type=data_type
        )
    if pa.types.is_list(data_type):
        return pa.ListArray.from_arrays(values.offsets, values.values, type=data_type)
    return pa.Array.from_buffers(
        data_type, len(values), [None, *values.buffers()[1:]], offset=values.offset
    )


def _null_mask(values: pa.Array) -> pa.Array | None:
    return values.is_null() if values.null_count else None


def _cast_values(values: pa.Array, target: pa.DataType) -> pa.Array:
    if pa.types.is_nested(target):
        return cast_array(values, target)
    # Arrow would happily stringify numbers and read integers as timestamps in the
    # target's unit; both hide a wrongly typed input instead of reporting it.
    if _is_text(target) and not _is_text(values.type):
        raise pa.ArrowInvalid("only text converts to a string column")
    if _is_temporal(target) and not (_is_temporal(values.type) or _is_text(values.type)):
        raise pa.ArrowInvalid(
            "numbers are ambiguous as times; send ISO-8601 text or Arrow temporal values"
        )
    if pa.types.is_decimal(target) and _is_text(values.type) and has_huge_exponent(values):
        raise pa.ArrowInvalid(
            "a value has an exponent of 5 or more digits, which no numeric column can hold"
        )
    if isinstance(target, pa.BaseExtensionType):
        # Arrow cannot cast into extension types (uuid) directly: cast to the storage
        # type, then wrap, which is zero-copy.
        storage = values.storage if isinstance(values, pa.ExtensionArray) else values
        return pa.ExtensionArray.from_storage(target, storage.cast(target.storage_type))
    if pa.types.is_timestamp(target) and pa.types.is_timestamp(values.type):
        if target.tz is not None and values.type.tz is None:
            # Naive timestamps bound for a timestamptz column are taken as UTC, which is
            # what Iceberg and Spark do; Arrow refuses that cast without a hint.
            values = values.cast(pa.timestamp(values.type.unit, tz=target.tz))
        elif target.tz is None and values.type.tz is not None:
            raise pa.ArrowInvalid(
                "refusing to drop the time zone of a timestamptz value into a timestamp column"
            )
    cast = values.cast(target, safe=True)
    if _is_text(values.type) and _is_temporal(target):
        # Text parses to any year Arrow can hold ("0000-01-01"); Arrow temporal
        # input was range-checked at decode, text only becomes a time here.
        found = find_out_of_range(cast)
        if found is not None:
            raise pa.ArrowInvalid(found.problem)
    return cast


def conform(
    batch: pa.RecordBatch | pa.Table,
    arrow_schema: pa.Schema,
    *,
    match_field_ids: bool = False,
    drop_extra: bool = False,
) -> pa.RecordBatch:
    """Cast ``batch`` to ``arrow_schema`` column by column, in the schema's order.

    ``drop_extra`` ignores columns the schema lacks (spooled before someone dropped
    them from the table) instead of refusing the batch.

    Columns are matched by name (or by Iceberg field id when ``match_field_ids`` is set
    and both sides carry ids: that survives a column rename between spooling and
    encoding; nested fields too, and a nested field dropped since is left out).
    Missing optional columns become nulls. A missing required column, an unknown
    column, a null in a required column or a failed cast raises ``SchemaError``
    naming the column.
    """
    if isinstance(batch, pa.Table):
        batch = batch.combine_chunks().to_batches()[0] if batch.num_rows else _empty(batch)
    if batch.schema.equals(arrow_schema, check_metadata=False) and all(
        (field.nullable or batch.column(i).null_count == 0)
        and not (pa.types.is_nested(field.type) and _has_required_child(field.type))
        for i, field in enumerate(arrow_schema)
    ):
        # Already conforming (the spool replay path): only stamp the target metadata.
        return pa.RecordBatch.from_arrays(batch.columns, schema=arrow_schema)

    source_index: dict[str | bytes, int] = {}
    for index, field in enumerate(batch.schema):
        key: str | bytes = field.name
        if match_field_ids and (field_id := _field_id(field)) is not None:
            key = field_id
        if key in source_index:
            raise SchemaError(field.name, "column appears more than once in the batch")
        source_index[key] = index

    used: set[int] = set()
    arrays: list[pa.Array] = []
    for target in arrow_schema:
        lookup: str | bytes = target.name
        if match_field_ids and (target_id := _field_id(target)) is not None:
            lookup = target_id if target_id in source_index else target.name
        found = source_index.get(lookup)
        if found is None:
            if not target.nullable:
                raise SchemaError(target.name, "required column is missing")
            arrays.append(pa.nulls(batch.num_rows, type=target.type))
            continue
        used.add(found)
        column = batch.column(found)
        source = batch.schema.field(found).type
        if match_field_ids and _renamed_or_dropped(source, target.type):
            # Nested fields renamed or dropped since, matched by id like columns.
            column = _align_field_ids(column, source, target.type)
        arrays.append(_cast_column(target.name, column, target))

    extra = [batch.schema.field(i).name for i in range(batch.num_columns) if i not in used]
    if extra and not drop_extra:
        raise SchemaError(extra[0], "column is not in the table schema")
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)


def _empty(table: pa.Table) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        # pa.nulls: pa.array([]) fails for nested types holding a uuid (pyarrow 26).
        [pa.nulls(0, type=field.type) for field in table.schema],
        schema=table.schema,
    )
