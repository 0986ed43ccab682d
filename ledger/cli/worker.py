"""`ledger worker`: execute approved re-executions from the queue (django-tasks), sweep expired
approvals and stalled requests."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand

from ledger.reexecution.worker import run_worker

NAME = "worker"
HELP = (
    "execute approved re-executions from the queue (django-tasks), sweep expired approvals and stalled requests; "
    "Ctrl-C stops it"
)


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument("--batch", action="store_true", help="exit once the queue is empty")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between looks at an empty queue")


def handle(cmd: BaseCommand, *, batch: bool, interval: float, **_: Any) -> None:
    run_worker(interval=interval, batch=batch)
