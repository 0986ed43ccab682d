"""README's examples as the tests run them: a fenced block of a section, taken as written, and the
environment of a user who chose another port (`make run PORT=N`, then `export PORT=N`)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlsplit

README = Path(__file__).resolve().parent.parent / "README.md"
# The one way an example names the console (README "Two commands").
URL_LINE = "RUNLEDGER_URL=http://127.0.0.1:${PORT:-8000}"


def blocks(section: str, language: str) -> list[str]:
    """The `language` blocks under `## section`, up to the next `## ` heading."""
    text = README.read_text().split(f"## {section}\n", 1)[1]
    body = re.split(r"^## ", text, maxsplit=1, flags=re.M)[0]
    found = re.findall(rf"^```{language}\n(.*?)^```", body, re.S | re.M)
    assert found, f"README has no {language} block under '{section}'"
    return found


def block(section: str, language: str = "sh") -> str:
    return blocks(section, language)[0]


def on_port(url: str, environment: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a terminal where `export PORT=<url's port>` was typed, and nothing says
    where the console is but that."""
    env = dict(os.environ if environment is None else environment)
    env.pop("RUNLEDGER_URL", None)
    parts = urlsplit(url)
    assert parts.hostname == "127.0.0.1" and parts.port not in (None, 8000), url
    env["PORT"] = str(parts.port)
    return env
