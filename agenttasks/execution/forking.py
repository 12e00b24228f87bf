"""Keep database connections from crossing a fork, and memory shared across it.

django-q2 forks its sentinel, workers, pusher and monitor from the process that started the
cluster (and gunicorn forks its workers). A forked child inherits the parent's open sockets: a
persistent connection, or every connection idling in Django's connection pool. Two processes
talking over one socket read each other's results, which is data corruption, not a stall. So each
child drops what it inherited before it touches the database and opens its own.
"""

import gc
import os

from django.db import connections

# The parent's pools, kept alive in the child so that nothing ever closes them from here:
# closing would end the parent's sessions over the shared sockets.
_inherited_pools: list = []
_installed = False


def pool_registry(wrapper) -> dict | None:
    """Return the class-wide pool table of Django's PostgreSQL backend, or None for others."""
    return getattr(type(wrapper), "_connection_pools", None)


def forget_inherited_connections() -> None:
    """Drop the connections and pools this process inherited, without closing them."""
    for wrapper in connections.all():
        # Not close(): psycopg would send Terminate on the parent's socket.
        wrapper.connection = None
        wrapper.close_at = None
        wrapper.in_atomic_block = False
        wrapper.savepoint_ids = []
        wrapper.needs_rollback = False
        wrapper.run_on_commit = []
        pools = pool_registry(wrapper)
        if pools:
            _inherited_pools.extend(pools.values())
            pools.clear()


def install_fork_guard() -> None:
    """Run `forget_inherited_connections` in every child forked from now on, and freeze the
    garbage collector's objects for each fork (once per process)."""
    global _installed
    if not _installed and hasattr(os, "register_at_fork"):
        # Frozen for the fork, the parent's objects are left alone by the child's garbage
        # collections, so the memory pages holding them stay shared instead of being copied;
        # the parent collects as before.
        os.register_at_fork(
            before=gc.freeze,
            after_in_parent=gc.unfreeze,
            after_in_child=forget_inherited_connections,
        )
        _installed = True


def is_installed() -> bool:
    """Tell whether forked children drop inherited connections."""
    return _installed
