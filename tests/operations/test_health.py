"""GET /api/agents/health: ok or degraded for anyone, details for staff or HEALTH_TOKEN."""

import base64
import os
import re
import socket
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import OperationalError, connection
from django.test.utils import override_settings
from django.utils import timezone
from rest_framework.authtoken.models import Token

from agenttasks import store
from agenttasks.models import ProviderBudget, ReaperPass, Run
from agenttasks.operations import health
from agenttasks.types import NewTask

from ..conftest import wait_for

URL = "/api/agents/health"
pytestmark = pytest.mark.django_db


def test_without_a_reaper_pass_it_is_degraded(client):
    response = client.get(URL)
    assert response.status_code == 503
    assert response.json() == {
        "status": "degraded",
        "reasons": ["no reaper pass recorded: is a cluster (manage.py qcluster) running?"],
    }


def test_after_a_pass_it_is_ok_fast_and_says_no_more_to_anyone(
    client, django_assert_max_num_queries
):
    health.record_pass()  # what reaper.reap() does after each pass
    with django_assert_max_num_queries(1):
        response = client.get(URL)
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert response["Cache-Control"] == "no-store"


def test_an_old_pass_is_degraded(client):
    health.record_pass()  # what reaper.reap() does after each pass
    ReaperPass.objects.update(finished_at=timezone.now() - timedelta(seconds=31))
    response = client.get(URL)
    assert response.status_code == 503
    (reason,) = response.json()["reasons"]
    assert reason.startswith("no reaper pass within 30 s (the last was 3")  # REAP_INTERVAL 10
    with override_settings(AGENTTASKS={"REAP_INTERVAL": 20}):
        assert client.get(URL).status_code == 200


def _workload(user):
    """Two queued runs (one queued 2 minutes ago), one running with an expired lease."""
    queued = [store.create_task(NewTask(owner=user, agent="echo", input=str(i))) for i in range(3)]
    Run.objects.filter(pk=queued[0].run_id).update(queued_at=timezone.now() - timedelta(minutes=2))
    store.claim(queued[2].run_id, "gone")
    Run.objects.filter(pk=queued[2].run_id).update(
        heartbeat_at=timezone.now() - timedelta(minutes=5)
    )


def test_staff_get_the_details_in_three_queries(admin_client, user, django_assert_max_num_queries):
    _workload(user)
    reaper_pass = ReaperPass.objects.create(
        name="reaper", node="node-7:42", finished_at=timezone.now() - timedelta(seconds=4)
    )
    with django_assert_max_num_queries(3):  # the session, the user, and one statement
        response = admin_client.get(URL)
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    details = body["details"]
    assert details["reaper"]["node"] == reaper_pass.node
    assert 4 <= details["reaper"]["lastPassAgeSeconds"] < 10
    assert details["queue"]["queued"] == 2
    assert 120 <= details["queue"]["oldestQueuedAgeSeconds"] < 130
    assert details["leases"] == {"expired": 1}
    assert 0 < details["database"]["roundTripMs"] < 100


def test_a_model_endpoint_at_its_limit_is_said_without_changing_the_status(
    client, admin_client, django_assert_max_num_queries
):
    health.record_pass()
    ProviderBudget.objects.create(endpoint="calm", next_start=timezone.now() + timedelta(seconds=2))
    assert client.get(URL).json() == {"status": "ok"}  # a short wait is not being at the limit
    ProviderBudget.objects.create(endpoint="busy", next_start=timezone.now() + timedelta(minutes=1))
    with django_assert_max_num_queries(1):
        response = client.get(URL)
    assert response.status_code == 200
    body = response.json()
    said = re.fullmatch(
        r'model endpoint "busy" is at its limit: a new request waits ([\d.]+) s', body["limited"]
    )
    assert said and 55 < float(said[1]) < 65, body["limited"]  # the clocks read a moment apart
    details = admin_client.get(URL).json()["details"]
    assert 55 < details["limits"]["longestWaitSeconds"] < 65


def test_a_staff_token_or_basic_login_gets_the_details_and_no_one_else(client, user):
    """Details come with any staff authentication the API accepts, not only a session."""
    health.record_pass()
    staff = get_user_model().objects.create_user("ops", password="ops-password", is_staff=True)
    for who, key in ((staff, "staff"), (user, "plain")):
        token = Token.objects.create(user=who).key
        body = client.get(URL, HTTP_AUTHORIZATION=f"Token {token}").json()
        assert ("details" in body) is (key == "staff"), key
    basic = base64.b64encode(b"ops:ops-password").decode()
    with override_settings(
        AGENTTASKS={"AUTHENTICATION_CLASSES": ["rest_framework.authentication.BasicAuthentication"]}
    ):
        assert "details" in client.get(URL, HTTP_AUTHORIZATION=f"Basic {basic}").json()
    bad = client.get(URL, HTTP_AUTHORIZATION="Token nope")
    assert bad.status_code == 200 and "details" not in bad.json()


def test_the_health_token_gets_the_details(client, user):
    health.record_pass()  # what reaper.reap() does after each pass
    with override_settings(AGENTTASKS={"HEALTH_TOKEN": "s3cret"}):
        body = client.get(URL, HTTP_AUTHORIZATION="Bearer s3cret").json()
        assert body["details"]["reaper"]["node"] == f"{socket.gethostname()}:{os.getpid()}"
        assert body["details"]["queue"] == {"queued": 0, "oldestQueuedAgeSeconds": None}
        assert "details" not in client.get(URL, HTTP_AUTHORIZATION="Bearer wrong").json()
        assert "details" not in client.get(URL).json()
    # Without a HEALTH_TOKEN no bearer token opens the details.
    assert "details" not in client.get(URL, HTTP_AUTHORIZATION="Bearer ").json()


def test_an_unreachable_database_is_degraded(client):
    health.record_pass()  # what reaper.reap() does after each pass

    def refuse(execute, sql, params, many, context):
        raise OperationalError("connection refused")

    with connection.execute_wrapper(refuse):
        response = client.get(URL)
    assert response.status_code == 503
    assert response.json() == {
        "status": "degraded",
        "reasons": ["database unreachable: connection refused"],
    }


def test_only_reads(client):
    assert client.post(URL).status_code == 405


@pytest.mark.django_db(transaction=True)
def test_a_running_cluster_keeps_it_healthy(start_cluster, client):
    assert client.get(URL).status_code == 503
    cluster = start_cluster(workers=1, REAP_INTERVAL=1)
    wait_for(lambda: client.get(URL).status_code == 200, timeout=20, message="a reaper pass")
    node = ReaperPass.objects.get().node
    assert int(node.rsplit(":", 1)[1]) in cluster.started_worker_pids()
