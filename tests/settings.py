"""The test run's settings: console/settings.py with DEBUG=1, the embedded development setup that
`make run` serves, unless the environment already says otherwise. Set in the environment, not
here, so every server and command a test starts (Daphne, manage.py, the README's shell block)
inherits it; the tests of production mode start theirs with DEBUG=0 or DEBUG unset."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("DEBUG", "1")
# No collected manifest, whatever var/ holds: `make serve` collects the static files into
# var/staticfiles, and that manifest would give a developer's test run hashed file names where the
# tests of `make run` (no collectstatic) expect plain ones. The tests of production mode collect
# into a folder of their own and name it (tests/servers.py production_env).
os.environ.setdefault(
    "RUNLEDGER_STATIC_ROOT",
    str(Path(os.environ.get("RUNLEDGER_VAR_DIR", Path(__file__).resolve().parent.parent / "var")) / "test-no-static"),
)

from console.settings import *  # noqa: E402,F403
from console.settings import CHANNEL_LAYERS  # noqa: E402

# pytest-xdist's workers share one Redis database but each has its own test database, whose runs
# get the same primary keys: a worker's own prefix keeps its groups (and its servers', which
# inherit PYTEST_XDIST_WORKER) apart from the others'.
if "prefix" in CHANNEL_LAYERS["default"].get("CONFIG", {}) and os.environ.get("PYTEST_XDIST_WORKER"):
    CHANNEL_LAYERS["default"]["CONFIG"]["prefix"] += os.environ["PYTEST_XDIST_WORKER"] + "."

# Every process on the test settings (this one, the Daphne servers, the `ledger` commands the tests
# run) hashes passwords quickly; the servers on the production settings keep Django's default.
PASSWORD_HASHERS = ["tests.hashers.QuickPBKDF2PasswordHasher"]
