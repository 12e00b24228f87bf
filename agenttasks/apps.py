from django.apps import AppConfig


class AgentTasksConfig(AppConfig):
    name = "agenttasks"
    verbose_name = "Agent tasks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from . import (
            checks,  # noqa: F401  (registers the system checks)
            forking,
            queue,
            reaper,
        )

        # django-q2 forks its workers from a process that may hold pooled connections.
        forking.install_fork_guard()

        # Each django-q2 worker process runs the reaper at start and then every REAP_INTERVAL.
        queue.on_worker_start(reaper.start_ticker)
