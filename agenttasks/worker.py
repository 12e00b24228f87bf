"""Execute one run on a django-q2 worker: the job queue.py enqueues.

A second delivery of the same run is a no-op (the claim is a compare-and-set); the run driver
does the rest.
"""

import logging

from . import store
from .exceptions import RunNotFound
from .runtime.driver import drive, reconnecting, worker_identity

logger = logging.getLogger(__name__)


def execute_run(run_id: str) -> None:
    """Claim a queued run and execute it (the django-q2 job enqueued by queue.py).

    django-q2 closes stale database connections before every job; nothing else is needed here.
    """
    worker = worker_identity()
    try:
        run = reconnecting(lambda: store.claim(run_id, worker))
    except RunNotFound:
        logger.info("worker.run_gone run=%s", run_id)
        return
    if not run:
        logger.debug("worker.not_claimed run=%s", run_id)
        return
    drive(run, worker)
