from __future__ import annotations

from django.apps import AppConfig


class ReexecutionConfig(AppConfig):
    """The re-execution package as an app of its own, for the hook it hangs on the log."""

    name = "ledger.reexecution"
    label = "ledger_reexecution"

    def ready(self) -> None:
        from ..log import hooks
        from .execution import settle_on_terminal

        # A request whose new run ends follows the run's outcome, in the append's transaction.
        hooks.on_run_ended(settle_on_terminal)
