"""The time the control services (the tool gateway's leases) read.

One function, so that tests move time forward by patching it instead of sleeping. The event log's
`recordedAt` is not taken from here: it is the moment of the write, whatever a test pretends.
"""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone


def now() -> datetime:
    return timezone.now()
