"""CostEntry.usage_reported: False for a call whose recorded usage gave no token count, priced
NULL since (docs/operations.md § Prices). Rows written before are filled by 0038. A database
default (true), so that the previous release, still serving while migrations run, can insert."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0037_price_overrides_audited'),
    ]

    operations = [
        migrations.AddField(
            model_name='costentry',
            name='usage_reported',
            field=models.BooleanField(db_default=True, default=True),
        ),
    ]
