"""Production mode: DEBUG is off unless turned on, and the production environment of
docs/operations.md § Production passes `check --deploy` with no warning and makes a real Daphne
redirect to HTTPS, send HSTS and set only Secure cookies."""

from __future__ import annotations

import os
import runpy
import secrets
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.servers import REPO_ROOT, start_daphne

CHECK_DEPLOY = REPO_ROOT / "bin" / "check-deploy"
HOST = "runledger.example.com"


def _production_environment() -> dict[str, str]:
    return runpy.run_path(str(CHECK_DEPLOY))["production_environment"]()


def _settings_env(**env: str | None) -> dict[str, str]:
    """The environment of a process that imports console/settings.py, not the test settings
    (which turn DEBUG on), with `env` applied (None removes a variable)."""
    environment = {**os.environ, "DJANGO_SETTINGS_MODULE": "console.settings"}
    for name, value in env.items():
        if value is None:
            environment.pop(name, None)
        else:
            environment[name] = value
    return environment


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_debug_is_off_when_a_deployment_sets_only_secret_key() -> None:
    done = _python(
        "import django; django.setup(); from django.conf import settings; print(settings.DEBUG)",
        _settings_env(DEBUG=None, SECRET_KEY="k" + secrets.token_urlsafe(50)),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_without_debug_or_secret_key_settings_refuse_to_load_and_say_how() -> None:
    done = _python("import django; django.setup()", _settings_env(DEBUG=None, SECRET_KEY=None))
    assert done.returncode != 0
    assert "SECRET_KEY must be set when DEBUG is off" in done.stderr and "DEBUG=1" in done.stderr


def test_check_deploy_is_clean_under_the_documented_production_environment() -> None:
    env = _production_environment()
    assert env["DEBUG"] == "0" and env["SESSION_COOKIE_SECURE"] == "1" and int(env["SECURE_HSTS_SECONDS"]) > 0
    done = subprocess.run(
        [sys.executable, str(CHECK_DEPLOY)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout
    assert "drf_spectacular" not in done.stdout + done.stderr


def test_check_deploy_run_as_a_command_goes_on_in_the_virtualenv(tmp_path: Path) -> None:
    """`bin/check-deploy` typed as documented runs under its shebang's python3, outside the
    virtualenv: it used to die on `import django` with a traceback; it goes on in `.venv`."""
    base_python = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    done = subprocess.run(
        [str(base_python), str(CHECK_DEPLOY)],
        cwd=tmp_path,  # from anywhere: it runs manage.py in the repository
        env={k: v for k, v in os.environ.items() if k not in {"DEBUG", "SECRET_KEY", "DJANGO_SETTINGS_MODULE"}},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout


def test_check_deploy_fails_without_the_https_switches() -> None:
    """The check that CI runs can fail: SECRET_KEY and DEBUG=0 alone leave four warnings."""
    env = _settings_env(DEBUG="0", SECRET_KEY=secrets.token_urlsafe(50))
    done = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0
    for warning in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert warning in done.stderr, done.stderr


@pytest.mark.django_db(transaction=True)
def test_forgotten_debug_serves_a_plain_404_not_a_debug_page(tmp_path: Path) -> None:
    daphne = start_daphne(
        tmp_path,
        "no-debug",
        {
            "DEBUG": None,
            "SECRET_KEY": secrets.token_urlsafe(50),
            "DJANGO_SETTINGS_MODULE": "console.settings",
        },
    )
    try:
        response = httpx.get(f"{daphne.url}/no/such/page/", timeout=10)
        assert response.status_code == 404
        assert "DEBUG = True" not in response.text and "URLconf" not in response.text
    finally:
        daphne.stop()


@pytest.mark.django_db(transaction=True)
def test_production_environment_redirects_to_https_and_sets_hsts_and_secure_cookies(tmp_path: Path) -> None:
    env: dict[str, str | None] = {
        **_production_environment(),
        "SECRET_KEY": secrets.token_urlsafe(50),
        "DJANGO_SETTINGS_MODULE": "console.settings",
        "REDIS_URL": os.environ.get("REDIS_URL"),
    }
    env.pop("DATABASE_URL")  # start_daphne serves the test database
    via_proxy = {"Host": HOST, "X-Forwarded-Proto": "https"}
    daphne = start_daphne(tmp_path, "production-env", env, probe_headers=via_proxy)
    try:
        plain = httpx.get(f"{daphne.url}/accounts/login/", headers={"Host": HOST}, timeout=10)
        assert plain.status_code == 301 and plain.headers["location"] == f"https://{HOST}/accounts/login/"
        secure = httpx.get(f"{daphne.url}/accounts/login/", headers=via_proxy, timeout=10)
        assert secure.status_code == 200
        assert secure.headers["strict-transport-security"] == "max-age=31536000; includeSubDomains; preload"
        cookies = secure.headers.get_list("set-cookie")
        assert any(c.startswith("csrftoken=") for c in cookies)
        assert all("; Secure" in c for c in cookies), cookies
        assert (
            httpx.get(f"{daphne.url}/accounts/login/", headers={"Host": "evil.example"}, timeout=10).status_code == 400
        )
    finally:
        daphne.stop()
