from django.apps import AppConfig
from django.conf import settings
from django.db.backends.signals import connection_created
from django.db.models.signals import post_delete, pre_delete


def _delete_users_work(sender, instance, **kwargs):
    from . import lifecycle  # lazily: apps.py is imported before any model can be

    lifecycle.delete_owned_by(instance)


class AgentTasksConfig(AppConfig):
    name = "agenttasks"
    verbose_name = "Agent tasks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # Imported here, not at the top: they import models, which exist only once apps load.
        from . import checks  # noqa: F401  (registers the system checks)
        from .broker import queue
        from .compat import django_q
        from .execution import clock, forking, reaper, worker

        # django-q2 forks its workers from a process that may hold pooled connections.
        forking.install_fork_guard()

        # Traces, when TRACING is on (the `otel` extra): before any request or run starts.
        from . import tracing

        tracing.setup()

        # Deleting a user stops their work and removes their files before the rows cascade.
        pre_delete.connect(
            _delete_users_work, sender=settings.AUTH_USER_MODEL, dispatch_uid="agenttasks.user"
        )

        # A database restart ends every pooled connection: the first check to find a dead one
        # drains the pool (docs/operating.md#surviving-a-database-restart).
        from .compat import psycopg_pool

        connection_created.connect(
            psycopg_pool.drain_when_checks_fail, dispatch_uid="agenttasks.pool"
        )

        # Each django-q2 worker process holds many runs in flight, one per slot, and runs the
        # reaper at start and then every REAP_INTERVAL.
        queue.on_worker_start(worker.start_pool)
        queue.on_worker_start(reaper.start_ticker)
        # Schedules: each worker process runs django-q2's scheduler every SCHEDULER_INTERVAL,
        # and a fired schedule row is re-armed for its next tick in the scheduler's transaction.
        queue.on_worker_start(clock.start_clock)
        from .lifecycle import schedules

        queue.on_schedule_fired(schedules.FIRE, schedules.rearm)
        post_delete.connect(
            schedules.forget_row, sender="agenttasks.Schedule", dispatch_uid="agenttasks.schedule"
        )
        # A SIGTERM to qcluster's process group could hang django-q2's stop: bound it. A worker
        # killed holding its timer's lock could stop the guard for good: it waits no longer.
        django_q.bound_cluster_stop(worker.shutdown_grace)
        django_q.guard_worker_timers()

        # A2A push notifications follow every task update (docs/a2a.md), with the `a2a` extra.
        from .a2a import available

        if available():
            from .a2a import notify

            notify.connect()
