"""The event, step, tool call and cost entry rows keep their run_id without the database's
foreign-key check (ledger/models.py, Event.run, says why; `ledger verify` checks the reference).

On PostgreSQL each AlterField drops one constraint, at once at any table size. On SQLite it
remakes the table, and with it drops the event log's insert-only triggers (migration 0002), so
they are dropped first and installed again last, as migration 0003 does.
"""

import django.db.models.deletion
from django.db import migrations, models

from ledger import dbguards


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0018_monthly_usage'),
    ]

    operations = [
        migrations.RunPython(dbguards.drop, dbguards.install),
        migrations.AlterField(
            model_name='costentry',
            name='run',
            field=models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='cost_entries', to='ledger.run'),
        ),
        migrations.AlterField(
            model_name='event',
            name='run',
            field=models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.DO_NOTHING, related_name='events', to='ledger.run'),
        ),
        migrations.AlterField(
            model_name='step',
            name='run',
            field=models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='steps', to='ledger.run'),
        ),
        migrations.AlterField(
            model_name='toolcall',
            name='run',
            field=models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='tool_calls', to='ledger.run'),
        ),
        migrations.RunPython(dbguards.install, dbguards.drop),
    ]
