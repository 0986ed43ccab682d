"""`ledger worker`: execute approved re-executions from the queue (django-tasks), sweep expired
approvals and stalled requests."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ledger.reexecution.worker import run_worker

NAME = "worker"
MAX_INTERVAL = 3600.0
HELP = (
    "execute approved re-executions from the queue (django-tasks), sweep expired approvals and stalled requests; "
    "Ctrl-C stops it"
)


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument("--batch", action="store_true", help="exit once the queue is empty")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between looks at an empty queue")


def handle(cmd: BaseCommand, *, batch: bool, interval: float, **_: Any) -> None:
    if not 0 <= interval <= MAX_INTERVAL:  # NaN too: time.sleep refuses it, a traceback at the first empty queue
        raise CommandError(f"--interval must be a number of seconds from 0 to {MAX_INTERVAL:g}, got {interval:g}")
    run_worker(interval=interval, batch=batch)
