"""axe-core in the page under test: the accessibility check of issue 13 (zero serious or critical
violations on every console page, light and dark). The engine is vendored (vendor/axe-core/,
pinned, hash-checked here), so the check needs no network and cannot drift."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from playwright.sync_api import Page

AXE = Path(__file__).parent / "vendor" / "axe-core" / "axe.min.js"
AXE_SHA256 = "29348999450cdf2849a8e70b7912fc2da85a849da39c0d0d5394f51d4a9ed95c"
BLOCKING = ("serious", "critical")


def _source() -> str:
    data = AXE.read_bytes()
    assert hashlib.sha256(data).hexdigest() == AXE_SHA256, f"{AXE} is not the pinned axe-core 4.14.1"
    return data.decode("utf-8")


def blocking_violations(page: Page) -> list[dict[str, Any]]:
    """The page's serious and critical violations, each with the selectors of its nodes."""
    if not page.evaluate("() => typeof window.axe !== 'undefined'"):
        # Through the DevTools protocol, not a <script> tag: the page's Content-Security-Policy
        # refuses inline scripts (as it should), and the check must run on the page as served.
        cdp = page.context.new_cdp_session(page)
        try:
            answer = cdp.send("Runtime.evaluate", {"expression": _source()})
            assert "exceptionDetails" not in answer, answer
        finally:
            cdp.detach()
    result = page.evaluate("""async () => {
        const found = await axe.run(document, {resultTypes: ["violations"]});
        return found.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,
                                           nodes: v.nodes.map(n => n.target.join(" "))}));
    }""")
    return [v for v in result if v["impact"] in BLOCKING]
