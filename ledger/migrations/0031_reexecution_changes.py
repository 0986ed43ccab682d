"""ReexecutionRequest.prompt_overrides, .workflow and .workflow_version: the kinds of change an
evaluation makes beyond a model mapping (docs/evaluations.md "Changes")."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("ledger", "0030_run_started_by")]

    operations = [
        migrations.AddField(
            model_name="reexecutionrequest",
            name="prompt_overrides",
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.AddField(
            model_name="reexecutionrequest",
            name="workflow",
            field=models.CharField(blank=True, max_length=200),
        ),
        migrations.AddField(
            model_name="reexecutionrequest",
            name="workflow_version",
            field=models.CharField(blank=True, max_length=100),
        ),
    ]
