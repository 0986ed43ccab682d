"""Static files are served by the console itself with DEBUG off, as with it on (WhiteNoise):
a production Daphne renders the login page and every stylesheet and script it names loads."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from tests.servers import start_daphne

ASSET = re.compile(r'(?:href|src)="(/static/[^"]+)"')


@pytest.mark.django_db(transaction=True)
def test_production_daphne_serves_the_pages_static_files(tmp_path: Path) -> None:
    daphne = start_daphne(tmp_path, "production", {"DEBUG": "0", "SECRET_KEY": "static-files-test-" + "x" * 40,
                                                   "DJANGO_ALLOW_ASYNC_UNSAFE": None})
    try:
        page = httpx.get(f"{daphne.url}/accounts/login/", timeout=10)
        assert page.status_code == 200
        assets = ASSET.findall(page.text)
        assert {"/static/css/console.css", "/static/js/local-time.js"} <= set(assets)
        assert any(a.startswith("/static/django_htmx/") for a in assets), assets  # {% htmx_script %}
        for asset in assets:
            response = httpx.get(f"{daphne.url}{asset}", timeout=10)
            assert response.status_code == 200, asset
            kind = {"css": "text/css", "js": "javascript", "svg": "image/svg+xml"}[asset.rsplit(".", 1)[1]]
            assert kind in response.headers["content-type"], (asset, response.headers["content-type"])
            assert response.content
        assert httpx.get(f"{daphne.url}/static/css/absent.css", timeout=10).status_code == 404
    finally:
        daphne.stop()
