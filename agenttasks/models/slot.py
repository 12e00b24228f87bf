from django.db import models


class Slot(models.Model):
    """One place held under a per-user cap (an open events stream, a status wait).

    A lease: the server that holds it renews it while the stream lives and deletes it at the
    end; if that server dies, the place frees itself when `expires_at` passes.
    """

    key = models.CharField("key", primary_key=True, max_length=200)  # kind:principal:number
    holder = models.CharField("holder", max_length=32)
    expires_at = models.DateTimeField("expires")

    class Meta:
        verbose_name = "slot"
        verbose_name_plural = "slots"

    def __str__(self) -> str:
        return self.key
