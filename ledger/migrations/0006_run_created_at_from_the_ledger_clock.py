"""Run.created_at comes from the ledger's clock (ledger/clock.py) instead of auto_now_add.

Python-side only: the column is unchanged, so the state changes and the database does not (on
SQLite an AlterField would rebuild ledger_run for nothing).
"""

import ledger.clock
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0005_tool_gateway'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='run',
                    name='created_at',
                    field=models.DateTimeField(default=ledger.clock.recorded_now),
                ),
            ],
        ),
    ]
