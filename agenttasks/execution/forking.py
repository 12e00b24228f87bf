"""Keep database connections from crossing a fork.

django-q2 forks its sentinel, workers, pusher and monitor from the process that started the
cluster (and gunicorn forks its workers). A forked child inherits the parent's open sockets: a
persistent connection, or every connection idling in Django's connection pool. Two processes
talking over one socket read each other's results, which is data corruption, not a stall. So each
child drops what it inherited before it touches the database and opens its own.
"""

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
    """Run `forget_inherited_connections` in every child forked from now on (once per process)."""
    global _installed
    if not _installed and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=forget_inherited_connections)
        _installed = True


def is_installed() -> bool:
    """Tell whether forked children drop inherited connections."""
    return _installed
