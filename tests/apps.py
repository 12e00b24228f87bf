from django.apps import AppConfig


class TestAgentsConfig(AppConfig):
    name = "tests"
    label = "agenttasks_tests"
    verbose_name = "agenttasks test agents"

    def ready(self):
        from . import agents

        agents.register_test_agents()
