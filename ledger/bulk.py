"""Plain multi-row INSERTs for the append path.

On PostgreSQL rows go in with COPY: Django's bulk_create sends each column as an array that
psycopg escapes in Python, which cost more than everything else in a batched append
(bench/ingest.py --profile). Elsewhere bulk_create is fine.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connection, models


def insert_rows(model: type[models.Model], objs: Sequence[models.Model]) -> None:
    if not objs:
        return
    if connection.vendor != "postgresql":
        model.objects.bulk_create(objs)
        return
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    table = connection.ops.quote_name(model._meta.db_table)
    with connection.cursor() as cursor:
        with cursor.cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
            for obj in objs:
                copy.write_row([f.get_db_prep_save(getattr(obj, f.attname), connection) for f in fields])
