"""`manage.py ledger …`: one module per subcommand (docs/api.md, Operations).

Each module names its subcommand (`NAME`, `HELP`), declares its flags (`add_arguments`) and does
the work (`handle(cmd, **options)`, writing to `cmd.stdout` / `cmd.stderr`). The management
command (ledger/management/commands/ledger.py) only dispatches; a new subcommand is a new module
listed in `MODULES`. A LedgerError becomes a CommandError (its message, exit 1).
"""

from __future__ import annotations

MODULES = [
    "bootstrap",
    "create_user",
    "add_member",
    "remove_member",
    "reset_password",
    "disable_user",
    "enable_user",
    "create_key",
    "demo",
    "events",
    "verify",
    "rebuild",
    "reprice",
    "report",
    "replay_plan",
    "run",
    "resume",
    "cancel",
    "reexecute",
    "evaluate",
    "dataset",
    "worker",
    "loop",
    "prune",
    "keys",
    "limits",
    "export",
    "export_evidence",
    "import_little",
    "state",
]
