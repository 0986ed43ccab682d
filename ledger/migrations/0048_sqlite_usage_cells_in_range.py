# The usage rollup cells (DailyUsage, MonthlyUsage) refuse a sum past their columns on SQLite as
# PostgreSQL's do. PostgreSQL's numeric(24, 12) and bigint columns fail the statement (22003); SQLite
# keeps whatever it is given: a cost past $10^12 as a float the usage page could not read back (a
# 500), an integer past 2^63-1 as a float. These triggers abort the write instead, with the name of
# PostgreSQL's condition, which ledger.log.usage_too_large turns into the append's 400.

from django.db import migrations

TABLES = {"daily": "ledger_dailyusage", "monthly": "ledger_monthlyusage"}
COUNTS = ("input_tokens", "output_tokens", "cached_input_tokens", "reasoning_tokens", "calls", "priced_calls")
MONEY_LIMIT = "1000000000000"  # numeric(24, 12): twelve digits before the point
MESSAGE = "numeric_value_out_of_range: a usage cell past its columns"


def _past(row: str) -> str:
    counts = [f"{row}.{c} > 9223372036854775807 OR {row}.{c} < -9223372036854775808" for c in COUNTS]
    return " OR ".join([f"{row}.cost_usd >= {MONEY_LIMIT} OR {row}.cost_usd <= -{MONEY_LIMIT}", *counts])


def _name(table: str, op: str) -> str:
    return f"ledger_{table}_usage_in_range_{op}"


SQLITE = [
    f"CREATE TRIGGER {_name(table, op)} AFTER {op.upper()} ON {name} WHEN {_past('NEW')} "
    f"BEGIN SELECT RAISE(ABORT, '{MESSAGE}'); END"
    for table, name in TABLES.items()
    for op in ("insert", "update")
]
SQLITE_DROP = [f"DROP TRIGGER IF EXISTS {_name(table, op)}" for table in TABLES for op in ("insert", "update")]


def create_triggers(apps, schema_editor):
    if schema_editor.connection.vendor != "sqlite":
        return  # PostgreSQL's columns refuse such a sum themselves
    with schema_editor.connection.cursor() as cursor:
        for statement in SQLITE:
            cursor.execute(statement)


def drop_triggers(apps, schema_editor):
    if schema_editor.connection.vendor != "sqlite":
        return
    with schema_editor.connection.cursor() as cursor:
        for statement in SQLITE_DROP:
            cursor.execute(statement)


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0047_tool_call_position_index'),
    ]

    operations = [migrations.RunPython(create_triggers, drop_triggers)]
