"""Files: the agent's file policy and Django storage."""

import logging

from django.core.files.storage import storages
from django.db import transaction

from .conf import app_settings

logger = logging.getLogger(__name__)


def storage():
    """Return the storage files are kept in (AGENTTASKS["FILE_STORAGE"])."""
    return storages[app_settings.FILE_STORAGE]


def remove_stored(names) -> None:
    """Delete stored bytes once the current transaction commits."""

    def remove():
        for name in names:
            try:
                storage().delete(name)
            except Exception:
                logger.exception("files.remove_failed name=%s", name)

    transaction.on_commit(remove)
