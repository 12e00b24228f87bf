"""The AGENTTASKS settings: defaults, validation of numbers, lazy reads, reload on change."""

import os
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.utils.module_loading import import_string

# Numeric settings: a value that is missing, None or <= 0 reads as the default.
NUMERIC_DEFAULTS: dict[str, float] = {
    "SUMMARY_LIMIT": 300,
    "MAX_STATUS_WAIT": 120,
    "MAX_DEPTH": 1,
    "MAX_ATTEMPTS": 3,
    "MAX_CONTINUATIONS": 50,
    "HEARTBEAT_INTERVAL": 5,
    "LEASE_TIMEOUT": 30,
    "REQUEUE_AFTER": 60,
    "REAP_INTERVAL": 10,
    "SCHEDULER_INTERVAL": 1.0,
    "MAX_REQUEST_BYTES": 52_428_800,
    "MAX_INPUT_CHARS": 100_000,
    "MAX_METADATA_BYTES": 16_384,
    "MAX_JSON_DEPTH": 32,
    "STREAM_MAX_SECONDS": 300,
    "STREAM_KEEPALIVE_SECONDS": 15,
    "SLOT_LEASE_SECONDS": 30,
    "CALLBACK_TIMEOUT": 10,
    "MODEL_TIMEOUT": 120,
    "MODEL_STREAM_TIMEOUT": 600,
    "PROVIDER_PATIENCE": 300,
    "DELEGATION_MAX_DEPTH": 3,
    "DELEGATION_MAX_PARALLEL": 8,
    "DELEGATION_WAIT_POLL": 0.5,
    "DELEGATION_WAIT_TIMEOUT": 600,
    "IDEMPOTENCY_TTL": 86_400,
    "IDEMPOTENCY_WAIT": 5,
    "DEFAULT_TIMEOUT": 600,
    "SHUTDOWN_GRACE": 30,
    # Threads per worker process that send callbacks and A2A pushes (delivery/lanes.py).
    "DELIVERY_LANES": 8,
    "MAX_PUSH_CONFIGS_PER_TASK": 10,
    # Seconds an MCP agent tool call waits for its task before it answers with the task id
    # (docs/mcp.md): below the 60-second request timeout common MCP hosts use.
    "MCP_CALL_TIMEOUT": 45,
}

DEFAULTS: dict[str, Any] = {
    **NUMERIC_DEFAULTS,
    # An int, or a dotted path to a zero-argument callable returning one; read at every spawn.
    "MAX_CONCURRENT_PER_PARENT": 6,
    # 0 means no limit, so these are not in NUMERIC_DEFAULTS.
    "MAX_ACTIVE_TASKS_PER_USER": 20,
    "MAX_STREAMS_PER_USER": 10,
    "MAX_WAITS_PER_USER": 10,
    # Runs of a user's tasks in flight at once; the claims leave the rest queued.
    "MAX_RUNNING_PER_USER": 0,
    # Seconds: a longer wait for a provider's turn parks the run (0: never).
    "PARK_AFTER": 2,
    # Streams (under WSGI) and waits one server process holds at once, whoever asks: each holds
    # a thread, so the rest are left for other requests.
    "MAX_HELD_PER_PROCESS": 2,
    # 0 means no retries at all, so this one is not in NUMERIC_DEFAULTS either.
    "MODEL_RETRIES": 2,
    # None: by database (worker.slots_per_process); MODEL_MAX_CONNECTIONS None: one per slot.
    "WORKER_SLOTS": None,
    "MODEL_MAX_CONNECTIONS": None,
    "CONTINUE": {},
    "DESCRIBE_STATE": {},
    "AGENTS": {},
    "ALLOW_ANONYMOUS": False,
    "ALLOW_ANONYMOUS_LIST": False,
    "AUTHENTICATION_CLASSES": None,
    "THROTTLE_RATES": {},
    "CALLBACK_ALLOWED_HOSTS": [],
    # None: the scheme's own port, and any port of an allowed host.
    "CALLBACK_ALLOWED_PORTS": None,
    "CALLBACK_SIGNING_SECRET": None,
    "SERVE_DOCS": True,
    "FILES": {
        "enabled": True,
        "allowedTypes": ["*/*"],
        "maxSize": 10_485_760,
        "maxCount": 10,
        "retentionDays": 30,
    },
    "FILE_STORAGE": "default",
    "DEFAULT_HITL": {"timeout_minutes": 60, "on_timeout": "deny"},
    "DEFAULT_BUDGET": {
        "max_turns": 6,
        "max_tokens": None,
        "max_tool_calls": None,
        "max_wall_seconds": None,
    },
    "MODEL_BASE_URL": None,
    "MODEL_API_KEY": None,
    "DEFAULT_MODEL": None,
    "MODEL_HEADERS": {},
    # Each model endpoint's limits, shared by the cluster (docs/operating.md#meeting-your-providers-limits):
    # {"default": {"requests_per_minute": 3000, "tokens_per_minute": 1_000_000, "concurrent": 50}}.
    "MODEL_LIMITS": {},
    # Where the budgets live: "database", "redis" (django-q2's Redis), or "auto": Redis where
    # django-q2's broker is its Redis broker, else the database.
    "BUDGET_STORE": "auto",
    # Operating (docs/rest.md#health-and-metrics, docs/lifecycle.md#retention).
    "HEALTH_TOKEN": None,
    "METRICS_ENABLED": False,
    "METRICS_TOKEN": None,
    "RETENTION": {"finished_days": 30, "idempotency_hours": 24, "failures_days": 7},
    # OpenTelemetry traces, with the `otel` extra (docs/operating.md#traces): the exporter is
    # configured by the OTEL_* environment variables; message content only with TRACE_CONTENT;
    # TRACE_URL ("https://viewer/trace/{trace_id}") links the admin's task page to its trace.
    "TRACING": False,
    "TRACE_CONTENT": False,
    "TRACE_URL": "",
}

# Integer settings where 0 is a value of its own ("no limit", "no retries").
ZERO_ALLOWED = (
    "MAX_ACTIVE_TASKS_PER_USER",
    "MAX_STREAMS_PER_USER",
    "MAX_WAITS_PER_USER",
    "MAX_RUNNING_PER_USER",
    "MAX_HELD_PER_PROCESS",
    "MODEL_RETRIES",
)

# Settings that fall back to an environment variable when unset or empty.
ENVIRONMENT_FALLBACKS = {
    "MODEL_BASE_URL": "AGENTTASKS_MODEL_BASE_URL",
    "MODEL_API_KEY": "AGENTTASKS_MODEL_API_KEY",
    "DEFAULT_MODEL": "AGENTTASKS_DEFAULT_MODEL",
}


class AppSettings:
    """Read AGENTTASKS lazily; `app_settings.SUMMARY_LIMIT` and so on."""

    def __init__(self):
        self._cache: dict[str, Any] = {}

    @property
    def user_settings(self) -> dict:
        return getattr(settings, "AGENTTASKS", None) or {}

    def __getattr__(self, name: str) -> Any:
        if name not in DEFAULTS:
            raise AttributeError(f"Unknown AGENTTASKS setting: {name}")
        if name in self._cache:
            return self._cache[name]
        value = self._read(name)
        # MAX_CONCURRENT_PER_PARENT may be a callable evaluated at every read; an environment
        # fallback is read whenever a run needs it, so a changed variable is seen.
        if name != "MAX_CONCURRENT_PER_PARENT" and name not in ENVIRONMENT_FALLBACKS:
            self._cache[name] = value
        return value

    def _read(self, name: str) -> Any:
        raw = self.user_settings.get(name)
        default = DEFAULTS[name]
        if name == "SCHEDULER_INTERVAL" and raw == 0:
            return 0.0  # the workers leave the scheduler to django-q2's cluster (every 30 s)
        if name in NUMERIC_DEFAULTS:
            return _positive_number(raw, default)
        if name == "MAX_CONCURRENT_PER_PARENT":
            if isinstance(raw, str):
                raw = import_string(raw)()
            return int(_positive_number(raw, default))
        if name in ("WORKER_SLOTS", "MODEL_MAX_CONNECTIONS"):
            given = _positive_number(raw, None)
            return int(given) if given else None
        if name == "PARK_AFTER":
            return 0 if raw == 0 else _positive_number(raw, default)
        if name in ZERO_ALLOWED:
            return int(raw) if isinstance(raw, int) and raw >= 0 else default
        if name in ENVIRONMENT_FALLBACKS:
            # The environment is read when a value is needed, never at import time.
            return raw or os.environ.get(ENVIRONMENT_FALLBACKS[name]) or None
        if name == "RETENTION":
            # Each age that is missing, None or not positive reads as its default.
            given = raw if isinstance(raw, dict) else {}
            return {key: _positive_number(given.get(key), value) for key, value in default.items()}
        if name in ("FILES", "DEFAULT_HITL", "DEFAULT_BUDGET"):
            merged = {**default, **(raw or {})}
            if name == "DEFAULT_HITL":
                # Every approval and question lapses: a missing, None or non-positive timeout
                # reads as the default (so every action has a deadline, and REST an expiresAt).
                merged["timeout_minutes"] = _positive_number(
                    merged.get("timeout_minutes"), default["timeout_minutes"]
                )
            return merged
        if raw is None:
            return default
        return raw

    def hook(self, table: str, kind: str):
        """Return the callable registered for `kind` in CONTINUE or DESCRIBE_STATE, or None."""
        path = (getattr(self, table) or {}).get(kind)  # "" is the kind of plain tasks
        return import_string(path) if isinstance(path, str) else path

    def reload(self) -> None:
        self._cache.clear()


def _positive_number(value, default):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return default
    return value


app_settings = AppSettings()


def _reload(*, setting, **kwargs):
    if setting == "AGENTTASKS":
        app_settings.reload()


setting_changed.connect(_reload)
