#!/usr/bin/env python
from __future__ import annotations

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    from django.core.management import execute_from_command_line

    from console.startup import load_settings_or_exit

    load_settings_or_exit()

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
