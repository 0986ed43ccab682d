"""Feedback and audit entries get a public id, `fb_` / `aud_` and 32 random hex digits, stored with
the row and never changed: their API ids were `fb_<pk>` and `aud_<pk>`, and a primary key counts
every tenant's rows, so two ids a day apart told any tenant how much everyone wrote meanwhile
(docs/security.md § What ids and cursors reveal).

The rows already stored get theirs here, made by the database in one UPDATE per table as the new
ones are (ledger.models.PublicId): every row its own random value, then the column is NOT NULL and
unique. An id a client kept from before (`fb_12`) names nothing any more. SQLite remakes the audit
log's table to alter it and the UPDATE is refused by its append-only triggers, so they are dropped
first and installed last (ledger/dbguards.py). On PostgreSQL the first ALTER locks each table until
the migration commits, so no row is written between the fill and the constraint.
"""

from django.db import migrations, models

import ledger.models
from ledger import dbguards


def fill(apps, schema_editor):
    for model, prefix in (("Feedback", "fb_"), ("AuditEntry", "aud_")):
        rows = apps.get_model("ledger", model)._base_manager.filter(public_id__isnull=True)
        rows.update(public_id=ledger.models.PublicId(prefix))


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0039_reprice_usage_not_reported"),
    ]

    operations = [
        migrations.RunPython(dbguards.drop_audit, dbguards.install_audit),
        migrations.AddField(
            model_name="feedback",
            name="public_id",
            field=models.CharField(max_length=40, null=True),
        ),
        migrations.AddField(
            model_name="auditentry",
            name="public_id",
            field=models.CharField(max_length=40, null=True),
        ),
        migrations.RunPython(fill, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="feedback",
            name="public_id",
            field=models.CharField(db_default=ledger.models.PublicId("fb_"), max_length=40),
        ),
        migrations.AlterField(
            model_name="auditentry",
            name="public_id",
            field=models.CharField(db_default=ledger.models.PublicId("aud_"), max_length=40),
        ),
        migrations.AddConstraint(
            model_name="feedback",
            constraint=models.UniqueConstraint(fields=("public_id",), name="feedback_public_id_unique"),
        ),
        migrations.AddConstraint(
            model_name="auditentry",
            constraint=models.UniqueConstraint(fields=("public_id",), name="audit_public_id_unique"),
        ),
        migrations.RunPython(dbguards.install_audit, dbguards.drop_audit),
    ]
