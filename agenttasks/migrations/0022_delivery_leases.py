"""Delivery leases: `Delivery.leased_until`, until when the job that sends a callback or an A2A
push holds it. The row is deleted only after the receiver answered (or the failure is recorded),
so a worker that stops or dies mid-POST leaves it owed, and the reaper sends it again once the
lease lapsed (docs/rest.md#callbacks). The trigger of `deliveries_v1.sql` leaves it null."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("agenttasks", "0021_parked_runs_and_owner_limits"),
    ]

    operations = [
        migrations.AddField(
            model_name="delivery",
            name="leased_until",
            field=models.DateTimeField(blank=True, null=True, verbose_name="leased until"),
        ),
    ]
