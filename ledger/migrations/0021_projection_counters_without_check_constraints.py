"""The projections' counters and sequence numbers lose PositiveIntegerField's `>= 0` CHECK
(ledger/models.py, UsageColumns, says why): PostgreSQL read each one again on every statement that
wrote its table.

On PostgreSQL the CHECKs are dropped by name (the names PostgreSQL gave the column constraints of
CREATE TABLE), at once at any table size. On SQLite the columns are left as they are: an AlterField
there remakes the table, which would drop the event log's insert-only triggers (migration 0002) and
the daily rollup's monthly triggers (0018), and SQLite's CHECKs cost nothing worth that.
The log's own constraint (event_sequence_positive) and the gateway's (gateway_attempt_positive) stay.
"""

from django.db import migrations, models

# model -> field -> the IntegerField options it keeps (PositiveIntegerField's, less the CHECK).
REQUIRED, COUNTER, OPTIONAL = {}, {"default": 0}, {"blank": True, "null": True}
FIELDS = {
    "costentry": {"sequence": REQUIRED},
    "dailyusage": {"calls": COUNTER, "priced_calls": COUNTER},
    "event": {"sequence": REQUIRED},
    "run": {"event_count": COUNTER, "last_sequence": COUNTER, "priced_calls": COUNTER, "unpriced_calls": COUNTER},
    "step": {"first_sequence": REQUIRED, "last_sequence": REQUIRED, "position": REQUIRED, "priced_calls": COUNTER,
             "unpriced_calls": COUNTER, "visit": OPTIONAL},
    "toolcall": {"ended_sequence": OPTIONAL, "position": REQUIRED, "started_sequence": OPTIONAL},
    "toolgatewayclaim": {"attempt": {"default": 1}},
}


def _alter(schema_editor, statement):
    if schema_editor.connection.vendor != "postgresql":
        return
    for model, fields in FIELDS.items():
        for column in fields:
            schema_editor.execute(statement.format(table=f"ledger_{model}", column=column))


def drop_checks(apps, schema_editor):
    _alter(schema_editor, 'ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {table}_{column}_check')


def add_checks(apps, schema_editor):
    _alter(schema_editor, 'ALTER TABLE {table} ADD CONSTRAINT {table}_{column}_check CHECK ("{column}" >= 0)')


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0020_gateway_claim_run_lookups_by_unique_index'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(drop_checks, add_checks)],
            state_operations=[
                migrations.AlterField(model_name=model, name=name, field=models.IntegerField(**options))
                for model, fields in FIELDS.items() for name, options in fields.items()
            ],
        ),
    ]
