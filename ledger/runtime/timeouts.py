"""Enforced timeouts: a tool's declared `timeout_s`, a model slot's `timeout_s`.

Python cannot interrupt a running function, so the call runs on a thread of its own and the
executor waits for it at most that long. A call that outlives its timeout is abandoned: the
executor goes on without it (what it returns later is thrown away) and records what that means
for the call — a read tool or a model call failed, retried by its policy; a write tool in doubt,
never retried automatically (docs/design.md §5; toolcalls.py). The abandoned thread is a daemon and
closes its own database connections when the function returns.

The call runs on its own thread only when threads may see the executor's writes (not inside an
atomic block, ledger.runtime.recorder.threads_allowed); inside one it runs inline, unbounded.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import connections

from .recorder import threads_allowed

T = TypeVar("T")


class CallTimedOut(Exception):
    """The call did not return within its timeout (it was abandoned, not stopped)."""

    def __init__(self, what: str, timeout_s: float) -> None:
        super().__init__(f"{what} did not answer within its timeout of {timeout_s:g} s")
        self.timeout_s = timeout_s


def call_with_timeout(fn: Callable[[Any], T], arg: Any, timeout_s: float | None, what: str) -> T:
    """fn(arg), or CallTimedOut once `timeout_s` passed; fn's own exception is raised as it is."""
    if timeout_s is None or not threads_allowed():
        return fn(arg)
    box: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["value"] = fn(arg)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            box["error"] = exc
        finally:
            done.set()
            connections.close_all()  # this thread's own

    context = contextvars.copy_context()
    threading.Thread(target=context.run, args=(run,), name=f"call:{what}", daemon=True).start()
    if not done.wait(timeout_s):
        raise CallTimedOut(what, timeout_s)
    if "error" in box:
        raise box["error"]
    return box["value"]
