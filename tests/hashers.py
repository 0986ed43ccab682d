"""The test settings' password hasher: Django's PBKDF2-SHA256 at 1,000 iterations, not 1,000,000.

At the default a user costs about 0.25 CPU-s to create and again to log in, and the demo the
browser tests load makes six. The hashes keep PBKDF2's name and record their iterations, so a
server started with the production settings (tests/servers.py `production_env`) checks them with
Django's own hasher, and on the first log-in stores the password again at the default count."""

from __future__ import annotations

from django.contrib.auth.hashers import PBKDF2PasswordHasher


class QuickPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    iterations = 1_000
