"""Multi-row INSERTs and upserts for the append path.

On PostgreSQL, rows go in with COPY and upserts with one pipelined executemany: Django's
bulk_create sends each column as an array that psycopg escapes in Python, and builds a model
instance per row, which together cost more than the rest of a batched append
(bench/ingest.py --profile). On SQLite, bulk_create is fine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.db import connection, models
from psycopg.types.json import Jsonb


COPY_FROM_ROWS = 20


def _columns(model: type[models.Model], names: Sequence[str]) -> list[models.Field[Any, Any]]:
    return [_concrete(model, name) for name in names]


def _concrete(model: type[models.Model], name: str) -> models.Field[Any, Any]:
    field = model._meta.get_field(name)
    # Raw SQL names columns: a reverse relation or a generic key has none, so fail on the name.
    if not isinstance(field, models.Field) or field.column is None:
        raise ValueError(f"{model.__name__}.{name} is not a column")
    return field


def _column(field: models.Field[Any, Any]) -> str:
    return str(field.column)  # _concrete checked that there is one


def _adapt(fields: Sequence[models.Field[Any, Any]], row: Sequence[Any]) -> list[Any]:
    return [Jsonb(v) if isinstance(f, models.JSONField) and v is not None else v for f, v in zip(fields, row)]


def insert_rows(model: type[models.Model], names: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """INSERT `rows` (tuples in the order of the field `names`; foreign keys by attname)."""
    if not rows:
        return
    fields = _columns(model, names)
    if connection.vendor != "postgresql":
        model._default_manager.bulk_create([model(**dict(zip(names, row))) for row in rows])
        return
    columns = ", ".join(connection.ops.quote_name(_column(f)) for f in fields)
    table = connection.ops.quote_name(model._meta.db_table)
    with connection.cursor() as cursor:
        if len(rows) < COPY_FROM_ROWS:
            # COPY costs extra round trips to start and finish; a few rows go in as one pipeline.
            placeholders = ", ".join(["%s"] * len(fields))
            cursor.cursor.executemany(f"INSERT INTO {table} ({columns}) VALUES ({placeholders})",
                                      [_adapt(fields, row) for row in rows])
            return
        with cursor.cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(_adapt(fields, row))


def upsert_rows(model: type[models.Model], key: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> None:
    """INSERT … ON CONFLICT (key) DO UPDATE, one statement per row, pipelined on PostgreSQL."""
    if not rows:
        return
    names = list(rows[0])
    if connection.vendor != "postgresql":
        model._default_manager.bulk_create([model(**row) for row in rows], update_conflicts=True,
                                  unique_fields=[_concrete(model, k).name for k in key],
                                  update_fields=[n for n in names if n not in key])
        return
    fields = _columns(model, names)
    quote = connection.ops.quote_name
    columns = [quote(_column(f)) for f in fields]
    conflict = ", ".join(quote(_column(_concrete(model, k))) for k in key)
    updates = ", ".join(f"{c} = EXCLUDED.{c}" for f, c in zip(fields, columns) if f.name not in key
                        and f.attname not in key)
    sql = (f"INSERT INTO {quote(model._meta.db_table)} ({', '.join(columns)}) "
           f"VALUES ({', '.join(['%s'] * len(columns))}) ON CONFLICT ({conflict}) DO UPDATE SET {updates}")
    with connection.cursor() as cursor:
        cursor.cursor.executemany(sql, [_adapt(fields, [row[n] for n in names]) for row in rows])
