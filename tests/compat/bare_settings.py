"""A site with django-q2 and without agenttasks: its failures as upstream ships them."""

import os

SECRET_KEY = "bare"
INSTALLED_APPS = ["django_q"]
USE_TZ = True
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ["BARE_DATABASE"],
        "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20},
    }
}

Q_CLUSTER = {"name": "bare", "orm": "default", "workers": 2, "timeout": 30, "retry": 60}
