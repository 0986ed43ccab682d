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

from django.conf import settings
from django.db import migrations, models

# model -> (its foreign key, the model it points to, on_delete, related_name, the name Django gave
# the key's index on both backends)
KEYS = {
    "artifact": ("workspace", "ledger.workspace", models.PROTECT, "artifacts", "ledger_artifact_workspace_id_7e4fd54a"),
    "auditentry": ("tenant", "ledger.tenant", models.PROTECT, "+", "ledger_auditentry_tenant_id_47dae432"),
    "membership": ("user", settings.AUTH_USER_MODEL, models.CASCADE, "memberships",
                   "ledger_membership_user_id_60737acd"),
    "reexecutionrequest": ("workspace", "ledger.workspace", models.PROTECT, "reexecutions",
                           "ledger_reexecutionrequest_workspace_id_85ff1949"),
    "run": ("workspace", "ledger.workspace", models.PROTECT, "runs", "ledger_run_workspace_id_3c90cbb3"),
    "sharelink": ("workspace", "ledger.workspace", models.PROTECT, "share_links",
                  "ledger_sharelink_workspace_id_b16bb868"),
    "workspace": ("tenant", "ledger.tenant", models.PROTECT, "workspaces", "ledger_workspace_tenant_id_17b6c0db"),
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
                    model_name=model,
                    name=name,
                    field=models.ForeignKey(db_index=False, on_delete=on_delete, related_name=related_name, to=to),
                )
                for model, (name, to, on_delete, related_name, _) in KEYS.items()
            ],
            database_operations=[
                migrations.RunSQL(
                    f'DROP INDEX IF EXISTS "{index}"',
                    reverse_sql=f'CREATE INDEX "{index}" ON "ledger_{model}" ("{name}_id")',
                )
                for model, (name, _, _, _, index) in KEYS.items()
            ],
        ),
    ]
