# The run page's jumps to a run's first failure and first in-doubt tool call read these partial indexes
# instead of every event of the run. On PostgreSQL it is built CONCURRENTLY: the event table is the
# largest, and a plain CREATE INDEX would hold every append for the length of its scan.

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class AddIndexConcurrentlyOnPostgres(AddIndexConcurrently):
    """CREATE INDEX CONCURRENTLY on PostgreSQL; a plain CREATE INDEX elsewhere (SQLite)."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            return super().database_forwards(app_label, schema_editor, from_state, to_state)
        return migrations.AddIndex.database_forwards(self, app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            return super().database_backwards(app_label, schema_editor, from_state, to_state)
        return migrations.AddIndex.database_backwards(self, app_label, schema_editor, from_state, to_state)


class Migration(migrations.Migration):
    atomic = False  # CONCURRENTLY cannot run inside a transaction

    dependencies = [
        ('ledger', '0041_reprice_requests'),
    ]

    operations = [
        AddIndexConcurrentlyOnPostgres(
            model_name='event',
            index=models.Index(condition=models.Q(('type__endswith', 'Failed'), ('type__endswith', '.failed'), _connector='OR'), fields=['run', 'sequence'], name='event_failures'),
        ),
        AddIndexConcurrentlyOnPostgres(
            model_name='event',
            index=models.Index(condition=models.Q(('type', 'harness.tool_call.in_doubt')), fields=['run', 'sequence'], name='event_in_doubt'),
        ),
    ]
