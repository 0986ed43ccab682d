"""Static files are served by the console itself with DEBUG off, as with it on (WhiteNoise):
a production Daphne renders the login page and every stylesheet and script it names loads.
Without collectstatic (`make run` with DEBUG=0) under their plain names; after it (`make serve`)
under content-hashed names, compressed, with a far-future immutable cache header."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import httpx
import pytest

from tests.servers import production_env, start_daphne

pytestmark = pytest.mark.backend_independent

ASSET = re.compile(r'(?:href|src)="(/static/[^"]+)"')
HASHED = re.compile(r"\.[0-9a-f]{12}\.(?:css|js|svg)$")
KIND = {"css": "text/css", "js": "javascript", "svg": "image/svg+xml"}


def _assets(url: str) -> list[str]:
    page = httpx.get(f"{url}/accounts/login/", timeout=10)
    assert page.status_code == 200
    assets = ASSET.findall(page.text)
    assert any(a.startswith("/static/css/console.") for a in assets), assets
    assert any(a.startswith("/static/js/local-time.") for a in assets), assets
    assert any(a.startswith("/static/django_htmx/") for a in assets), assets  # {% htmx_script %}
    for asset in assets:
        response = httpx.get(f"{url}{asset}", timeout=10)
        assert response.status_code == 200, asset
        assert KIND[asset.rsplit(".", 1)[1]] in response.headers["content-type"], (asset, response.headers)
        assert response.content
    return assets


@pytest.mark.django_db(transaction=True)
def test_production_daphne_serves_the_pages_static_files_without_collectstatic(tmp_path: Path) -> None:
    daphne = start_daphne(tmp_path, "production", production_env(tmp_path / "never-collected"))
    try:
        assets = _assets(daphne.url)
        assert {"/static/css/console.css", "/static/js/local-time.js"} <= set(assets)
        assert httpx.get(f"{daphne.url}/static/css/absent.css", timeout=10).status_code == 404
    finally:
        daphne.stop()


@pytest.mark.django_db(transaction=True)
def test_collected_static_files_have_hashed_names_compression_and_far_future_caching(
    tmp_path: Path,
    collected_static: Path,
) -> None:
    daphne = start_daphne(tmp_path, "production-collected", production_env(collected_static))
    try:
        assets = _assets(daphne.url)
        assert assets and all(HASHED.search(a) for a in assets), assets
        for asset in assets:
            response = httpx.get(f"{daphne.url}{asset}", headers={"Accept-Encoding": "gzip"}, timeout=10)
            assert response.headers["cache-control"] == "max-age=315360000, public, immutable", asset
            assert response.headers["content-encoding"] == "gzip", asset
            raw = httpx.get(f"{daphne.url}{asset}", headers={"Accept-Encoding": "identity"}, timeout=10)
            assert "content-encoding" not in raw.headers
            assert gzip.decompress(_raw_gzip(daphne.url, asset)) == raw.content
        # The plain name still answers, but may change under the same URL: a short cache only.
        plain = httpx.get(f"{daphne.url}/static/css/console.css", timeout=10)
        assert plain.status_code == 200 and "immutable" not in plain.headers["cache-control"]
    finally:
        daphne.stop()


def _raw_gzip(url: str, asset: str) -> bytes:
    """The gzip body as sent (httpx would decode it)."""
    with httpx.stream("GET", f"{url}{asset}", headers={"Accept-Encoding": "gzip"}, timeout=10) as response:
        return b"".join(response.iter_raw())
