"""The demo: tenants, members and runs for a newcomer's first look (`ledger demo`, run by `make run`).

- data.py: what `ledger demo` lays out (idempotent), through the one write path and the runtime;
- reexecution.py: its re-executions in every state, through the re-execution services and worker;
- workflows.py: the workflows it executes, registered through the RUNLEDGER_WORKFLOW_MODULES
  setting (whose default names it), never imported by the runtime.
"""

from __future__ import annotations

from .data import DEMO_PASSWORD, DEMO_RUNS, HISTORY_RUNS, load_demo

__all__ = ["DEMO_PASSWORD", "DEMO_RUNS", "HISTORY_RUNS", "load_demo"]
