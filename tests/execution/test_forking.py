"""Forked processes never share the parent's database connections or pool, and share its memory."""

import gc
import os
import subprocess
import sys

import pytest
from django.db import connection
from django.db.backends.sqlite3.base import DatabaseWrapper as SQLiteWrapper
from django.test import override_settings

from agenttasks.checks import check_fork_safety, unresettable_pools
from agenttasks.execution import forking
from agenttasks.models import Task

from ..conftest import on_postgres, wait_for


def backend_identity() -> str:
    """Name the server session (PostgreSQL) or the connection object (SQLite) in use."""
    if on_postgres():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            return str(cursor.fetchone()[0])
    connection.ensure_connection()
    return str(id(connection.connection))


@pytest.mark.django_db(transaction=True)
def test_a_forked_child_opens_its_own_connection():
    parent = backend_identity()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what it talks to, then leave without any cleanup
        try:
            inherited = connection.connection is None
            os.write(write, f"{inherited} {backend_identity()}".encode())
        finally:
            os._exit(0)
    os.close(write)
    answer = os.read(read, 100).decode()
    os.waitpid(pid, 0)
    dropped, child = answer.split()
    assert dropped == "True"
    if on_postgres():
        assert child != parent
    # The parent's session is intact: the child did not end it over the shared socket.
    assert backend_identity() == parent


def test_a_forked_child_has_the_parents_objects_frozen_and_the_parent_collects_as_before():
    before = gc.get_freeze_count()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(write, str(gc.get_freeze_count()).encode())
        finally:
            os._exit(0)
    os.close(write)
    in_child = int(os.read(read, 100).decode())
    os.waitpid(pid, 0)
    # The child's collections leave the parent's objects, and so their memory pages, alone.
    assert in_child > before
    assert gc.get_freeze_count() == before


def test_a_process_on_another_broker_never_loads_redis():
    # Asked in each process of a cluster (the budgets' store), the question must not load the
    # redis package: about 7 MiB more in every process, shared by none.
    asked = (
        "import sys, django; django.setup()\n"
        "from agenttasks.broker import queue; from agenttasks.flow import budgets\n"
        "print(queue.uses_redis(), budgets.in_redis(), 'redis' in sys.modules)"
    )
    # On the embedded database, whatever the suite's: making the broker connects to no server.
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    answer = subprocess.run(
        [sys.executable, "-c", asked], env=env, capture_output=True, text=True, check=True
    )
    uses_redis, budgets_in_redis, loaded = answer.stdout.split()
    if uses_redis == "True":
        pytest.skip("the tests run on django-q2's Redis broker")
    assert (budgets_in_redis, loaded) == ("False", "False")


def test_the_guard_is_installed_when_the_app_is_ready():
    assert forking.is_installed()


def wrapper(engine_class, options) -> object:
    return engine_class({"ENGINE": "", "NAME": "x", "OPTIONS": options}, alias="pooled")


def test_a_pool_agenttasks_cannot_reset_is_an_error():
    class ForeignPool(SQLiteWrapper):
        """A third-party backend with a pool of its own."""

    assert unresettable_pools([wrapper(ForeignPool, {"pool": True})]) == ["pooled"]
    assert unresettable_pools([wrapper(ForeignPool, {})]) == []


def test_djangos_own_pool_passes_the_check():
    pytest.importorskip("psycopg")
    from django.db.backends.postgresql.base import DatabaseWrapper

    assert unresettable_pools([wrapper(DatabaseWrapper, {"pool": True})]) == []
    assert [m.id for m in check_fork_safety()] == []


@pytest.mark.postgres
@override_settings(AGENTTASKS={"MAX_ACTIVE_TASKS_PER_USER": 0})
def test_a_cluster_with_the_pooled_settings_completes_every_task(start_cluster, user):
    from agenttasks import lifecycle

    cluster = start_cluster(workers=2, env={"DB_POOL": "1"})
    ids = [lifecycle.create(owner=user, agent_id="echo", input=f"hi {i}").id for i in range(200)]
    wait_for(
        lambda: Task.objects.filter(pk__in=ids, status="completed").count() == len(ids),
        timeout=60,
        interval=0.2,
        message="200 echo tasks completed by a pooled cluster",
    )
    assert "Traceback" not in cluster.log()
