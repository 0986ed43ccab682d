"""Database triggers that keep the event log insert-only (docs/design.md §3).

UPDATE of an event is always refused. DELETE is refused unless the event's run has been marked
`pruning` in the same transaction (retention deletes whole runs, never single events).

SQLite rebuilds a table to alter it, which drops its triggers and trips over triggers that name
it, so a migration that alters ledger_event or ledger_run runs `drop` first and `install` last.
tests/test_insert_only.py fails if the triggers are ever missing.
"""

from __future__ import annotations

from typing import Any

POSTGRES_INSTALL = """
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
DROP TRIGGER IF EXISTS ledger_event_no_update ON ledger_event;
DROP TRIGGER IF EXISTS ledger_event_no_delete ON ledger_event;
CREATE TRIGGER ledger_event_no_update BEFORE UPDATE ON ledger_event
  FOR EACH ROW EXECUTE FUNCTION ledger_event_insert_only();
CREATE TRIGGER ledger_event_no_delete BEFORE DELETE ON ledger_event
  FOR EACH ROW EXECUTE FUNCTION ledger_event_insert_only();
"""
POSTGRES_DROP = """
DROP TRIGGER IF EXISTS ledger_event_no_update ON ledger_event;
DROP TRIGGER IF EXISTS ledger_event_no_delete ON ledger_event;
DROP FUNCTION IF EXISTS ledger_event_insert_only();
"""
SQLITE_INSTALL = [
    "DROP TRIGGER IF EXISTS ledger_event_no_update;",
    "DROP TRIGGER IF EXISTS ledger_event_no_delete;",
    """CREATE TRIGGER ledger_event_no_update BEFORE UPDATE ON ledger_event
       BEGIN SELECT RAISE(ABORT, 'ledger_event is insert-only: UPDATE refused'); END;""",
    """CREATE TRIGGER ledger_event_no_delete BEFORE DELETE ON ledger_event
       WHEN EXISTS (SELECT 1 FROM ledger_run WHERE id = OLD.run_id AND NOT pruning)
       BEGIN SELECT RAISE(ABORT, 'ledger_event is insert-only: DELETE refused (retention deletes whole runs)'); END;""",
]
SQLITE_DROP = ["DROP TRIGGER IF EXISTS ledger_event_no_update;", "DROP TRIGGER IF EXISTS ledger_event_no_delete;"]


def install(apps: Any, schema_editor: Any) -> None:
    for sql in [POSTGRES_INSTALL] if schema_editor.connection.vendor == "postgresql" else SQLITE_INSTALL:
        schema_editor.execute(sql)


def drop(apps: Any, schema_editor: Any) -> None:
    for sql in [POSTGRES_DROP] if schema_editor.connection.vendor == "postgresql" else SQLITE_DROP:
        schema_editor.execute(sql)


# The audit log (ledger_auditentry) refuses UPDATE and DELETE outright: nothing in the product
# deletes audit entries. (PostgreSQL's TRUNCATE fires no row triggers; it is how the test
# database is emptied, and it needs the table owner.)
AUDIT_POSTGRES_INSTALL = """
CREATE OR REPLACE FUNCTION ledger_audit_append_only() RETURNS trigger AS $$
BEGIN
  RAISE EXCEPTION USING MESSAGE = 'ledger_auditentry is append-only: ' || TG_OP || ' refused';
END;
$$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS ledger_audit_no_update ON ledger_auditentry;
DROP TRIGGER IF EXISTS ledger_audit_no_delete ON ledger_auditentry;
CREATE TRIGGER ledger_audit_no_update BEFORE UPDATE ON ledger_auditentry
  FOR EACH ROW EXECUTE FUNCTION ledger_audit_append_only();
CREATE TRIGGER ledger_audit_no_delete BEFORE DELETE ON ledger_auditentry
  FOR EACH ROW EXECUTE FUNCTION ledger_audit_append_only();
"""
AUDIT_POSTGRES_DROP = """
DROP TRIGGER IF EXISTS ledger_audit_no_update ON ledger_auditentry;
DROP TRIGGER IF EXISTS ledger_audit_no_delete ON ledger_auditentry;
DROP FUNCTION IF EXISTS ledger_audit_append_only();
"""
AUDIT_SQLITE_DROP = ["DROP TRIGGER IF EXISTS ledger_audit_no_update;", "DROP TRIGGER IF EXISTS ledger_audit_no_delete;"]
AUDIT_SQLITE_INSTALL = [
    *AUDIT_SQLITE_DROP,
    """CREATE TRIGGER ledger_audit_no_update BEFORE UPDATE ON ledger_auditentry
       BEGIN SELECT RAISE(ABORT, 'ledger_auditentry is append-only: UPDATE refused'); END;""",
    """CREATE TRIGGER ledger_audit_no_delete BEFORE DELETE ON ledger_auditentry
       BEGIN SELECT RAISE(ABORT, 'ledger_auditentry is append-only: DELETE refused'); END;""",
]


def install_audit(apps: Any, schema_editor: Any) -> None:
    postgres = schema_editor.connection.vendor == "postgresql"
    for sql in [AUDIT_POSTGRES_INSTALL] if postgres else AUDIT_SQLITE_INSTALL:
        schema_editor.execute(sql)


def drop_audit(apps: Any, schema_editor: Any) -> None:
    postgres = schema_editor.connection.vendor == "postgresql"
    for sql in [AUDIT_POSTGRES_DROP] if postgres else AUDIT_SQLITE_DROP:
        schema_editor.execute(sql)
