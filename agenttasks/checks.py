"""System checks: required apps, AGENTTASKS keys and hooks, agents, django-q2 and database setup."""

from django.apps import apps
from django.conf import settings
from django.core.checks import Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.utils.module_loading import import_string

from . import registry
from .compat import django_q
from .conf import DEFAULTS, app_settings
from .execution import forking
from .execution.worker import slots_per_process
from .flow import budgets

REQUIRED_APPS = ("rest_framework", "django_q")


@register(Tags.compatibility)
def check_required_apps(app_configs=None, **kwargs):
    """Check that every app agenttasks relies on is installed."""
    return [
        Error(
            f"agenttasks needs {name!r} in INSTALLED_APPS.",
            hint=f"Add {name!r} to INSTALLED_APPS.",
            id="agenttasks.E001",
        )
        for name in REQUIRED_APPS
        if not apps.is_installed(name)
    ]


@register()
def check_settings(app_configs=None, **kwargs):
    """AGENTTASKS holds only known keys, and its hooks import."""
    messages = []
    user = getattr(settings, "AGENTTASKS", None) or {}
    if not isinstance(user, dict):
        return [Error("AGENTTASKS must be a dict.", id="agenttasks.E002")]
    for key in sorted(set(user) - set(DEFAULTS)):
        hint = "The approval timeouts are DEFAULT_HITL." if key == "HITL" else None
        messages.append(
            Warning(
                f"Unknown AGENTTASKS key {key!r}: it is ignored.", hint=hint, id="agenttasks.W001"
            )
        )
    for table in ("CONTINUE", "DESCRIBE_STATE"):
        for kind, path in (user.get(table) or {}).items():
            if isinstance(path, str):
                try:
                    import_string(path)
                except ImportError as exc:
                    messages.append(
                        Error(
                            f"AGENTTASKS[{table!r}][{kind!r}] cannot be imported: {exc}",
                            id="agenttasks.E003",
                        )
                    )
    if app_settings.LEASE_TIMEOUT <= 2 * app_settings.HEARTBEAT_INTERVAL:
        messages.append(
            Warning(
                "AGENTTASKS LEASE_TIMEOUT should be more than twice HEARTBEAT_INTERVAL, "
                "or a slow heartbeat makes a live run look dead.",
                id="agenttasks.W002",
            )
        )
    return messages


@register()
def check_agents(app_configs=None, **kwargs):
    """Check that every agent definition loads; warn about what will not work as written."""
    registry.reset()
    try:
        agents = registry.agents()
    except ImproperlyConfigured as exc:
        return [Error(str(exc), id="agenttasks.E004")]
    messages = []
    known = {a.id for a in agents}
    for agent in agents:
        for member in agent.team:
            if member not in known:
                messages.append(
                    Warning(
                        f"agent {agent.id!r}: team member {member!r} is not registered.",
                        id="agenttasks.W003",
                    )
                )
        if agent.runtime == "callable" and (agent.team or agent.tools):
            messages.append(
                Warning(
                    f"agent {agent.id!r}: team and tools have no effect on a callable agent.",
                    id="agenttasks.W004",
                )
            )
        if agent.runtime == "chat" and not app_settings.MODEL_BASE_URL:
            messages.append(
                Warning(
                    f"agent {agent.id!r}: chat agents need MODEL_BASE_URL.",
                    hint="Set AGENTTASKS['MODEL_BASE_URL'] or AGENTTASKS_MODEL_BASE_URL.",
                    id="agenttasks.W005",
                )
            )
        elif (
            agent.runtime == "chat"
            and agent.model in ("", "inherit")
            and not app_settings.DEFAULT_MODEL
        ):
            messages.append(
                Warning(
                    f"agent {agent.id!r}: its model is 'inherit' but DEFAULT_MODEL is unset.",
                    id="agenttasks.W006",
                )
            )
    return messages


@register()
def check_cluster(app_configs=None, **kwargs):
    """django-q2 re-delivers a job only after it could have timed out."""
    q = getattr(settings, "Q_CLUSTER", None) or {}
    timeout, retry = q.get("timeout"), q.get("retry")
    if timeout is not None and retry is not None and retry <= timeout:
        return [
            Warning(
                "Q_CLUSTER['retry'] should be greater than Q_CLUSTER['timeout'], or django-q2 "
                "delivers a job again while it is still running.",
                id="agenttasks.W007",
            )
        ]
    return []


# The two database checks read only the settings, so they run with a plain `manage.py check`
# (a check tagged `database` runs only with `--database`).
@register()
def check_worker_connections(app_configs=None, **kwargs):
    """On PostgreSQL a worker process's runs in flight share a pool of connections."""
    conn = connections["default"]
    if conn.vendor != "postgresql" or (conn.settings_dict.get("OPTIONS") or {}).get("pool"):
        return []
    slots = slots_per_process()
    if slots <= 1:
        return []
    return [
        Warning(
            f"Database 'default' is PostgreSQL without a connection pool, and each worker "
            f"process holds up to {slots} runs in flight (WORKER_SLOTS): each of them connects "
            "again whenever it talks to the database after waiting.",
            hint='Set DATABASES["default"]["OPTIONS"]["pool"] (Django\'s psycopg pool) in the '
            "settings that qcluster runs with (the README says how to size it).",
            id="agenttasks.W010",
        )
    ]


@register()
def check_connection_health(app_configs=None, **kwargs):
    """On PostgreSQL, reused connections are checked before use: a restart leaves them dead."""
    return [
        Warning(
            f"Database {conn.alias!r} reuses PostgreSQL connections (a pool or CONN_MAX_AGE) "
            "without CONN_HEALTH_CHECKS: after a database restart, each dead connection fails "
            "the request or the run that is handed it.",
            hint=f'Set DATABASES["{conn.alias}"]["CONN_HEALTH_CHECKS"] = True (the pool then '
            "checks a connection before it hands it out).",
            id="agenttasks.W011",
        )
        for conn in connections.all(initialized_only=False)
        if conn.vendor == "postgresql"
        and not conn.settings_dict.get("CONN_HEALTH_CHECKS")
        and (
            (conn.settings_dict.get("OPTIONS") or {}).get("pool")
            or conn.settings_dict.get("CONN_MAX_AGE")
        )
    ]


SQLITE_OPTIONS = (
    '"OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20, '
    '"init_command": "PRAGMA journal_mode=WAL;"}'
)


@register()
def check_sqlite(app_configs=None, **kwargs):
    """On SQLite, transactions must take the write lock at BEGIN for the store's checks to hold."""
    return [
        Warning(
            f"Database {conn.alias!r} is SQLite without transaction_mode IMMEDIATE.",
            hint=f"Set {SQLITE_OPTIONS}: every transaction then takes the write lock at BEGIN "
            "(the store's compare-and-set checks are exact), and processes wait for each "
            'other instead of failing with "database is locked".',
            id="agenttasks.W008",
        )
        for conn in connections.all(initialized_only=False)
        if conn.vendor == "sqlite"
        and (conn.settings_dict.get("OPTIONS") or {}).get("transaction_mode") != "IMMEDIATE"
    ]


def unresettable_pools(wrappers) -> list[str]:
    """Return the aliases whose connection pool a forked worker could not drop."""
    return [
        wrapper.alias
        for wrapper in wrappers
        if (wrapper.settings_dict.get("OPTIONS") or {}).get("pool")
        and (forking.pool_registry(wrapper) is None or not forking.is_installed())
    ]


@register()
def check_fork_safety(app_configs=None, **kwargs):
    """Check that the processes django-q2 forks share no connection."""
    return [
        Error(
            f"Database {alias!r} uses a connection pool that agenttasks cannot reset in the "
            "processes django-q2 forks: they would share its connections.",
            hint="Use Django's own PostgreSQL pool (OPTIONS['pool']), or no pool in the "
            "settings that qcluster runs with.",
            id="agenttasks.E005",
        )
        for alias in unresettable_pools(connections.all())
    ]


@register()
def check_model_limits(app_configs=None, **kwargs):
    """Check MODEL_LIMITS (a dict of endpoint names to positive limits) and BUDGET_STORE."""
    return [
        Error(
            problem,
            hint="See docs/operating.md#meeting-your-providers-limits.",
            id="agenttasks.E007",
        )
        for problem in budgets.problems(app_settings.MODEL_LIMITS)
        + budgets.store_problems(app_settings.BUDGET_STORE)
    ]


@register()
def check_tracing(app_configs=None, **kwargs):
    """Check that TRACING has the `otel` extra it needs."""
    from . import tracing

    if not app_settings.TRACING:
        return []
    absent = tracing.missing()
    if not absent:
        return []
    return [
        Error(
            f"TRACING is on, but {', '.join(absent)} cannot be imported.",
            hint="pip install 'agenttasks[otel]' (docs/operating.md#traces).",
            id="agenttasks.E008",
        )
    ]


@register(Tags.compatibility)
def check_django_q_internals(app_configs=None, **kwargs):
    """Check that django-q2 still has the internals agenttasks' guards patch (compat/django_q.py)."""
    gone = django_q.missing()
    if not gone:
        return []
    return [
        Error(
            "agenttasks cannot guard this django-q2 release's workers: " + ", ".join(gone) + ".",
            hint="Install a django-q2 release agenttasks was verified with: "
            + ", ".join(django_q.VERIFIED)
            + ".",
            id="agenttasks.E006",
        )
    ]
