"""Runledger settings: one file, driven by environment variables.

With nothing set it runs on SQLite under var/ with the in-memory channel layer, so one can just
check out the code and it works. DATABASE_URL (PostgreSQL) and REDIS_URL (channels_redis) switch
to the production parts; nothing exists only in production.
"""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


def _env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    if raw.lower() in {"1", "true", "yes", "on"}:
        return True
    if raw.lower() in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (1/0, true/false), got {raw!r}")


def _env_seconds(name: str, default: float, maximum: float, unit: str = "seconds") -> float:
    raw = os.environ.get(name)
    try:
        value = default if raw is None else float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number of {unit}, got {raw!r}") from None
    if not 0 < value <= maximum:
        raise ImproperlyConfigured(f"{name} must be above 0 and at most {maximum}, got {raw!r}")
    return value


def _env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    return default if raw is None else [item.strip() for item in raw.split(",") if item.strip()]


def _env_int(name: str, default: int, minimum: int = 0, maximum: int | None = None) -> int:
    raw = os.environ.get(name)
    try:
        value = default if raw is None else int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a whole number, got {raw!r}") from None
    if maximum is not None and not minimum <= value <= maximum:
        raise ImproperlyConfigured(f"{name} must be from {minimum} to {maximum}, got {raw!r}")
    if value < minimum:
        raise ImproperlyConfigured(f"{name} must be {minimum} or more, got {raw!r}")
    return value


def _env_proxy_header(name: str) -> tuple[str, str] | None:
    """`X-Forwarded-Proto: https` -> ("HTTP_X_FORWARDED_PROTO", "https"), Django's form."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    header, sep, value = raw.partition(":")
    if not sep or not header.strip() or not value.strip():
        raise ImproperlyConfigured(
            f"{name} must be 'Header-Name: value' (e.g. 'X-Forwarded-Proto: https'), got {raw!r}"
        )
    return "HTTP_" + header.strip().upper().replace("-", "_"), value.strip()


# Off unless turned on: a deployment that forgets DEBUG must never serve debug pages with
# tracebacks. `make run` (and the test settings) turn it on for the embedded development setup.
DEBUG = _env_bool("DEBUG", False)
SECRET_KEY = os.environ.get("SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured(
            "SECRET_KEY must be set when DEBUG is off (DEBUG is off unless DEBUG=1; `make run` sets "
            "DEBUG=1 for development; production: docs/operations.md § Production)"
        )
    SECRET_KEY = "runledger-insecure-development-key-set-SECRET_KEY-in-production"
# Keys SECRET_KEY replaced, still accepted for what they signed or sealed (sessions, the list
# cursors of console/cursors.py) until they are removed: docs/operations.md § Rotating SECRET_KEY.
SECRET_KEY_FALLBACKS = _env_list("SECRET_KEY_FALLBACKS", [])
ALLOWED_HOSTS = _env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "testserver"])
CSRF_TRUSTED_ORIGINS = _env_list("CSRF_TRUSTED_ORIGINS", [])
# A stale token (logged in again in another tab) is the console's styled 403, leading back to the form.
CSRF_FAILURE_VIEW = "console.pages.errors.csrf_failure"

# HTTPS switches (docs/operations.md § Production). Off by default, since `make run` serves plain
# http://127.0.0.1; the production environment turns every one on (`bin/check-deploy` holds it to
# `check --deploy` with no warning).
SESSION_COOKIE_SECURE = _env_bool("SESSION_COOKIE_SECURE", False)
CSRF_COOKIE_SECURE = _env_bool("CSRF_COOKIE_SECURE", False)
SECURE_SSL_REDIRECT = _env_bool("SECURE_SSL_REDIRECT", False)
SECURE_HSTS_SECONDS = _env_int("SECURE_HSTS_SECONDS", 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = _env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = _env_bool("SECURE_HSTS_PRELOAD", False)
# Behind a TLS-terminating proxy: the header it sets on requests that came in over HTTPS. Only set
# it when the proxy always sets (or strips) that header, or a client could claim HTTPS.
SECURE_PROXY_SSL_HEADER = _env_proxy_header("SECURE_PROXY_SSL_HEADER")

VAR_DIR = Path(os.environ.get("RUNLEDGER_VAR_DIR", BASE_DIR / "var"))
VAR_DIR.mkdir(parents=True, exist_ok=True)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.forms",  # its widget templates, which templates/django/forms/ overrides (FORM_RENDERER)
    "channels",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "csp",
    "axes",
    "django_htmx",
    "django_tasks",
    "django_tasks_db",
    "ledger",
    "ledger.reexecution.apps.ReexecutionConfig",
    "ledger.evaluation.apps.EvaluationConfig",
    "console",
]

MIDDLEWARE = [
    "console.api.errors.ApiErrorMiddleware",
    "console.input_limits.InputLimitsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "csp.middleware.CSPMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "console.htmx_login.HtmxLoginRedirectMiddleware",
    # A method an address does not take: the console's 405 page, not Django's empty answer.
    "console.pages.errors.MethodNotAllowedMiddleware",
    # Last, as django-axes asks: it turns a locked-out login into the lockout page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "console.urls"
ASGI_APPLICATION = "console.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
            # In every template without a {% load %}: shown_name, shown_text, shown_data,
            # shown_attr and kept_value, what a name or text a client or member wrote goes through
            # on its way into a page (docs/security.md § Limits, "names in a run's log"); and console_rows, the
            # tags of the long tables whose rows console/rows.py draws in Python.
            "builtins": ["console.templatetags.console_format", "console.templatetags.console_rows"],
        },
    },
]

# Form widgets render with the engine above, so that templates/django/forms/widgets/ (an input's
# value, an option's label: what a URL or a member typed can hold a hidden character) use its filters.
FORM_RENDERER = "django.forms.renderers.TemplatesSetting"

_SQLITE_DEFAULT = f"sqlite:///{VAR_DIR / 'runledger.sqlite3'}"
try:
    DATABASES = {"default": dj_database_url.parse(os.environ.get("DATABASE_URL", _SQLITE_DEFAULT))}
except ValueError:  # an unknown scheme; the message names only the scheme, never the URL's password
    _scheme = os.environ["DATABASE_URL"].partition(":")[0]
    raise ImproperlyConfigured(
        f"DATABASE_URL must be sqlite:///PATH or postgres://USER@HOST:PORT/NAME, got scheme {_scheme!r}"
    ) from None
_engine = DATABASES["default"]["ENGINE"]
# Test databases are named per test session (inherited by subprocesses through the environment),
# so two test runs on one machine never create or drop each other's database.
_TEST_DB_TAG = os.environ.setdefault("RUNLEDGER_TEST_DB_TAG", str(os.getpid()))
if _engine == "django.db.backends.sqlite3":
    DATABASES["default"]["OPTIONS"] = {
        # IMMEDIATE takes the write lock when a transaction starts, so concurrent appenders queue
        # on the busy timeout instead of failing to upgrade a read lock (SQLite has no row locks).
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    # A file, not :memory:, so that threads (and a Daphne subprocess) share the test database.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / f"test-{_TEST_DB_TAG}.sqlite3")}
elif _engine == "django.db.backends.postgresql":
    # Daphne serves each request on a thread that earlier requests ran on (console/asgi_handler.py),
    # so a connection kept between requests is used again: opening one per request (and preparing
    # the append's statements again on it) was the largest part of serving a batch append over HTTP
    # (bench/README.md). Checked before its first use in each request (CONN_HEALTH_CHECKS), so a
    # restarted PostgreSQL costs a reconnect, not an error. RUNLEDGER_CONN_MAX_AGE=0: one per request.
    DATABASES["default"]["CONN_MAX_AGE"] = _env_int("RUNLEDGER_CONN_MAX_AGE", 60, minimum=0)
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
    # Server-side parameter binding: psycopg sends parameters apart from the SQL instead of
    # quoting them into it in Python, which dominated batched appends (bench/ingest.py --profile).
    DATABASES["default"]["OPTIONS"] = {"server_side_binding": True}
    DATABASES["default"]["TEST"] = {"NAME": f"test_{DATABASES['default']['NAME']}_{_TEST_DB_TAG}"}
else:
    raise ImproperlyConfigured(f"DATABASE_URL must be sqlite or postgresql, got engine {_engine}")

REDIS_URL = os.environ.get("REDIS_URL", "")


def _redis_db(url: str) -> int:
    from redis.connection import parse_url

    try:
        return int(parse_url(url).get("db", 0))
    except ValueError as exc:
        raise ImproperlyConfigured(f"REDIS_URL: {exc}") from exc


if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            # channels_redis's pub/sub layer (ledger/log/announce.py says what it adds): a group
            # message is one PUBLISH to the processes listening at that moment, where the default
            # channels_redis layer spends two commands looking the group up before pushing to each
            # member's list. Announcements are lossy by design, and so is pub/sub (docs/scaling.md).
            "BACKEND": "ledger.log.announce.RedisPubSubLayer",
            # Bounds how long a Redis that stops answering holds a command (the layer's own reads
            # wait 0.1 s at a time); a connection refused fails at once and is retried later.
            "CONFIG": {
                "hosts": [{"address": REDIS_URL, "socket_timeout": 15, "socket_connect_timeout": 5}],
                # Pub/sub channels are one namespace per Redis server, whatever the database number:
                # the prefix carries it, so deployments (or test runs) on one server do not hear
                # each other's groups.
                "prefix": f"asgi.db{_redis_db(REDIS_URL)}.",
            },
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# Counters of the per-key rate limits (console/api/ratelimit.py): in Redis when REDIS_URL is set, so
# every process of the deployment counts together; else in this process's memory.
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "limits": (
        {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL, "KEY_PREFIX": "limits"}
        if REDIS_URL
        else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "limits"}
    ),
}

# Server-sent event streams (console/api/stream.py). Announcements are lossy, so a stream reads the
# database itself after POLL seconds without one; docs/api.md promises a keepalive at least every 15 s.
LEDGER_STREAM_POLL_SECONDS = _env_seconds("LEDGER_STREAM_POLL_SECONDS", 1.0, 60.0)
LEDGER_STREAM_KEEPALIVE_SECONDS = _env_seconds("LEDGER_STREAM_KEEPALIVE_SECONDS", 15.0, 15.0)
# Streams (SSE and the console's WebSockets) re-check their caller's credentials at least every
# keepalive and end when they are gone; one caller (an API key, or a user) holds at most this many
# open at once per process (console/streams.py, docs/security.md).
LEDGER_STREAM_MAX_PER_CALLER = _env_int("LEDGER_STREAM_MAX_PER_CALLER", 20, 1, 10_000)
# One run holds at most this many events (its ending is always accepted): past it, an append is 413
# run_too_large (ledger/limits.py, docs/security.md "Size limits").
LEDGER_MAX_EVENTS_PER_RUN = _env_int("LEDGER_MAX_EVENTS_PER_RUN", 50_000, 1, 10_000_000)
# One run holds at most this many bytes of stored canonical event payload (its ending is always
# accepted): past it, an append is 413 run_too_large with details.which "bytes" (ledger/limits.py).
LEDGER_MAX_BYTES_PER_RUN = _env_int("LEDGER_MAX_BYTES_PER_RUN", 256 * 1024 * 1024, 1024, 2**50)
# One API key appends at most this many events per minute (UTC clock minute): past it, 429
# rate_limited with Retry-After (console/api/ratelimit.py, docs/security.md "Size limits").
LEDGER_MAX_EVENTS_PER_MINUTE_PER_KEY = _env_int("LEDGER_MAX_EVENTS_PER_MINUTE_PER_KEY", 30_000, 1, 10_000_000)
# One caller (an API key, or a user) has at most this many evidence requests in flight at once per
# process: the next is 429 rate_limited (console/api/evidence.py, docs/security.md "Input limits").
LEDGER_EVIDENCE_MAX_IN_FLIGHT_PER_CALLER = _env_int("LEDGER_EVIDENCE_MAX_IN_FLIGHT_PER_CALLER", 2, 1, 1000)
# One share link (its token, sub-runs included) has at most this many evidence.json requests in
# flight at once per process: the next is 429 rate_limited (console/pages/share.py).
LEDGER_SHARE_EVIDENCE_MAX_IN_FLIGHT_PER_LINK = _env_int("LEDGER_SHARE_EVIDENCE_MAX_IN_FLIGHT_PER_LINK", 2, 1, 1000)

# Every password set through ledger.tenancy.services.create_user (`ledger create-user`, the demo) passes these.
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

# Login throttling (django-axes): after AXES_FAILURE_LIMIT failed logins for one username from one
# client address, that pair is refused (429, the login page saying so) for AXES_COOLOFF_TIME hours;
# other users, and the same user elsewhere, are not. Failures are kept in the database (axes'
# tables), so every Daphne process counts the same ones. A success clears the pair's failures.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = _env_int("AXES_FAILURE_LIMIT", 5)
if AXES_FAILURE_LIMIT < 1:
    raise ImproperlyConfigured(f"AXES_FAILURE_LIMIT must be 1 or more, got {AXES_FAILURE_LIMIT}")
AXES_COOLOFF_TIME = _env_seconds("AXES_COOLOFF_TIME", 0.25, 24.0 * 30, unit="hours")
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
# Behind proxies, the client's address is in X-Forwarded-For, RUNLEDGER_TRUSTED_PROXIES hops from
# the right (each proxy appends the address it saw); 0 (the default) uses the peer address.
RUNLEDGER_TRUSTED_PROXIES = _env_int("RUNLEDGER_TRUSTED_PROXIES", 0)
AXES_CLIENT_IP_CALLABLE = "console.login.client_ip"
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(os.environ.get("RUNLEDGER_STATIC_ROOT", VAR_DIR / "staticfiles"))
# WhiteNoise serves static files with DEBUG on or off (Daphne serves none itself). It finds them
# where runserver would (STATICFILES_DIRS, app static/), so `make run` and the tests need no
# collectstatic step. Production (`make serve`) runs collectstatic: WhiteNoise's storage writes
# each file under a content-hashed name, compressed beside it, and with DEBUG off the pages name
# those, which WhiteNoise serves with a far-future `immutable` cache header
# (console/staticfiles.py: without a collected manifest the plain names are used instead).
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "console.staticfiles.StaticStorage"},
}
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

# Content-Security-Policy (django-csp) on every response: scripts and styles only from our own
# static files (no inline script, style element or style attribute, no eval: templates keep their
# numbers in data-* attributes that static/js applies), connections only to our own origin (CSP3's
# 'self' includes ws:/wss: of the same host, which the live pages use), never framed.
# docs/security.md § Production; tests/browser/test_production_console.py fails on any violation.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        # Swagger UI's stylesheet draws its icons as data: SVG images.
        "img-src": ["'self'", "data:"],
        "connect-src": ["'self'"],
        "font-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'none'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    },
}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# docs/api.md: request bodies over 10 MiB are refused with 413 (console.input_limits: the declared length,
# and the bytes counted as they arrive for bodies that declare none; this is Django's own backstop).
DATA_UPLOAD_MAX_MEMORY_SIZE = 10 * 1024 * 1024

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "console.api.auth.ApiKeyAuthentication",
        "console.api.auth.CsrfSessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["console.api.permissions.Authenticated"],
    # DRF's JSON parser and renderer, through orjson where it gives the same result (console/api/fastjson.py).
    "DEFAULT_RENDERER_CLASSES": ["console.api.fastjson.JsonRenderer"],
    "DEFAULT_PARSER_CLASSES": ["console.api.fastjson.JsonParser"],
    # An unknown ?format= is 400 invalid_parameter on every view (DRF's own answers 404).
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "console.api.negotiation.Negotiation",
    "EXCEPTION_HANDLER": "console.api.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Runledger API",
    "DESCRIPTION": (
        "The evidence ledger and replay console for AI-agent runs (see docs/api.md).\n\n"
        "Input limits (every endpoint; docs/security.md): request bodies up to 10 MiB however they are "
        "framed (413 `payload_too_large`); JSON nested at most 64 levels of arrays and objects, counted over "
        "the whole body and refused before parsing (400 `invalid_event` for appends, `invalid_request` "
        "elsewhere); no NUL character (U+0000) in any JSON string or key, query parameter or path (400 "
        "`invalid_event`, `invalid_request` or `invalid_parameter`); days from 1900-01-01 to 9998-12-31; "
        "integer parameters and cursors within a signed 64-bit integer; ids match their pattern whole.\n\n"
        "An operation may also answer 406 `not_acceptable` (an `Accept` no representation satisfies, where it "
        "says so; a range weighted `q=0` refuses what it names, the most specific range deciding); one that takes a body 413 `payload_too_large` and 415 `unsupported_media_type`; an unsafe "
        "method from a "
        "console session without the CSRF header 403 `forbidden`. A method a path does not list is 405 "
        "`method_not_allowed`, with the error body."
    ),
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # Swagger UI at /api/docs/ from our own static files (drf-spectacular-sidecar), no CDN; its
    # init script is a file of its own (SpectacularSwaggerSplitView) for the CSP, and the online
    # validator badge (an image from another host) is off.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "SWAGGER_UI_SETTINGS": {"deepLinking": True, "validatorUrl": None},
    # The SSE stream is a plain Django view; its hook describes it.
    "ENUM_NAME_OVERRIDES": {
        "ReexecutionModeEnum": "console.api.reexecutions.MODES",
        "ReexecutionStatusEnum": "console.api.reexecutions.STATUSES",
        "ToolCallOutcomeEnum": "console.api.gateway.TOOL_CALL_OUTCOMES",
    },
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "console.api.stream.openapi_hook",
        # Last: what every operation answers (406, 413, 415, CSRF's 403) and camelCase path parameters.
        "console.api.schema.conventions_hook",
    ],
}

# Re-execution (ledger/reexecution): approved requests go onto a durable queue in the database
# (django-tasks with its database backend), worked by `manage.py ledger worker` (make run starts
# one beside Daphne). Tests that want a request executed inline switch to the immediate backend.
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default", "reexecutions", "reprices"]}}
RUNLEDGER_APPROVAL_TTL_HOURS = _env_seconds("RUNLEDGER_APPROVAL_TTL_HOURS", 24.0, 24.0 * 365, unit="hours")
# A worker (or external executor) holding a request renews its lease; one not renewed for this long
# is taken as dead and the request is handed out again, resuming the same new run.
RUNLEDGER_REEXEC_LEASE_SECONDS = _env_seconds("RUNLEDGER_REEXEC_LEASE_SECONDS", 120.0, 86_400.0)

# The runtime (ledger/runtime): the modules that register() workflows, imported before a workflow
# is looked up. The demo's workflows are always among them; RUNLEDGER_WORKFLOW_MODULES
# (comma-separated) adds more. The runtime itself imports none of them.
RUNLEDGER_WORKFLOW_MODULES = ["ledger.demo.workflows", *_env_list("RUNLEDGER_WORKFLOW_MODULES", [])]
# The most threads one parallel group's branches use at a time in this process (a group's own
# `max_concurrency` caps it further); 1 runs every group's branches one after another.
RUNLEDGER_PARALLEL_THREADS = _env_int("RUNLEDGER_PARALLEL_THREADS", 8, minimum=1, maximum=256)
# The run lease an executor holds (with its fencing token) while it runs a run. Its writes renew it
# once half has passed, and a heartbeat thread renews it while a step is silent that long, so a
# long tool or model call keeps its run; an executor that died frees its run after this long.
RUNLEDGER_RUN_LEASE_SECONDS = _env_seconds("RUNLEDGER_RUN_LEASE_SECONDS", 300.0, 86_400.0)
# Allocations between two runs of Python's cyclic garbage collector over its youngest objects
# (Python's own default is 700). Every process of the console sets it (ledger/apps.py): at 700 a
# batched append of 500 events paid for collections that freed almost nothing, and every tenth
# collection of the middle generation could start a full one over every object alive, the state
# cache's folded runs included (bench/README.md § Floors, the collector). Reference counting frees
# everything that is not in a cycle either way.
RUNLEDGER_GC_THRESHOLD = _env_int("RUNLEDGER_GC_THRESHOLD", 50_000, minimum=1, maximum=10_000_000)

# The openai-compatible model provider (ledger/runtime/openai_compat.py), read when a workflow
# builds one with `OpenAICompatibleProvider.from_env()`. None = unset: the provider names every
# missing one then, since a deployment that uses only the scripted provider sets none of them.
RUNLEDGER_OPENAI_BASE_URL = os.environ.get("RUNLEDGER_OPENAI_BASE_URL")
RUNLEDGER_OPENAI_API_KEY = os.environ.get("RUNLEDGER_OPENAI_API_KEY")
RUNLEDGER_OPENAI_MODEL = os.environ.get("RUNLEDGER_OPENAI_MODEL")
RUNLEDGER_OPENAI_PROVIDER = os.environ.get("RUNLEDGER_OPENAI_PROVIDER")
RUNLEDGER_OPENAI_TIMEOUT_S = os.environ.get("RUNLEDGER_OPENAI_TIMEOUT_S")
if RUNLEDGER_OPENAI_TIMEOUT_S is not None:  # kept as written; refused here, at start, if it is no number
    _env_seconds("RUNLEDGER_OPENAI_TIMEOUT_S", 60.0, 3600.0)  # ledger/runtime/openai_compat.py's bounds

# Content-addressed artifact storage (payloads over the inline limit). Filesystem by default.
ARTIFACTS_ROOT = Path(os.environ.get("RUNLEDGER_ARTIFACTS_ROOT", VAR_DIR / "artifacts"))

_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_LEVEL = os.environ.get("LOG_LEVEL", "WARNING").strip().upper()
if LOG_LEVEL not in _LOG_LEVELS:
    raise ImproperlyConfigured(f"LOG_LEVEL must be one of {', '.join(_LOG_LEVELS)}, got {os.environ['LOG_LEVEL']!r}")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # A refused (4xx) request: one line, method, path, status, caller; no traceback (console/logfilters.py).
    "filters": {"refused_one_line": {"()": "console.logfilters.RefusedRequestsOneLine"}},
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django.request": {"filters": ["refused_one_line"]}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
}
