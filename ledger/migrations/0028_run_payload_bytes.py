"""Run.payload_bytes: the bytes of a run's stored canonical payloads (LEDGER_MAX_BYTES_PER_RUN),
kept by the write path; existing runs are counted from their events once, here.

SQLite rebuilds ledger_run to add a column, so the log's triggers are dropped first and installed
last (ledger/dbguards.py), as in 0024.
"""

from django.db import migrations, models

from ledger import dbguards


def count_existing(apps, schema_editor):
    size = "octet_length(e.payload)" if schema_editor.connection.vendor == "postgresql" else "length(CAST(e.payload AS BLOB))"
    schema_editor.execute(
        "UPDATE ledger_run SET payload_bytes = "
        f"(SELECT COALESCE(SUM({size}), 0) FROM ledger_event e WHERE e.run_id = ledger_run.id)"
    )


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0027_run_tree_index"),
    ]

    operations = [
        migrations.RunPython(dbguards.drop, dbguards.install),
        migrations.AddField(
            model_name="run",
            name="payload_bytes",
            field=models.BigIntegerField(default=0),
        ),
        migrations.RunPython(dbguards.install, dbguards.drop),
        migrations.RunPython(count_existing, migrations.RunPython.noop),
    ]
