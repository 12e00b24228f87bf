"""Every approval and question lapses: give the open ones created without a deadline one.

Before, `DEFAULT_HITL["timeout_minutes"] = None` meant "never"; now every action lapses after the
configured timeout (60 minutes by default), counted from when it was asked.
"""

from datetime import timedelta

from django.db import migrations
from django.db.models import F


def give_deadlines(apps, schema_editor):
    from agenttasks.conf import app_settings

    minutes = app_settings.DEFAULT_HITL["timeout_minutes"]
    PendingAction = apps.get_model("agenttasks", "PendingAction")
    PendingAction.objects.filter(status="pending", deadline__isnull=True).update(
        deadline=F("created_at") + timedelta(minutes=minutes)
    )


class Migration(migrations.Migration):
    dependencies = [("agenttasks", "0007_slot")]

    operations = [migrations.RunPython(give_deadlines, migrations.RunPython.noop)]
