"""Seven foreign keys lose the index Django gave each of them, because another index of the table
leads with the same column and serves the key's lookups and cascades as well: the run's workspace
(the unique (workspace, run_id) constraint, `run_children`, `run_newest_first`), the artifact's
workspace (unique (workspace, sha256)), the re-execution request's and the share link's workspace
(their (workspace, …) indexes), the audit entry's tenant (`audit_by_time`, `audit_by_action`), the
workspace's tenant (unique (tenant, slug)) and the membership's user (unique (user, tenant)).
Each such index was one more B-tree every insert wrote, and a second path the planner could take
for a range read and then filter (migration 0022 found the daily usage rollup's doing that at 10
million events). tests/test_indexes.py keeps it so: no index on a column that leads another index.
Only the indexes go: an AlterField would remake each table on SQLite and drop the insert-only
triggers of the audit log.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

# table -> (the name Django gave the index on both backends, its column)
INDEXES = {
    "ledger_artifact": ("ledger_artifact_workspace_id_7e4fd54a", "workspace_id"),
    "ledger_auditentry": ("ledger_auditentry_tenant_id_47dae432", "tenant_id"),
    "ledger_membership": ("ledger_membership_user_id_60737acd", "user_id"),
    "ledger_reexecutionrequest": ("ledger_reexecutionrequest_workspace_id_85ff1949", "workspace_id"),
    "ledger_run": ("ledger_run_workspace_id_3c90cbb3", "workspace_id"),
    "ledger_sharelink": ("ledger_sharelink_workspace_id_b16bb868", "workspace_id"),
    "ledger_workspace": ("ledger_workspace_tenant_id_17b6c0db", "tenant_id"),
}


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0022_daily_usage_without_workspace_index'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='artifact',
                    name='workspace',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='artifacts', to='ledger.workspace'),
                ),
                migrations.AlterField(
                    model_name='auditentry',
                    name='tenant',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='ledger.tenant'),
                ),
                migrations.AlterField(
                    model_name='membership',
                    name='user',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='memberships', to=settings.AUTH_USER_MODEL),
                ),
                migrations.AlterField(
                    model_name='reexecutionrequest',
                    name='workspace',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='reexecutions', to='ledger.workspace'),
                ),
                migrations.AlterField(
                    model_name='run',
                    name='workspace',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='runs', to='ledger.workspace'),
                ),
                migrations.AlterField(
                    model_name='sharelink',
                    name='workspace',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='share_links', to='ledger.workspace'),
                ),
                migrations.AlterField(
                    model_name='workspace',
                    name='tenant',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='workspaces', to='ledger.tenant'),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    f'DROP INDEX IF EXISTS "{index}"',
                    reverse_sql=f'CREATE INDEX "{index}" ON "{table}" ("{column}")',
                )
                for table, (index, column) in INDEXES.items()
            ],
        ),
    ]
