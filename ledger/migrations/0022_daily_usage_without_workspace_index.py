"""The daily usage rollup keeps one index for its reads: the unique (workspace, day, provider,
model, workflow) constraint's, which every read filters by (a workspace and a range of days) and
whose leading column serves the foreign key's cascades. The second index, on the workspace alone
(Django's for the foreign key), was what the planner chose for those reads on a table loaded
workspace by workspace (the column's correlation 1), filtering every day of the workspace: at 10
million events a 30-day read took 2.4 ms for 1,050 of 14,000 cells, 0.9 ms on the unique index
(bench/scale.py, bench/README.md § Floors, session 12). The monthly rollup never had it
(migration 0018). Only the index goes: an AlterField would remake the table on SQLite, and with it
drop the monthly rollup's triggers.
"""

import django.db.models.deletion
from django.db import migrations, models

# The name Django gave the index in migration 0009 (on both backends).
INDEX = "ledger_dailyusage_workspace_id_f4e5345d"


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0021_projection_counters_without_check_constraints'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='dailyusage',
                    name='workspace',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='ledger.workspace'),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    f'DROP INDEX IF EXISTS "{INDEX}"',
                    reverse_sql=f'CREATE INDEX "{INDEX}" ON "ledger_dailyusage" ("workspace_id")',
                ),
            ],
        ),
    ]
