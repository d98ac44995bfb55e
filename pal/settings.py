"""PAL Ops settings: everything that varies comes from the environment (docs/reference/settings.md).

A bad value stops start-up with ImproperlyConfigured naming the variable; nothing falls back silently.
"""

import json
import os
import re
import shlex
import socket
import sys
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured
from django.utils.csp import CSP

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("PAL_VAR_DIR", BASE_DIR / "var"))


def env_str(name, default=""):
    return os.environ.get(name, default)


def env_bool(name, default=False):
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ImproperlyConfigured(f"{name} must be true or false (1/0, yes/no), got {raw!r}")


def env_number(name, default, *, cast=float, minimum=None, maximum=None):
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = cast(raw)
    except ValueError:
        kind = "a whole number" if cast is int else "a number"
        raise ImproperlyConfigured(f"{name} must be {kind}, got {raw!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ImproperlyConfigured(f"{name} must be a finite number, got {raw!r}")
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, got {raw!r}")
    if maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"{name} must be at most {maximum}, got {raw!r}")
    return value


def env_json(name, default):
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be JSON: {exc}") from None


def env_names(name, *, refused=(), why=""):
    """A comma-separated list of environment variable names (spaces around commas allowed; empty: none)."""
    raw = os.environ.get(name, "")
    names = [part.strip() for part in raw.split(",") if part.strip()]
    for item in names:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", item):
            raise ImproperlyConfigured(f"{name} must be a comma-separated list of variable names, got {item!r}")
        if item in refused:
            raise ImproperlyConfigured(f"{name} names {item}, which {why}")
    return names


def env_url(name, default, schemes):
    raw = os.environ.get(name, "").strip() or default
    if raw and raw.split(":", 1)[0] not in schemes:
        raise ImproperlyConfigured(
            f"{name} must start with one of {', '.join(s + '://' for s in schemes)}, got {raw!r}"
        )
    return raw


def database_url_parse(url, **kwargs):
    """dj_database_url.parse, and libpq's multi-host form it refuses, postgres://u:p@h1:p1,h2:p2/db?target_session_
    attrs=read-write (a primary and its standbys): HOST and PORT become libpq's comma-separated lists, so a new
    connection tries each host in turn and keeps the first that accepts writes."""
    scheme, _, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if "," not in hosts:
        return dj_database_url.parse(url, **kwargs)
    names, ports = [], []
    for entry in hosts.split(","):
        name, port = entry[1:].split("]", 1) if entry.startswith("[") else [*entry.split(":", 1), ""][:2]
        port = port.removeprefix(":")
        if not name or (port and not port.isdigit()):
            raise ValueError(f"host {entry!r} of {hosts!r} is not host or host:port")
        names.append(name)
        ports.append(port)
    parsed = dj_database_url.parse(f"{scheme}://{userinfo}{at}multi-host{slash}{path}", **kwargs)
    parsed["HOST"] = ",".join(names)
    # libpq takes one port for every host, or one per host (an empty one: the default, 5432).
    parsed["PORT"] = ",".join(ports) if any(ports) else ""
    return parsed


# --- Django ---------------------------------------------------------------------------------------

DEBUG = env_bool("DJANGO_DEBUG", False)
# Unset, a development key is used and `manage.py check --deploy` warns (production sets its own).
SECRET_KEY = env_str("DJANGO_SECRET_KEY") or "django-insecure-pal-development-key-set-DJANGO_SECRET_KEY"
ALLOWED_HOSTS = [h.strip() for h in env_str("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost").split(",") if h.strip()]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "ninja",  # the API docs' Swagger UI from our own static files (no CDN: the CSP allows none)
    "axes",  # login throttling (django-axes): failed logins and bad API tokens, per user and per address
    "journal",
    "runs",
    "tokens",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
    # /api/ only: the body-size limit (413) and JSON {detail, code} for every error Django answers itself.
    "pal.middleware.ApiMiddleware",
    "pal.middleware.StaticFilesMiddleware",  # WhiteNoise, async-capable: the whole stack stays async under ASGI
    # While the database is away: 503 at once (pal.db_away), before anything reads the session or a token.
    "pal.middleware.DatabaseAwayMiddleware",
    # Django's session, CSRF, login, messages and django-htmx's, for the pages: an API call (Bearer token) passes by.
    "pal.middleware.PageSessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "pal.middleware.PageCsrfViewMiddleware",
    "pal.middleware.PageAuthenticationMiddleware",
    "pal.middleware.PageMessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "pal.middleware.PageHtmxMiddleware",
    # Last, as django-axes asks: a login refused while its user or address is locked out answers 429 (its page).
    "pal.middleware.PageAxesMiddleware",
]

ROOT_URLCONF = "pal.urls"
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
        },
    },
]
WSGI_APPLICATION = "pal.wsgi.application"
ASGI_APPLICATION = "pal.asgi.application"

DATABASE_URL = env_url("DATABASE_URL", f"sqlite:///{VAR_DIR / 'pal.sqlite3'}", ("sqlite", "postgres", "postgresql"))
try:
    # Workers keep their connection (600 s); the ASGI web app sets PAL_DB_CONN_MAX_AGE=0 (pal/asgi.py), since its
    # sync views may run on a new thread per request and a kept connection would be left behind on each.
    _db = database_url_parse(
        DATABASE_URL, conn_max_age=env_number("PAL_DB_CONN_MAX_AGE", 600, cast=int, minimum=0), conn_health_checks=True
    )
except Exception as exc:  # dj_database_url raises several kinds
    raise ImproperlyConfigured(f"DATABASE_URL is not a database URL: {exc}") from None
if _db["ENGINE"] == "django.db.backends.sqlite3":
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    _db["CONN_MAX_AGE"] = 0
    # A file, not Django's in-memory default, so tests with several threads or processes share one database.
    _db["TEST"] = {"NAME": str(VAR_DIR / "test.sqlite3")}
    _db["OPTIONS"] = {
        # Every write transaction takes the database lock up front, so two processes never deadlock
        # upgrading a read lock; WAL lets readers go on while one writer works.
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
        # synchronous=FULL: a commit returns only once the WAL is fsynced. Under NORMAL (SQLite's WAL default) a
        # power cut can roll back commits that had returned, a side effect's claim among them, and the run's
        # deliver step would send its email again after the reboot. synchronous is per connection: every
        # process (web, worker, beat) sets it here.
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA busy_timeout=20000;",
    }
if _db["ENGINE"] == "django.db.backends.postgresql":
    # Server-side binding, and psycopg preparing a statement once it has run it 5 times on a connection: the
    # statements a walk repeats (the journal append above all) are planned once per connection, not at every step.
    # Django turns psycopg's preparing off unless prepare_threshold is given.
    _db.setdefault("OPTIONS", {})["server_side_binding"] = True
    # Behind PgBouncer in transaction pooling mode (PAL_DB_PGBOUNCER) each transaction may get another server
    # connection, so nothing may outlive one: no prepared statement (PgBouncer before 1.21 keeps none; set
    # PAL_DB_PREPARE=true for one with max_prepared_statements), no holdable server-side cursor (QuerySet.iterator()
    # outside a transaction). The engine keeps no other session state: its SETs and advisory locks are transaction-local
    # (SET LOCAL, pg_advisory_xact_lock), it LISTENs to nothing, and PgBouncer carries Django's SET TIME ZONE.
    _pgbouncer = env_bool("PAL_DB_PGBOUNCER", False)
    _db["OPTIONS"]["prepare_threshold"] = 5 if env_bool("PAL_DB_PREPARE", not _pgbouncer) else None
    if _pgbouncer:
        _db["DISABLE_SERVER_SIDE_CURSORS"] = True
    if env_bool("PAL_DB_POOL", False):
        # The ASGI web app (pal/asgi.py) borrows connections from a psycopg pool: a request's sync code may run
        # on any thread, so a kept connection would leak, and a new one per request costs more than the request.
        _db["CONN_MAX_AGE"] = 0
        _db["OPTIONS"]["pool"] = {
            "min_size": 2,
            # pal.web's threads (PAL_WEB_THREADS, 8) and the event stream's (4) keep theirs, with room to spare.
            "max_size": env_number("PAL_DB_POOL_SIZE", 20, cast=int, minimum=1),
            # A request waits this long for a connection, then answers 503 (pal.db_away): the contract's "within a
            # second" while the database is away. The threads keep theirs, so a healthy pool never makes them wait.
            "timeout": env_number("PAL_DB_POOL_TIMEOUT", 0.5, minimum=0.05, maximum=60),
            # psycopg_pool retries a failed connect with a backoff (1, 2, 4, 8, 16 s...) for reconnect_timeout (5
            # min by default), and meanwhile waiting requests start no new attempt: after a 30 s outage the API
            # failed for 26 s more. Given up after half a second, the next request that waits starts a new one.
            "reconnect_timeout": 0.5,
        }
DATABASES = {"default": _db}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS: list[dict] = []
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static"]
# Production runs collectstatic into STATIC_ROOT; until it has (make run, tests) WhiteNoise serves from the apps.
WHITENOISE_USE_FINDERS = DEBUG or not STATIC_ROOT.exists()
# The operator's pages log in here (any Django user; reading needs runs.view_run, acting runs.operate);
# the admin keeps its own login for staff.
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/runs/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

# Login throttling (django-axes, its attempts in the database: every web process sees them). After
# PAL_LOGIN_FAILURE_LIMIT failures in a row for a user name, or from an address, that user or address is refused
# (429) for PAL_LOGIN_COOLOFF_MINUTES; a success resets the count; a superuser unlocks from the admin (Access
# attempts: delete). Bad API tokens count per address the same way (tokens.auth). Behind a proxy the address is
# REMOTE_ADDR as the ASGI server gives it: run uvicorn with --proxy-headers --forwarded-allow-ips=<proxy>.
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_FAILURE_LIMIT = env_number("PAL_LOGIN_FAILURE_LIMIT", 5, cast=int, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=env_number("PAL_LOGIN_COOLOFF_MINUTES", 15, minimum=0.1))
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]  # either one reaching the limit locks it out
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_HTTP_RESPONSE_CODE = 429
AXES_VERBOSE = True  # each failure and lockout is logged (logger "axes"), naming the user name and address
AXES_SENSITIVE_PARAMETERS: list[str] = []  # the log says who was locked out; a password is never logged
# pal.middleware.PageAxesMiddleware and PageCsrfViewMiddleware are axes' and Django's CSRF middleware (subclasses
# that let an API call pass by); both checks look for their class by name only (tests/pal/test_deploy.py checks).
SILENCED_SYSTEM_CHECKS = ["axes.W002", "security.W003"]
CSRF_FAILURE_VIEW = "pal.views.csrf_failure"

# Content-Security-Policy on every answer (Django's middleware): our own origin only, no inline script or style,
# no eval, never framed. data: is for the pages' empty favicon and the API docs' icons.
SECURE_CSP = {
    "default-src": [CSP.SELF],
    "script-src": [CSP.SELF],
    "style-src": [CSP.SELF],
    "img-src": [CSP.SELF, "data:"],
    "object-src": [CSP.NONE],
    "base-uri": [CSP.NONE],
    "frame-ancestors": [CSP.NONE],
    "form-action": [CSP.SELF],
}

# Behind a proxy that terminates TLS (PAL_BEHIND_TLS_PROXY=true): the proxy's X-Forwarded-Proto says https, plain
# http is redirected (but /health and /metrics, which probes ask on the app's own port), HSTS, cookies only over
# https, and forms trusted from https:// of each DJANGO_ALLOWED_HOSTS. Off (make run): plain http://127.0.0.1.
PAL_BEHIND_TLS_PROXY = env_bool("PAL_BEHIND_TLS_PROXY", False)
if PAL_BEHIND_TLS_PROXY:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = True
    # The probes and the scrape on the app's own port answer plain http (Django matches the path without its "/").
    SECURE_REDIRECT_EXEMPT = [r"^api/v1/health$", r"^api/v1/metrics$", r"^metrics$"]
    SECURE_HSTS_SECONDS = env_number("PAL_HSTS_SECONDS", 31_536_000, cast=int, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("PAL_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = env_bool("PAL_HSTS_PRELOAD", True)
    SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = True
    CSRF_TRUSTED_ORIGINS = [
        f"https://*{host}" if host.startswith(".") else f"https://{host}" for host in ALLOWED_HOSTS if host != "*"
    ]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "pal": {"handlers": ["console"], "level": env_str("PAL_LOG_LEVEL", "INFO")},
        "axes": {"handlers": ["console"], "level": "WARNING"},  # lockouts (failures are INFO)
    },
}

# --- Celery ---------------------------------------------------------------------------------------

CELERY_BROKER_URL = env_url(
    "CELERY_BROKER_URL", "filesystem://", ("redis", "rediss", "amqp", "amqps", "pyamqp", "filesystem", "memory")
)
if CELERY_BROKER_URL.startswith("filesystem://"):
    # The embedded broker: messages are files under var/broker, shared by every local process.
    _broker_dir = VAR_DIR / "broker"
    for _sub in ("queue", "processed", "control"):
        (_broker_dir / _sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "processed_folder": str(_broker_dir / "processed"),
        "store_processed": False,
        "control_folder": str(_broker_dir / "control"),
    }
elif CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
    # Run priorities (runs.dispatch.broker_priority): each of kombu's levels 0..9 a list of its own (its default
    # steps, 0 3 6 9, would merge neighbours); lower is sooner, and a message without a priority is at 0, the first
    # list a worker takes from, as before priorities.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"priority_steps": list(range(10))}
elif CELERY_BROKER_URL.startswith(("amqp://", "amqps://", "pyamqp://")):
    # RabbitMQ orders a queue's messages by priority only when the queue is declared with x-max-priority: higher is
    # sooner, a message without one at 0. A queue declared before without it must be deleted once (RabbitMQ refuses
    # to declare a queue again with other arguments).
    CELERY_TASK_QUEUE_MAX_PRIORITY = 9
# Celery's Django fixup closes every database connection before and after each task unless this is set; a new
# Postgres connection costs more than a whole 10-step run, so workers keep theirs; pal/celery.py health-checks
# it before each task (a dead one, say after a Postgres restart, is replaced, never reused).
CELERY_DB_REUSE_MAX = 1000
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A worker whose broker went away tries it again every second (pal.worker_consumer), for as long as it is away:
# Celery's default, 100 tries, would at that pace end the worker after less than two minutes.
CELERY_WORKER_CONSUMER = "pal.worker_consumer:Consumer"
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")

# --- PAL ------------------------------------------------------------------------------------------

PAL_RECOVERY_INTERVAL = env_number("PAL_RECOVERY_INTERVAL", 30.0, minimum=0.1)
# How many sweeps the sweeps table keeps (the newest; each sweep deletes the older ones): 1,000 is over 8 hours
# at the default interval, and what the dashboard's "last re-drive" looks back over.
PAL_SWEEP_HISTORY = env_number("PAL_SWEEP_HISTORY", 1000, cast=int, minimum=1)
PAL_LEASE_TTL = env_number("PAL_LEASE_TTL", 30.0, minimum=0.5)
PAL_MAX_CHILD_DEPTH = env_number("PAL_MAX_CHILD_DEPTH", 5, cast=int, minimum=0, maximum=100)
# A task walks one run for at most this long, then hands the run back to the queue so a
# 1,000-step run cannot starve the runs queued behind it.
PAL_SLICE_SECONDS = env_number("PAL_SLICE_SECONDS", 2.0, minimum=0.01)
# Python workflows (pal.workflows): these dotted modules are imported at start-up by every process, besides the
# workflows.py of each installed app.
PAL_WORKFLOW_MODULES = [m.strip() for m in env_str("PAL_WORKFLOW_MODULES", "").split(",") if m.strip()]


def _rate_limits(raw) -> dict:
    """PAL_RATE_LIMITS checked: {"llm:MODEL" | "llm:*" | "webhook:HOST" | "email:*": {requests_per_minute?,
    tokens_per_minute?}}, each a whole number above 0."""
    if not isinstance(raw, dict):
        raise ImproperlyConfigured("PAL_RATE_LIMITS must be a JSON object of limits by name")
    for name, spec in raw.items():
        channel, _, target = str(name).partition(":")
        if channel not in ("llm", "webhook", "email") or not target or (channel == "email" and target != "*"):
            raise ImproperlyConfigured(f"PAL_RATE_LIMITS: {name!r} is not llm:MODEL, llm:*, webhook:HOST or email:*")
        if not isinstance(spec, dict) or not spec or set(spec) - {"requests_per_minute", "tokens_per_minute"}:
            raise ImproperlyConfigured(
                f"PAL_RATE_LIMITS: {name!r} must be an object of requests_per_minute and/or tokens_per_minute"
            )
        for field, value in spec.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ImproperlyConfigured(f"PAL_RATE_LIMITS: {name!r}.{field} must be a whole number above 0")
    return raw


# Calls across every worker (llm, webhook, email), counted in the database over sliding 60-second windows.
PAL_RATE_LIMITS = _rate_limits(env_json("PAL_RATE_LIMITS", {}))
# The beat looks at the earliest lease expiry and timer between its ticks (runs.recovery.RecoveryLook) and sends a
# sweep as soon as one passes: a run whose worker died resumes about PAL_LEASE_TTL after its last heartbeat rather
# than up to an interval later, whichever worker died.
PAL_SWEEP_AT_LEASE_EXPIRY = env_bool("PAL_SWEEP_AT_LEASE_EXPIRY", True)
# How many steps (and for_each items) of one run a walk runs at the same time, each on a thread of its own.
PAL_WALK_THREADS = env_number("PAL_WALK_THREADS", 16, cast=int, minimum=1, maximum=1000)
# Consecutive pure steps (no effect outside the database: a pure tool such as echo, a @step(pure=True)) share one
# commit, at most this many steps or this many milliseconds since the first row left unwritten; a crash re-runs
# them, at no cost. A step with an effect still has its step_started committed before it acts.
PAL_PURE_BATCH_STEPS = env_number("PAL_PURE_BATCH_STEPS", 64, cast=int, minimum=1, maximum=10_000)
PAL_PURE_BATCH_MS = env_number("PAL_PURE_BATCH_MS", 5.0, minimum=0.0, maximum=1000.0)
# The items of a for_each step (and parallel steps) of the kinds that call out (tool_call, llm_call, deliver, agent)
# are booked for the whole fleet: any idle worker process takes one (runs.walk.fleet). A booking no worker took within
# PAL_ITEM_PICKUP_SECONDS the run's own walk takes back and runs on one of its threads; it looks at its items' rows
# every PAL_ITEM_POLL_SECONDS.
PAL_ITEMS_ACROSS_WORKERS = env_bool("PAL_ITEMS_ACROSS_WORKERS", True)
PAL_ITEM_PICKUP_SECONDS = env_number("PAL_ITEM_PICKUP_SECONDS", 0.05, minimum=0.0, maximum=60.0)
PAL_ITEM_POLL_SECONDS = env_number("PAL_ITEM_POLL_SECONDS", 0.025, minimum=0.005, maximum=5.0)
# Seconds between lease heartbeats; one UPDATE per worker process covers every run it holds.
PAL_HEARTBEAT_INTERVAL = env_number("PAL_HEARTBEAT_INTERVAL", max(0.2, PAL_LEASE_TTL / 3), minimum=0.05)

PAL_LLM_BASE_URL = env_url("PAL_LLM_BASE_URL", "", ("http", "https"))
PAL_LLM_API_KEY = env_str("PAL_LLM_API_KEY")
PAL_LLM_TIMEOUT = env_number("PAL_LLM_TIMEOUT", 60.0, minimum=0.1)
PAL_TRANSPORT_RETRIES = env_number("PAL_TRANSPORT_RETRIES", 3, cast=int, minimum=0, maximum=20)
# After the transport retries inside a call, an outcome still unknown is tried again this many times (same
# attempt, same key, growing delay) before it becomes a step_failed.
PAL_UNKNOWN_RETRIES = env_number("PAL_UNKNOWN_RETRIES", 3, cast=int, minimum=0, maximum=50)
# A walk that raises from the engine's own code this many times in a row with no step ending in between fails its
# run with internal_error (runs.crashes): a bug must not have the sweep re-drive a run for ever.
PAL_WALK_CRASHES = env_number("PAL_WALK_CRASHES", 3, cast=int, minimum=1, maximum=100)
PAL_WEBHOOK_SECRET = env_str("PAL_WEBHOOK_SECRET")
# The site's address as people reach it: the links of approvals' notifications start with it (/decisions/<token>/).
PAL_SITE_URL = env_url("PAL_SITE_URL", "http://127.0.0.1:8000", ("http", "https"))
# Seconds an approval's signed link (/decisions/<token>/) stays valid after the approval opened.
PAL_DECISION_LINK_TTL = env_number("PAL_DECISION_LINK_TTL", 7 * 86_400.0, minimum=60, maximum=366 * 86_400)
# GET /metrics also answers this bearer token (a Prometheus scraper without an API user); empty: API tokens only.
PAL_METRICS_TOKEN = env_str("PAL_METRICS_TOKEN")
PAL_WEBHOOK_TIMEOUT = env_number("PAL_WEBHOOK_TIMEOUT", 10.0, minimum=0.1)
# USD per 1,000 tokens: (prompt, completion). Override with PAL_LLM_PRICES as JSON.
PAL_LLM_PRICES = env_json(
    "PAL_LLM_PRICES",
    {
        "gpt-4o-mini": [0.00015, 0.0006],
        "gpt-4o": [0.0025, 0.01],
        "fake": [0.0, 0.0],
    },
)
if not isinstance(PAL_LLM_PRICES, dict):
    raise ImproperlyConfigured("PAL_LLM_PRICES must be a JSON object of model -> [prompt, completion] per 1k tokens")

# Agents: name -> command (a list, or a string split like a shell would).
_agents = env_json("PAL_AGENTS", {"coder": [sys.executable, str(BASE_DIR / "agents" / "example_agent.py")]})
if not isinstance(_agents, dict) or not all(
    (isinstance(c, str) and c.strip()) or (isinstance(c, list) and c and all(isinstance(a, str) for a in c))
    for c in _agents.values()
):
    raise ImproperlyConfigured(
        "PAL_AGENTS must be a JSON object mapping each agent name to a command (a string or a list of strings)"
    )
PAL_AGENTS = {name: (shlex.split(cmd) if isinstance(cmd, str) else list(cmd)) for name, cmd in _agents.items()}
PAL_AGENT_TIMEOUT = env_number("PAL_AGENT_TIMEOUT", 600.0, minimum=0.1)
# An agent is someone else's code: its environment is PATH, HOME, LANG, TMPDIR, its PAL_RUN_ID / PAL_STEP_ID /
# PAL_IDEMPOTENCY_KEY / PAL_RESUME and the variables named here (runs/steps/agent.py), never one of these.
ENGINE_SECRET_NAMES = (
    "DATABASE_URL",
    "CELERY_BROKER_URL",
    "DJANGO_SECRET_KEY",
    "PAL_RECEIPT_PRIVATE_KEY",
    "PAL_RECEIPT_PRIVATE_KEY_FILE",
    "PAL_LLM_API_KEY",
    "PAL_WEBHOOK_SECRET",
    "PAL_METRICS_TOKEN",
    "EMAIL_HOST_PASSWORD",
)
# Refused at start-up rather than dropped in silence: an operator who names one meant the agent to have it,
# and must learn here that it never will.
PAL_AGENT_ENV = env_names(
    "PAL_AGENT_ENV",
    refused=ENGINE_SECRET_NAMES,
    why="is a secret of the engine and never reaches an agent; give the agent its own credential",
)
PAL_WORKER_NAME = env_str("PAL_WORKER_NAME", socket.gethostname())

# --- REST API -------------------------------------------------------------------------------------

# The largest request body the API reads; a larger one is answered 413 before it is parsed.
PAL_API_MAX_BODY_BYTES = env_number("PAL_API_MAX_BODY_BYTES", 1_048_576, cast=int, minimum=1)
# The event stream: how often open streams look for new events (one query per tick for all of a process's
# streams), how often an idle stream sends a keep-alive comment, and the threads its database reads run on.
PAL_STREAM_POLL_INTERVAL = env_number("PAL_STREAM_POLL_INTERVAL", 0.4, minimum=0.05, maximum=10)
PAL_STREAM_KEEPALIVE = env_number("PAL_STREAM_KEEPALIVE", 15.0, minimum=0.1, maximum=3600)
PAL_STREAM_DB_THREADS = env_number("PAL_STREAM_DB_THREADS", 4, cast=int, minimum=1, maximum=64)
# Under ASGI (pal.web): a request to a sync view is handled whole on one of PAL_WEB_THREADS threads (each keeps a
# database connection from the pool, pal.db_pool); PAL_WEB_SYNC_PATH=0 hands every request to Django's async
# handler instead, a thread and some twenty thread hops per request (scenario E's "before"). 8, not 16: the threads
# take turns at one GIL, and with 16 a GET /runs/{id} cost a fifth more CPU, a POST /runs a twelfth (E, interleaved
# runs; a POST waits on its commit, and 8 still keep the core busy).
PAL_WEB_SYNC_PATH = env_bool("PAL_WEB_SYNC_PATH", True)
PAL_WEB_THREADS = env_number("PAL_WEB_THREADS", 8, cast=int, minimum=1, maximum=256)


def _receipt_key():
    """The Ed25519 key that signs receipts: PEM text in PAL_RECEIPT_PRIVATE_KEY, or a file named by
    PAL_RECEIPT_PRIVATE_KEY_FILE. Unset: receipts are not signed and GET /receipts/public-key answers 404."""
    text, name = env_str("PAL_RECEIPT_PRIVATE_KEY").strip(), "PAL_RECEIPT_PRIVATE_KEY"
    path = env_str("PAL_RECEIPT_PRIVATE_KEY_FILE").strip()
    if not text and path:
        name = "PAL_RECEIPT_PRIVATE_KEY_FILE"
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}: cannot read {path!r}: {exc}") from None
    if not text:
        return None
    # Loaded only when a receipt key is configured: every process reads these settings, few sign receipts.
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        key = load_pem_private_key(text.encode(), password=None)
    except (ValueError, TypeError) as exc:
        raise ImproperlyConfigured(f"{name} must be an unencrypted PEM private key: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ImproperlyConfigured(f"{name} must be an Ed25519 private key, got {type(key).__name__}")
    return key


PAL_RECEIPT_PRIVATE_KEY = _receipt_key()
PAL_RECEIPT_PRIVATE_KEY_FILE = env_str("PAL_RECEIPT_PRIVATE_KEY_FILE").strip()  # kept so runs.secrets masks it

# --- Email ----------------------------------------------------------------------------------------

# Django 6.1's MAILERS (its EMAIL_* settings are deprecated); the environment keeps the EMAIL_* names.
# With no EMAIL_HOST, mail is written under var/mail.
PAL_EMAIL_TIMEOUT = env_number("EMAIL_TIMEOUT", 10.0, minimum=0.1)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "pal@localhost")
_smtp = {
    "host": env_str("EMAIL_HOST"),
    "port": env_number("EMAIL_PORT", 25, cast=int, minimum=1, maximum=65535),
    "username": env_str("EMAIL_HOST_USER"),
    "password": env_str("EMAIL_HOST_PASSWORD"),
    "use_tls": env_bool("EMAIL_USE_TLS", False),
    "timeout": PAL_EMAIL_TIMEOUT,
}
MAILERS = {
    "default": (
        {"BACKEND": "django.core.mail.backends.smtp.EmailBackend", "OPTIONS": _smtp}
        if _smtp["host"]
        else {
            "BACKEND": "django.core.mail.backends.filebased.EmailBackend",
            "OPTIONS": {"file_path": str(VAR_DIR / "mail")},
        }
    )
}

# The beat's scheduler also sends the sweep at a lease's expiry or a timer's wake time (PAL_SWEEP_AT_LEASE_EXPIRY).
CELERY_BEAT_SCHEDULER = "pal.beat:Scheduler"
# Django's task framework: every @task of the project and its apps is a durable run (pal/tasks.py).
TASKS = {"default": {"BACKEND": "pal.tasks.PalBackend"}}

CELERY_BEAT_SCHEDULE = {
    "recovery-sweep": {"task": "runs.tasks.sweep", "schedule": PAL_RECOVERY_INTERVAL},
    # Schedules (runs.schedules): a fire is at most this late; a second beat sending it too is harmless.
    "schedules-fire": {"task": "runs.tasks.schedules_fire", "schedule": 10.0},
}
