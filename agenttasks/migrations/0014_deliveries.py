"""The deliveries an ending owes (callbacks, A2A pushes), as outbox rows written with the ending.

- `Delivery`: one row per owed POST, deleted by the job that claims it; the reaper sends again
  what stays overdue.
- PostgreSQL: the trigger `agenttasks_owe_deliveries` writes them in the statement that moves a
  task into a notified status, the SQL functions' endings included
  (`agenttasks/migrations/frozen/deliveries_v1.sql`). On other databases the store's ORM path writes them.
"""

import django.db.models.deletion
from django.db import migrations, models

from agenttasks.sql import frozen, on_postgres

DROP_V1 = """
DROP TRIGGER IF EXISTS agenttasks_owe_deliveries ON agenttasks_task;
DROP FUNCTION IF EXISTS agenttasks_owe_deliveries_v1();
"""


def install() -> str:
    return frozen("deliveries_v1.sql")


class Migration(migrations.Migration):

    dependencies = [
        ('agenttasks', '0013_in_flight'),
    ]

    operations = [
        migrations.CreateModel(
            name='Delivery',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('status', models.CharField(choices=[('pending', 'pending'), ('running', 'running'), ('waiting_for_input', 'waiting for input'), ('completed', 'completed'), ('failed', 'failed'), ('cancelled', 'cancelled')], max_length=32, verbose_name='status')),
                ('version', models.PositiveIntegerField(verbose_name='task version')),
                ('attempts', models.PositiveIntegerField(default=0, verbose_name='sent again')),
                ('due_at', models.DateTimeField(db_index=True, verbose_name='due')),
                ('config', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='deliveries', to='agenttasks.a2apushconfig', verbose_name='push config')),
                ('task', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='deliveries', to='agenttasks.task', verbose_name='task')),
            ],
            options={
                'verbose_name': 'delivery owed',
                'verbose_name_plural': 'deliveries owed',
            },
        ),
        migrations.RunPython(on_postgres(install), on_postgres(DROP_V1)),
    ]
