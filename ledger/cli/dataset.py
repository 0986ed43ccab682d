"""`ledger dataset add|remove|show NAME …`: datasets of recorded runs from the terminal
(docs/evaluations.md). Every change makes the dataset's next frozen version; `show` prints a
version (the latest, or --version) as JSON."""

from __future__ import annotations

import json
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ledger.evaluation import datasets
from ledger.reads import selectors
from ledger.tenancy import access

NAME = "dataset"
HELP = "add runs to a dataset, remove them, or show a version"


def add_arguments(parser: ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="dataset_action", required=True, metavar="add|remove|show")
    for name in ("add", "remove"):
        p = sub.add_parser(name)
        p.add_argument("name")
        p.add_argument("runs", nargs="+")
        p.add_argument("--workspace", required=True, help="TENANT/WORKSPACE")
        p.add_argument("--as", dest="as_user", required=True, help="a member's username (operator+)")
    show = sub.add_parser("show")
    show.add_argument("name")
    show.add_argument("--workspace", required=True, help="TENANT/WORKSPACE")
    show.add_argument("--version", type=int)


def handle(cmd: BaseCommand, *, dataset_action: str, name: str, workspace: str, **options: Any) -> None:
    ws = access.workspace_by_path(workspace)
    if dataset_action == "show":
        version = datasets.get_version(datasets.get_dataset(ws, name), options.get("version"))
        cmd.stdout.write(json.dumps(datasets.version_json(version), indent=2, sort_keys=True))
        return
    user = selectors.user_named(options["as_user"])
    if user is None:
        raise CommandError(f"no user {options['as_user']}")
    if dataset_action == "add":
        added = datasets.add_runs(workspace=ws, name=name, run_ids=options["runs"], by=user)
        version, unchanged = added.version, not added.made
    else:
        version = datasets.remove_runs(workspace=ws, name=name, run_ids=options["runs"], by=user)
        unchanged = False
    runs = f"{len(version.members)} run{'' if len(version.members) == 1 else 's'}"
    held = "; every run named was already in it: no new version" if unchanged else ""
    cmd.stdout.write(f"{name} version {version.number} {version.digest} ({runs}){held}")
