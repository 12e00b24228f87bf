"""The model providers' limits as the cluster shares them (docs/operating.md#meeting-your-providers-limits)."""

from django.db import models


class ProviderBudget(models.Model):
    """One model endpoint's shared budget: when its next request and tokens may start.

    Every process of every node reserves its requests here (`execution.limits`), so the starts
    the cluster sends are spaced by the endpoint's rate, and a provider's "later" (429) pauses
    and slows them all.
    """

    endpoint = models.CharField("endpoint", max_length=64, primary_key=True)
    next_start = models.DateTimeField("next request at", null=True, blank=True)
    next_tokens = models.DateTimeField("tokens free at", null=True, blank=True)
    parked_lines = models.JSONField(
        "parked runs' lines",
        default=dict,
        blank=True,
        help_text="Where the line of each owner's runs of each priority parked for this "
        "endpoint ends, by `owner:priority`: a parked run comes back at its place in it.",
    )
    paused_until = models.DateTimeField(
        "paused until",
        null=True,
        blank=True,
        help_text="The provider asked for no request before this (Retry-After).",
    )
    learned_rate = models.FloatField(
        "learned requests per second",
        null=True,
        blank=True,
        help_text="The rate the provider's refusals taught (None: not limited by refusals).",
    )
    recent_rate = models.FloatField("recent requests per second", default=0)
    recent_at = models.DateTimeField("recent rate at", null=True, blank=True)
    limited_at = models.DateTimeField("last refused at", null=True, blank=True)
    refusals = models.PositiveIntegerField("refusals", default=0)
    accepted_reports = models.JSONField(
        "accepted before the first refusal",
        null=True,  # the reservation's statement makes the row without it
        blank=True,
        help_text="At the first refusal of an endpoint without a rate: when the refused request "
        "was sent, and how many of each process's requests sent in the second before it the "
        "provider accepted; summed, its limit.",
    )

    class Meta:
        verbose_name = "provider budget"
        verbose_name_plural = "provider budgets"

    def __str__(self) -> str:
        return self.endpoint


class ProviderPermit(models.Model):
    """A request in flight against an endpoint with a concurrency limit; it lapses if its holder
    dies (`expires_at`), so a killed worker never keeps a share."""

    endpoint = models.CharField("endpoint", max_length=64, db_index=True)
    expires_at = models.DateTimeField("expires")

    class Meta:
        verbose_name = "provider permit"
        verbose_name_plural = "provider permits"

    def __str__(self) -> str:
        return f"{self.endpoint} until {self.expires_at:%H:%M:%S}"
