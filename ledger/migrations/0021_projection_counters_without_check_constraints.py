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

CHECKED = {
    "ledger_costentry": ("sequence",),
    "ledger_dailyusage": ("calls", "priced_calls"),
    "ledger_event": ("sequence",),
    "ledger_run": ("event_count", "last_sequence", "priced_calls", "unpriced_calls"),
    "ledger_step": ("first_sequence", "last_sequence", "position", "priced_calls", "unpriced_calls", "visit"),
    "ledger_toolcall": ("ended_sequence", "position", "started_sequence"),
    "ledger_toolgatewayclaim": ("attempt",),
}


def _alter(schema_editor, statement):
    if schema_editor.connection.vendor != "postgresql":
        return
    for table, columns in CHECKED.items():
        for column in columns:
            schema_editor.execute(statement.format(table=table, column=column))


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
                migrations.AlterField(
                    model_name='costentry',
                    name='sequence',
                    field=models.IntegerField(),
                ),
                migrations.AlterField(
                    model_name='dailyusage',
                    name='calls',
                    field=models.IntegerField(default=0),
                ),
                migrations.AlterField(
                    model_name='dailyusage',
                    name='priced_calls',
                    field=models.IntegerField(default=0),
                ),
                migrations.AlterField(
                    model_name='event',
                    name='sequence',
                    field=models.IntegerField(),
                ),
                migrations.AlterField(
                    model_name='run',
                    name='event_count',
                    field=models.IntegerField(default=0),
                ),
                migrations.AlterField(
                    model_name='run',
                    name='last_sequence',
                    field=models.IntegerField(default=0),
                ),
                migrations.AlterField(
                    model_name='run',
                    name='priced_calls',
                    field=models.IntegerField(default=0),
                ),
                migrations.AlterField(
                    model_name='run',
                    name='unpriced_calls',
                    field=models.IntegerField(default=0),
                ),
                migrations.AlterField(
                    model_name='step',
                    name='first_sequence',
                    field=models.IntegerField(),
                ),
                migrations.AlterField(
                    model_name='step',
                    name='last_sequence',
                    field=models.IntegerField(),
                ),
                migrations.AlterField(
                    model_name='step',
                    name='position',
                    field=models.IntegerField(),
                ),
                migrations.AlterField(
                    model_name='step',
                    name='priced_calls',
                    field=models.IntegerField(default=0),
                ),
                migrations.AlterField(
                    model_name='step',
                    name='unpriced_calls',
                    field=models.IntegerField(default=0),
                ),
                migrations.AlterField(
                    model_name='step',
                    name='visit',
                    field=models.IntegerField(blank=True, null=True),
                ),
                migrations.AlterField(
                    model_name='toolcall',
                    name='ended_sequence',
                    field=models.IntegerField(blank=True, null=True),
                ),
                migrations.AlterField(
                    model_name='toolcall',
                    name='position',
                    field=models.IntegerField(),
                ),
                migrations.AlterField(
                    model_name='toolcall',
                    name='started_sequence',
                    field=models.IntegerField(blank=True, null=True),
                ),
                migrations.AlterField(
                    model_name='toolgatewayclaim',
                    name='attempt',
                    field=models.IntegerField(default=1),
                ),
            ],
        ),
    ]
