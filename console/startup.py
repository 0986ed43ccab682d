"""Start-up of every process (manage.py, Daphne through console.asgi): a settings error is one
line on stderr and exit status 2, saying what to set and where it is documented, not a traceback."""

from __future__ import annotations

import sys

SETTINGS_DOC = "docs/operations.md § Settings"
EXIT_SETTINGS = 2  # a usage error, as argparse reports one


def load_settings_or_exit() -> None:
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    try:
        settings.INSTALLED_APPS  # noqa: B018  (reading one setting loads the module, which checks them all)
    except ImproperlyConfigured as exc:
        message = " ".join(str(exc).split())
        if "docs/" not in message:
            message += f" (every setting: {SETTINGS_DOC})"
        print(f"Runledger settings: {message}", file=sys.stderr)
        raise SystemExit(EXIT_SETTINGS) from None
