from django.apps import AppConfig


class AgentTasksConfig(AppConfig):
    name = "agenttasks"
    verbose_name = "Agent tasks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from . import checks  # noqa: F401  (registers the system checks)
