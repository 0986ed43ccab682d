"""The gateway's control row keeps its CHECKs, stored in a compact form on PostgreSQL.

PostgreSQL reads every CHECK of a table again on each statement that writes it (the stored tree
parsed, planned and compiled), and an append writes the gateway's row twice a model call: its
claim and its completion. Django states `status IN (...)` as `status = ANY (ARRAY['a'::varchar,
...]::text[])`, a tree of one cast per value; the same condition over a constant array,
`status::text = ANY ('{a,...}'::text[])`, is a half to two thirds of its size (bench/README.md § Floors,
Session 28). The three such checks are replaced by their compact forms under the same names;
the models' constraints are unchanged (the condition is the same), so no state changes.

Each is added NOT VALID and then validated, so the table is not locked against writes while its
rows are checked. SQLite keeps the CHECKs Django made: there they cost nothing worth remaking the
table.
"""

from django.db import migrations

TABLE = "ledger_toolgatewayclaim"

# name -> (compact form, Django's form): each the same condition as the model's constraint.
CHECKS = {
    "gateway_status_known": (
        "status::text = ANY ('{claimed,succeeded,failed,in_doubt}'::text[])",
        "status::text = ANY (ARRAY['claimed'::varchar, 'succeeded'::varchar, 'failed'::varchar, "
        "'in_doubt'::varchar]::text[])",
    ),
    "gateway_effect_known": (
        "effect::text = ANY ('{read,write}'::text[])",
        "effect::text = ANY (ARRAY['read'::varchar, 'write'::varchar]::text[])",
    ),
    "gateway_finished_has_time": (
        "status::text = ANY ('{claimed,in_doubt}'::text[]) OR finished_at IS NOT NULL",
        "status::text = ANY (ARRAY['claimed'::varchar, 'in_doubt'::varchar]::text[]) OR finished_at IS NOT NULL",
    ),
}


def _replace(schema_editor, form: int) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for name, forms in CHECKS.items():
        schema_editor.execute(f"ALTER TABLE {TABLE} DROP CONSTRAINT {name}")
        schema_editor.execute(f"ALTER TABLE {TABLE} ADD CONSTRAINT {name} CHECK ({forms[form]}) NOT VALID")
        schema_editor.execute(f"ALTER TABLE {TABLE} VALIDATE CONSTRAINT {name}")


def compact(apps, schema_editor):
    _replace(schema_editor, 0)


def as_django_wrote_them(apps, schema_editor):
    _replace(schema_editor, 1)


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0050_member_account_disabled"),
    ]

    operations = [migrations.RunPython(compact, as_django_wrote_them)]
