"""The tool gateway's claims keep one index for lookups by run: the unique (run_id, call_id)
constraint's. The second one on run_id alone is what the generic plans of the gateway's
conditions chose, filtering every claim of the run on call_id (ledger/models.py,
ToolGatewayClaim.run). Only the index goes: Django's AlterField would also drop and re-add the
foreign key, which validates every row of the table again.
"""

import django.db.models.deletion
from django.db import migrations, models

# The name Django gave the index in migration 0005 (on both backends).
INDEX = "ledger_toolgatewayclaim_run_id_f3aa8f64"


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0019_run_rows_without_database_foreign_key'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='toolgatewayclaim',
                    name='run',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='gateway_claims', to='ledger.run'),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    f'DROP INDEX IF EXISTS "{INDEX}"',
                    reverse_sql=f'CREATE INDEX "{INDEX}" ON "ledger_toolgatewayclaim" ("run_id")',
                ),
            ],
        ),
    ]
