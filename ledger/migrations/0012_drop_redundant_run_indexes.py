"""Drop the single-column run_id index of the event, step, tool call and cost entry tables.

Each table has a unique (run_id, …) constraint whose index serves every lookup by run_id (its
leading column), the foreign key's cascades included; the second index on run_id alone was only
written to on every insert (bench/ingest.py, docs/scaling.md).

Only the indexes go, by their names as the database reports them: an AlterField would remake the
table on SQLite, and with it drop the event log's insert-only triggers (migration 0002).
"""

import django.db.models.deletion
from django.db import migrations, models

TABLES = ("ledger_event", "ledger_step", "ledger_toolcall", "ledger_costentry")


def _run_id_indexes(schema_editor, table):
    """The names of `table`'s plain (not unique, not primary) indexes on run_id alone."""
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, table)
    return [
        name for name, c in constraints.items()
        if c["index"] and not c["unique"] and not c["primary_key"] and c["columns"] == ["run_id"]
    ]


def drop_indexes(apps, schema_editor):
    for table in TABLES:
        for name in _run_id_indexes(schema_editor, table):
            schema_editor.execute(f"DROP INDEX {schema_editor.quote_name(name)}")


def create_indexes(apps, schema_editor):
    for table in TABLES:
        if not _run_id_indexes(schema_editor, table):
            name = schema_editor.quote_name(f"{table}_run_id_idx")
            schema_editor.execute(f"CREATE INDEX {name} ON {schema_editor.quote_name(table)} (run_id)")


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0011_retention_and_key_use'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(drop_indexes, create_indexes)],
            state_operations=[
                migrations.AlterField(
                    model_name='costentry',
                    name='run',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='cost_entries', to='ledger.run'),
                ),
                migrations.AlterField(
                    model_name='event',
                    name='run',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.DO_NOTHING, related_name='events', to='ledger.run'),
                ),
                migrations.AlterField(
                    model_name='step',
                    name='run',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='steps', to='ledger.run'),
                ),
                migrations.AlterField(
                    model_name='toolcall',
                    name='run',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='tool_calls', to='ledger.run'),
                ),
            ],
        ),
    ]
