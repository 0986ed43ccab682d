from django.db import migrations

from ledger import dbguards


class Migration(migrations.Migration):
    dependencies = [("ledger", "0001_initial")]
    operations = [migrations.RunPython(dbguards.install, dbguards.drop)]
