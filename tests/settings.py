"""Settings for the test suite: the demo site plus the test agents (registered by tests.apps)."""

import json
import os

# The suite's own process keeps a persistent connection per thread (its threads stand for many
# clients at once); the clusters it starts use the pool, as the demo does (tests/cluster.py).
os.environ.setdefault("DB_POOL", "0")

from project.settings import *  # noqa: E402, F403
from project.settings import INSTALLED_APPS  # noqa: E402

INSTALLED_APPS = [*INSTALLED_APPS, "tests.apps.TestAgentsConfig"]

# The demo serves metrics; the suite turns them on where it tests them (a counter written per
# run would change what other tests count).
AGENTTASKS = {**AGENTTASKS, "METRICS_ENABLED": False}  # noqa: F405

# A full-strength hash costs seconds on a loaded machine, and the suite logs users in often.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# A cluster started by a test (a subprocess) takes its AGENTTASKS overrides from the environment.
if os.environ.get("AGENTTASKS_TEST_SETTINGS"):
    AGENTTASKS = {**AGENTTASKS, **json.loads(os.environ["AGENTTASKS_TEST_SETTINGS"])}  # noqa: F405

# Each pytest process gets its own test database, so several suites can run side by side.
_TEST_SUFFIX = os.environ.get("AGENTTASKS_TEST_DB_SUFFIX") or str(os.getpid())
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):  # noqa: F405
    import tempfile

    DATABASES["default"]["TEST"] = {  # noqa: F405
        "NAME": os.path.join(tempfile.gettempdir(), f"agenttasks-test-{_TEST_SUFFIX}.sqlite3")
    }
else:
    _TEST_NAME = DATABASES["default"]["TEST"]["NAME"]  # noqa: F405
    DATABASES["default"]["TEST"] = {"NAME": f"{_TEST_NAME}_{_TEST_SUFFIX}"}  # noqa: F405
