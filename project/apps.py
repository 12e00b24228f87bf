from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "project"
    verbose_name = "agenttasks demo"

    def ready(self):
        from . import agents

        agents.register_demo_agents()
