"""Delta column mapping: physical columns in the files, logical names in batches.

With ``delta.columnMapping.mode`` = ``name`` a table's Parquet files name
each column (nested fields included) by its ``delta.columnMapping.physicalName``;
with ``id`` the files' field ids (``PARQUET:field_id``) are matched to the
schema's ``delta.columnMapping.id`` (the files' names may be anything). The
log's schema, as delta-rs converts it to Arrow, carries both on every field;
:mod:`ucstage.tables.delta` adds the mode to the schema's metadata, so the
manifest's schema alone says how a file's columns map.

A column a file does not hold under its physical name or id (added later)
is null, as for any Delta table; a physical column the schema no longer
names (dropped, maybe re-added under the same logical name with a new
physical one) is never read.
"""

from __future__ import annotations

from typing import Any

from ..errors import UnsupportedTable

__all__ = ["MODE_KEY", "logical_leaves", "mode", "physical_field", "physical_top",
           "to_logical"]

MODE_KEY = b"delta.columnMapping.mode"
_NAME = b"delta.columnMapping.physicalName"
_ID = b"delta.columnMapping.id"
_FIELD_ID = b"PARQUET:field_id"


def mode(schema: Any) -> str:
    """``none``, ``name`` or ``id``: the column mapping of a manifest's schema."""
    return (schema.metadata or {}).get(MODE_KEY, b"none").decode()


def _key(field: Any, how: str, physical: bool) -> str | None:
    """The key a field is matched by: its physical name or id (``name``/``id``
    mode; ``physical``: a file's field, else the log's); its name without
    column mapping."""
    meta = field.metadata or {}
    if how == "none":
        return str(field.name)
    if how == "id":
        raw = meta.get(_FIELD_ID if physical else _ID)
        return raw.decode() if raw is not None else None
    if physical:
        return str(field.name)
    raw = meta.get(_NAME)
    return raw.decode() if raw is not None else str(field.name)


def _by_key(fields: Any, how: str) -> dict[str, int]:
    return {k: i for i, f in enumerate(fields) if (k := _key(f, how, True)) is not None}


def logical_leaves(schema: Any, file_schema: Any, leaves: list[str], what: str) -> list[str]:
    """A file's leaf paths with each top-level physical name replaced by its
    logical name (what the manifest's column masks and entries match).

    Raises:
        UnsupportedTable: ``id`` mode and file ``what`` has no field ids (its
            columns would all read as null).
    """
    how = mode(schema)
    if how == "none":
        return leaves
    found = _by_key(file_schema, how)
    if how == "id" and leaves and not found:
        raise UnsupportedTable(f"{what} has no Parquet field ids, which column mapping "
                               "mode 'id' matches its columns by",
                               hint="the file was not written for this table's column "
                                    "mapping: rewrite it with a Delta engine")
    names = {file_schema.field(found[k]).name: f.name for f in schema
             if (k := _key(f, how, False)) is not None and k in found}
    out = []
    for leaf in leaves:
        top, dot, rest = leaf.partition(".")
        out.append(names.get(top, "\0" + top) + dot + rest)  # "\0": matches no column
    return out


def physical_top(schema: Any, file_schema: Any, name: str) -> str:
    """The file's top-level column holding logical column ``name``."""
    how = mode(schema)
    if how == "none":
        return name
    key = _key(schema.field(name), how, False) or ""
    return str(file_schema.field(_by_key(file_schema, how)[key]).name)


def physical_field(field: Any, how: str) -> Any:
    """The log's ``field`` as a Delta engine writes it in a Parquet file:
    under its physical name, nested struct fields (in lists and maps too)
    likewise, with its column mapping id as the Parquet field id
    (``PARQUET:field_id``) in ``id`` mode; ``field`` itself without column
    mapping. What a reader that matches a file's columns by name or id
    (Spark, for export) asks the files for."""
    import pyarrow as pa

    if how == "none":
        return field
    t = field.type
    if pa.types.is_struct(t):
        t = pa.struct([physical_field(c, how) for c in t])
    elif pa.types.is_large_list(t):
        t = pa.large_list(physical_field(t.value_field, how))
    elif pa.types.is_list(t):
        t = pa.list_(physical_field(t.value_field, how))
    elif pa.types.is_map(t):
        t = pa.map_(physical_field(t.key_field, how), physical_field(t.item_field, how),
                    keys_sorted=t.keys_sorted)
    meta = field.metadata or {}
    ids = {_FIELD_ID: meta[_ID]} if how == "id" and _ID in meta else None
    return pa.field(_key(field, "name", False), t, field.nullable, ids)


def to_logical(array: Any, field: Any, how: str) -> Any:
    """A file's column (a pyarrow Array) as the table's ``field``: nested
    fields matched by physical name or id (by name without column mapping)
    and renamed, the ones it lacks null, and every leaf cast to the table's
    type. The file's types may differ from the log's: Spark writes
    timestamps as INT96 (read without a time zone), and a file written
    before a type change (Delta type widening) holds the narrower type
    (int for long, float for double, date for timestamp_ntz, a decimal of
    smaller precision). The result is exactly ``field.type``.

    Raises:
        pyarrow.ArrowInvalid, ArrowNotImplementedError: a leaf whose values
            do not fit the table's type (the caller names the file).
    """
    import pyarrow as pa

    t, want = array.type, field.type
    if t == want and how != "id":
        # Equal types name equal fields; in ``id`` mode the names prove nothing.
        return array
    if pa.types.is_struct(want) and pa.types.is_struct(t):
        found = _by_key(list(t), how)
        children = []
        for child in want:
            i = found.get(_key(child, how, False) or "")
            if i is None:
                children.append(pa.nulls(len(array), type=child.type))
                continue
            sub = array.field(i)
            if len(sub) != len(array):
                sub = sub.slice(array.offset, len(array))
            children.append(to_logical(sub, child, how))
        return pa.StructArray.from_arrays(children, fields=list(want),
                                          mask=array.is_null() if array.null_count else None)
    if (pa.types.is_list(want) or pa.types.is_large_list(want)) and \
            (pa.types.is_list(t) or pa.types.is_large_list(t)):
        if pa.types.is_large_list(want) != pa.types.is_large_list(t):
            array = array.cast(pa.large_list(t.value_field) if pa.types.is_large_list(want)
                               else pa.list_(t.value_field))
        values = to_logical(array.values, want.value_field, how)
        cls = pa.ListArray if pa.types.is_list(want) else pa.LargeListArray
        return cls.from_arrays(array.offsets, values, type=want,
                               mask=array.is_null() if array.null_count else None)
    if pa.types.is_map(want) and pa.types.is_map(t):
        keys = to_logical(array.keys, want.key_field, how)
        items = to_logical(array.items, want.item_field, how)
        return pa.MapArray.from_arrays(array.offsets, keys, items, type=want,
                                       mask=array.is_null() if array.null_count else None)
    return array if t == want else array.cast(want)
