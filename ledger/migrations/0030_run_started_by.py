"""Run.started_by: who appended the run's first batch, as the server knew the caller (a username,
`key:<prefix>`, `system:<what>`), set by the write door; the tool approvals' "not your own" rule
reads it instead of the payload's `requestedBy`.

Runs from before this migration have no such record: they get their RunStarted's `requestedBy`
(a string, at most 160 characters), the identity the rule believed until now, so nothing that was
refused before is allowed after. SQLite rebuilds ledger_run to add a column, so the log's
triggers are dropped first and installed last (ledger/dbguards.py), as in 0028.
"""

from django.db import migrations, models

from ledger import dbguards


def fill_from_payloads(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        claimed = (
            "(SELECT CASE WHEN jsonb_typeof(e.payload::jsonb -> 'requestedBy') = 'string' "
            "THEN left(e.payload::jsonb ->> 'requestedBy', 160) ELSE '' END"
        )
    else:
        claimed = (
            "(SELECT CASE WHEN json_type(e.payload, '$.requestedBy') = 'text' "
            "THEN substr(json_extract(e.payload, '$.requestedBy'), 1, 160) ELSE '' END"
        )
    schema_editor.execute(
        f"UPDATE ledger_run SET started_by = COALESCE({claimed} FROM ledger_event e "
        "WHERE e.run_id = ledger_run.id AND e.sequence = 1 AND e.type = 'RunStarted'), '') "
        "WHERE last_sequence > 0"
    )


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0029_workspace_limits"),
    ]

    operations = [
        migrations.RunPython(dbguards.drop, dbguards.install),
        migrations.AddField(
            model_name="run",
            name="started_by",
            field=models.CharField(blank=True, default="", max_length=160),
        ),
        migrations.RunPython(dbguards.install, dbguards.drop),
        migrations.RunPython(fill_from_payloads, migrations.RunPython.noop),
    ]
