"""The event log is insert-only in the database too (DESIGN.md §3).

UPDATE of an event is always refused. DELETE is refused unless the event's run has been marked
`pruning` in the same transaction (retention deletes whole runs, never single events).
"""

from django.db import migrations

POSTGRES = """
CREATE OR REPLACE FUNCTION ledger_event_insert_only() RETURNS trigger AS $$
BEGIN
  IF TG_OP = 'UPDATE' THEN
    RAISE EXCEPTION 'ledger_event is insert-only: UPDATE refused';
  END IF;
  IF EXISTS (SELECT 1 FROM ledger_run WHERE id = OLD.run_id AND NOT pruning) THEN
    RAISE EXCEPTION 'ledger_event is insert-only: DELETE refused (retention deletes whole runs)';
  END IF;
  RETURN OLD;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER ledger_event_no_update BEFORE UPDATE ON ledger_event
  FOR EACH ROW EXECUTE FUNCTION ledger_event_insert_only();
CREATE TRIGGER ledger_event_no_delete BEFORE DELETE ON ledger_event
  FOR EACH ROW EXECUTE FUNCTION ledger_event_insert_only();
"""
POSTGRES_REVERSE = """
DROP TRIGGER IF EXISTS ledger_event_no_update ON ledger_event;
DROP TRIGGER IF EXISTS ledger_event_no_delete ON ledger_event;
DROP FUNCTION IF EXISTS ledger_event_insert_only();
"""
SQLITE = [
    """CREATE TRIGGER ledger_event_no_update BEFORE UPDATE ON ledger_event
       BEGIN SELECT RAISE(ABORT, 'ledger_event is insert-only: UPDATE refused'); END;""",
    """CREATE TRIGGER ledger_event_no_delete BEFORE DELETE ON ledger_event
       WHEN EXISTS (SELECT 1 FROM ledger_run WHERE id = OLD.run_id AND NOT pruning)
       BEGIN SELECT RAISE(ABORT, 'ledger_event is insert-only: DELETE refused (retention deletes whole runs)'); END;""",
]
SQLITE_REVERSE = ["DROP TRIGGER IF EXISTS ledger_event_no_update;", "DROP TRIGGER IF EXISTS ledger_event_no_delete;"]


def forwards(apps, schema_editor):
    statements = [POSTGRES] if schema_editor.connection.vendor == "postgresql" else SQLITE
    for sql in statements:
        schema_editor.execute(sql)


def backwards(apps, schema_editor):
    statements = [POSTGRES_REVERSE] if schema_editor.connection.vendor == "postgresql" else SQLITE_REVERSE
    for sql in statements:
        schema_editor.execute(sql)


class Migration(migrations.Migration):
    dependencies = [("ledger", "0001_initial")]
    operations = [migrations.RunPython(forwards, backwards)]
