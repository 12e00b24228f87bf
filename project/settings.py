"""Settings of the agenttasks demo site (and the test suite's base): not for production.

SQLite (embedded) by default; DATABASE_URL=postgres://user@host:port/name switches to PostgreSQL.
"""

import json
import os
from pathlib import Path
from urllib.parse import unquote, urlparse

BASE_DIR = Path(__file__).resolve().parent.parent

# The demo's insecure choices live here only, and `make run` names each one still in effect
# in its banner (project/management/commands/demo_setup.py); it listens on 127.0.0.1 by default.
DEMO_SECRET_KEY = "demo-only-not-secret"
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY") or DEMO_SECRET_KEY
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "*").split(",")

INSTALLED_APPS = [
    # First, so that its `runserver` (which keeps a request's missing Content-Type missing)
    # wins over the one of django.contrib.staticfiles.
    "project",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",  # only for `manage.py spectacular` (make test validates the API schema)
    "django_q",
    "agenttasks",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "project.urls"
WSGI_APPLICATION = "project.wsgi.application"
ASGI_APPLICATION = "project.asgi.application"

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


# A django-q2 worker process holds many runs in flight that share a bounded number of connections:
# on PostgreSQL every process uses Django's connection pool (DB_POOL=0: persistent connections
# instead, the web server's old default). DB_POOL_SIZE bounds each process's pool.
POOLED = os.environ.get("DB_POOL") != "0"
POOL_SIZE = int(os.environ.get("DB_POOL_SIZE", "10"))
# Prepared statements (DB_PREPARED=0 turns them off): psycopg 3 binds the parameters on the server
# and prepares a statement once a connection has run it five times, so PostgreSQL parses and plans
# each task's create, claim and ending once per connection instead of every time (about a tenth of
# its CPU in a burst of echo tasks: docs/performance.md#cost-per-task). Django leaves them off by
# default for connection poolers in transaction mode that cannot carry them (PgBouncer before 1.21).
PREPARED = os.environ.get("DB_PREPARED") != "0"


def database_from_url(url: str) -> dict:
    """Turn postgres://user:password@host:port/name into a DATABASES entry."""
    parts = urlparse(url)
    if parts.scheme not in ("postgres", "postgresql"):
        raise ValueError(f"DATABASE_URL must be a postgres:// URL, not {parts.scheme!r}")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
        # django-q2 closes connections around every step: reusing them is 7x faster (README,
        # Database notes). Under ASGI every request runs in a thread of its own, so a persistent
        # connection would be left behind by each: the pool serves both.
        "CONN_MAX_AGE": 0 if POOLED else 60,
        # Checked connections: the pool (or a persistent connection at a request's start) tries
        # one before handing it out, so one that died with a database restart, or while a run
        # waited on its model, is replaced instead of failing what uses it (README).
        "CONN_HEALTH_CHECKS": True,
        "OPTIONS": {
            **({"pool": {"min_size": 1, "max_size": POOL_SIZE, "timeout": 30}} if POOLED else {}),
            **({"server_side_binding": True, "prepare_threshold": 5} if PREPARED else {}),
        },
        "TEST": {"NAME": "test_" + unquote(parts.path.lstrip("/"))},
    }


SQLITE_PATH = Path(os.environ.get("SQLITE_PATH", BASE_DIR / "db.sqlite3"))

if os.environ.get("DATABASE_URL"):
    DATABASES = {"default": database_from_url(os.environ["DATABASE_URL"])}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": SQLITE_PATH,
            "OPTIONS": {
                # Every transaction takes the write lock at BEGIN, so the store's re-checks are
                # exact; WAL lets readers go on while one process writes; the busy timeout makes
                # the web server, the broker and the workers wait instead of "database is locked".
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
            # A file, not memory, so a cluster started by a test sees the test database.
            "TEST": {"NAME": str(SQLITE_PATH.with_name(SQLITE_PATH.stem + "-test.sqlite3"))},
        }
    }

AUTH_PASSWORD_VALIDATORS: list[dict[str, str]] = []

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "static"
MEDIA_ROOT = Path(os.environ.get("MEDIA_ROOT", BASE_DIR / "media"))
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "agenttasks.api.authentication.TokenAuthentication",  # DRF's, its lookup in raw SQL
        "rest_framework.authentication.SessionAuthentication",
        # DRF's defaults are session and Basic: `curl -u admin:admin` works, as the README says.
        "rest_framework.authentication.BasicAuthentication",
    ],
    # The demo is reached directly, so no X-Forwarded-For is believed; behind n reverse proxies
    # set NUM_PROXIES=n (throttles then count the address the nearest proxy saw).
    "NUM_PROXIES": int(os.environ.get("NUM_PROXIES", "0")),
}

Q_CLUSTER = {
    # Every node of one site shares the name: it names the queue and keys the signed jobs.
    "name": os.environ.get("Q_NAME", "agenttasks"),
    "orm": "default",
    "workers": int(os.environ.get("Q_WORKERS", "2")),
    # django-q2 replaces a worker process after this many jobs. Each run is one job, and a
    # process that is recycled claims nothing more and finishes the runs in flight it holds
    # before it goes, so the demo recycles rarely.
    "recycle": int(os.environ.get("Q_RECYCLE", "10000")),
    # A run's job returns at once (its run executes in a slot), so `timeout` bounds the other
    # jobs; django-q2 re-delivers a job only after `retry`, which must exceed `timeout`.
    "timeout": int(os.environ.get("Q_TIMEOUT", "660")),
    "retry": int(os.environ.get("Q_TIMEOUT", "660")) + 60,
    "max_attempts": 1,
    "poll": 0.05,
    "catch_up": False,
    "save_limit": -1,  # keep no success rows: agenttasks records outcomes itself
    "ack_failures": True,
    "label": "Django Q",
    "log_level": os.environ.get("Q_LOG_LEVEL", "INFO"),
}

# On PostgreSQL an idle cluster waits for jobs instead of reading its queue every `poll` seconds
# (docs/production.md#the-job-queue).
# Q_LISTEN=0 keeps django-q2's own polling broker (bench/idle.py compares the two).
if DATABASES["default"]["ENGINE"].endswith("postgresql") and os.environ.get("Q_LISTEN") != "0":
    Q_CLUSTER["broker_class"] = "agenttasks.broker.orm.ListeningORM"

# Q_BROKER=redis uses django-q2's Redis broker (REDIS_URL) instead of the database; several
# clusters on several machines then share one Redis and one PostgreSQL.
if os.environ.get("Q_BROKER") == "redis":
    del Q_CLUSTER["orm"]
    Q_CLUSTER.pop("broker_class", None)
    Q_CLUSTER["redis"] = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")

AGENTTASKS = {
    # Runs in flight per worker process (README, "Sizing a node"): on PostgreSQL 500, so the
    # demo's 2 workers hold 1,000 at once on a 2-core machine; on SQLite its default (4).
    **(
        {"WORKER_SLOTS": int(os.environ.get("WORKER_SLOTS", "500"))}
        if DATABASES["default"]["ENGINE"].endswith("postgresql")
        else {}
    ),
    "DESCRIBE_STATE": {
        "": "project.agents.describe_state",
        "slow": "project.agents.describe_state",
    },
    # The demo serves /api/agents/metrics (the banner says so); a site turns it on itself.
    "METRICS_ENABLED": os.environ.get("DEMO_METRICS", "1") == "1",
    # Overrides for one run (the benchmarks lift the active-task cap): a JSON object.
    **json.loads(os.environ.get("AGENTTASKS_OVERRIDES") or "{}"),
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # `%(trace)s`: " trace_id=… span_id=…" on the lines of a traced run or request (TRACING).
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s%(trace)s"}},
    "filters": {"trace": {"()": "agenttasks.tracing.TraceIds"}},
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "plain", "filters": ["trace"]}
    },
    "loggers": {
        "agenttasks": {"handlers": ["console"], "level": os.environ.get("AGENTTASKS_LOG", "INFO")}
    },
}
