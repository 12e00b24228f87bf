"""A pooled connection is tried (a round trip) only when something arrived on it while it was
idle, and the first one found dead drains the pool (agenttasks.compat.psycopg_pool)."""

from types import SimpleNamespace

import pytest
from django.db import connection
from psycopg_pool import ConnectionPool

from agenttasks.compat.psycopg_pool import drain_when_checks_fail

from ..conftest import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


@pytest.fixture
def pool():
    tried: list[int] = []

    def check(conn):
        tried.append(conn.info.backend_pid)
        ConnectionPool.check_connection(conn)

    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    made = ConnectionPool(
        kwargs={**params, "autocommit": True}, min_size=1, max_size=1, check=check, open=True
    )
    drain_when_checks_fail(None, SimpleNamespace(pool=made))
    made.tried = tried
    yield made
    made.close()


def test_a_connection_handed_out_again_is_not_tried_while_nothing_arrived_on_it(pool):
    for _ in range(3):
        with pool.connection() as conn:
            conn.execute("SELECT 1")
    assert pool.tried == []


def test_a_connection_the_server_ended_is_tried_and_the_pool_hands_out_a_live_one(pool):
    with pool.connection() as conn:
        dead = conn.info.backend_pid
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [dead])
    # The goodbye is on its way once the backend is gone (terminate returns before it leaves).
    wait_for(lambda: not listed(dead), 10, message="the backend to end")
    with pool.connection(timeout=10) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        assert conn.info.backend_pid != dead
    assert pool.tried[0] == dead


def listed(pid: int) -> bool:
    """Say whether the backend `pid` is still listed in pg_stat_activity."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
        return cursor.fetchone()[0] > 0
