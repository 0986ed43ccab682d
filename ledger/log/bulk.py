"""Set-based INSERTs and upserts: one statement per table, whatever the number of rows.

On PostgreSQL the rows travel as one JSON array that the server unpacks with
`json_to_recordset`: orjson writes it in microseconds and the statement's text does not depend
on the number of rows, so it can be prepared once. Django's bulk_create sends each column as an
array that psycopg escapes in Python, and builds a model instance per row, which together cost
more than the rest of a batched append (bench/ingest.py --profile). Long row lists without a
conflict clause still go in by COPY. On SQLite, bulk_create is fine.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

import orjson
from django.db import connection, models
from psycopg.types.json import Jsonb

from ..canonical import nul_as_stand_in

COPY_FROM_ROWS = 20


def _concrete(model: type[models.Model], name: str) -> models.Field[Any, Any]:
    field = model._meta.get_field(name)
    # Raw SQL names columns: a reverse relation or a generic key has none, so fail on the name.
    if not isinstance(field, models.Field) or field.column is None:
        raise ValueError(f"{model.__name__}.{name} is not a column")
    return field


def column(model: type[models.Model], name: str) -> str:
    """The quoted column of field (or attname) `name`."""
    return connection.ops.quote_name(str(_concrete(model, name).column))


def table(model: type[models.Model]) -> str:
    return connection.ops.quote_name(model._meta.db_table)


def recordset(model: type[models.Model], names: Sequence[str], param: str) -> str:
    """`json_to_recordset(%(param)s::json) AS r(...)`: the rows of a JSON array parameter
    (`json_rows`) as a table whose columns are `names`, typed as `model`'s columns."""
    types = ", ".join(f"{column(model, n)} {_concrete(model, n).db_type(connection)}" for n in names)
    return f"json_to_recordset(%({param})s::json) AS r({types})"


def values_row(model: type[models.Model], names: Sequence[str], param: str) -> str:
    """`(VALUES (…)) AS r(...)`: one row of `names` as scalar parameters `%(param_name)s`
    (`row_params`), for where `recordset` would unpack a JSON array of one row. Each is cast to its
    column's type without the length or precision (an explicit cast to varchar(n) cuts a longer
    string short; the insert's own assignment refuses it, as it refuses it from a recordset)."""
    values = ", ".join(f"%({param}_{n})s::{_base_type(model, n)}" for n in names)
    return f"(VALUES ({values})) AS r({', '.join(column(model, n) for n in names)})"


def _base_type(model: type[models.Model], name: str) -> str:
    db_type = str(_concrete(model, name).db_type(connection))
    return db_type.partition("(")[0]


def row_params(model: type[models.Model], param: str, row: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters of `values_row` for `row`: JSON columns as their JSON text, the rest as they are."""
    names = tuple(row)
    keys, json_names = _row_keys(model, param, names)
    if not json_names:
        return dict(zip(keys, row.values()))
    return {
        key: json_text(value) if value is not None and name in json_names else value
        for key, name, value in zip(keys, names, row.values())
    }


@functools.lru_cache(maxsize=64)
def _row_keys(model: type[models.Model], param: str, names: tuple[str, ...]) -> tuple[tuple[str, ...], frozenset[str]]:
    return tuple(f"{param}_{n}" for n in names), json_fields(model).intersection(names)


@functools.cache
def json_fields(model: type[models.Model]) -> frozenset[str]:
    """The names (and attnames) of `model`'s JSON columns."""
    return frozenset(
        name for f in model._meta.concrete_fields if isinstance(f, models.JSONField) for name in (f.name, f.attname)
    )


def conflict_update(
    model: type[models.Model], key: Sequence[str], names: Sequence[str], keep: Sequence[str] = ()
) -> str:
    """`ON CONFLICT (key) DO UPDATE SET` every one of `names` that is not in the key or `keep`."""
    updates = ", ".join(
        f"{c} = EXCLUDED.{c}" for c in (column(model, n) for n in names if n not in key and n not in keep)
    )
    return f"ON CONFLICT ({', '.join(column(model, k) for k in key)}) DO UPDATE SET {updates}"


def _jsonable(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)  # exact; numeric's input reads it
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def json_rows(rows: Sequence[Mapping[str, Any]]) -> str:
    """The JSON text of `rows` for a `recordset` parameter (keys are field names = columns)."""
    return json_text(rows)


def json_text(value: Any) -> str:
    """JSON text for PostgreSQL to read, a U+0000 (only an imported log's payload holds one) as
    U+FFFD: jsonb cannot hold it (ledger.canonical.nul_as_stand_in)."""
    try:
        text = orjson.dumps(value, default=_jsonable).decode()
    except orjson.JSONEncodeError:  # an integer past 64 bits in a JSON column: json writes it
        text = json.dumps(value, default=_jsonable, ensure_ascii=False)
    return nul_as_stand_in(text)


def insert_rows(model: type[models.Model], rows: Sequence[Mapping[str, Any]]) -> None:
    """INSERT `rows` (dicts of field name or attname to value, all with the same keys)."""
    if not rows:
        return
    if connection.vendor != "postgresql":
        model._default_manager.bulk_create([model(**row) for row in rows])
        return
    names = list(rows[0])
    columns = ", ".join(column(model, n) for n in names)
    with connection.cursor() as cursor:
        if len(rows) < COPY_FROM_ROWS:
            # COPY costs extra round trips to start and finish; a few rows go in as one statement.
            cursor.execute(
                f"INSERT INTO {table(model)} ({columns}) SELECT * FROM {recordset(model, names, 'rows')}",
                {"rows": json_rows(rows)},
            )
            return
        fields = [_concrete(model, n) for n in names]
        with cursor.cursor.copy(f"COPY {table(model)} ({columns}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row([_copy_value(f, row[n]) for f, n in zip(fields, names)])


def _copy_value(field: models.Field[Any, Any], value: Any) -> Any:
    return Jsonb(value, dumps=json_text) if isinstance(field, models.JSONField) and value is not None else value


def upsert_rows(
    model: type[models.Model], key: Sequence[str], rows: Sequence[Mapping[str, Any]], keep: Sequence[str] = ()
) -> None:
    """INSERT … ON CONFLICT (key) DO UPDATE, one statement for all `rows` (unique by `key`); a
    row that exists keeps its columns in `keep`."""
    if not rows:
        return
    names = list(rows[0])
    if connection.vendor != "postgresql":
        model._default_manager.bulk_create(
            [model(**row) for row in rows],
            update_conflicts=True,
            unique_fields=[_concrete(model, k).name for k in key],
            update_fields=[_concrete(model, n).name for n in names if n not in key and n not in keep],
        )
        return
    columns = ", ".join(column(model, n) for n in names)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table(model)} ({columns}) SELECT * FROM {recordset(model, names, 'rows')} "
            f"{conflict_update(model, key, names, keep)}",
            {"rows": json_rows(rows)},
        )
