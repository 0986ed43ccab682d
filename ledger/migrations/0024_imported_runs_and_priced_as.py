"""Run.imported_from (the rules a run's log is read by) and CostEntry.priced_as (the price table's
entry that priced a call). Existing cost entries get their entry at the next `ledger reprice`.

SQLite rebuilds ledger_run to add a column, so the log's triggers are dropped first and installed
last (ledger/dbguards.py).
"""

from django.db import migrations, models

from ledger import dbguards


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0023_redundant_foreign_key_indexes'),
    ]

    operations = [
        migrations.RunPython(dbguards.drop, dbguards.install),
        migrations.AddField(
            model_name='costentry',
            name='priced_as',
            field=models.CharField(blank=True, default='', max_length=401),
        ),
        migrations.AddField(
            model_name='run',
            name='imported_from',
            field=models.CharField(blank=True, default='', max_length=32),
        ),
        migrations.RunPython(dbguards.install, dbguards.drop),
    ]
