"""docs/rest.md, scenario 8: schemathesis against the served OpenAPI document.

A live server (Django's threaded WSGI server, as runserver) and a real django-q2 cluster on the
test database. Every operation but the stream gets generated requests in three phases: valid
data, mutated (negative) data, and valid data aimed at alice's real task, conversation, action
and file. Every answer must conform to the document (status, content type, schema), be no 5xx,
and every non-2xx answer must be the error envelope with a code of docs/rest.md#errors.
"""

import os

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from rest_framework.authtoken.models import Token
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from agenttasks.models import Task

from .conftest import ALLOW_LOOPBACK, agenttasks, b64

pytestmark = pytest.mark.django_db(transaction=True)

CODES = {
    "VALIDATION_ERROR",
    "INVALID_REQUEST",
    "file_too_large",
    "identity_required",
    "FORBIDDEN",
    "attachments_disabled",
    "NOT_FOUND",
    "METHOD_NOT_ALLOWED",
    "too_many_files",
    "task_busy",
    "action_pending",
    "task_finished",
    "task_not_retryable",
    "retry_limit",
    "task_limit",
    "retry_conflict",
    "conversation_busy",
    "run_started",
    "action_resolved",
    "unsupported_media_type",
    "rate_limited",
    "idempotency_key_reused",
    "idempotency_key_in_progress",
}
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
# AGENTTASKS_FUZZ_SCALE multiplies the cases (`make fuzz`; the default keeps `make test` short).
SCALE = float(os.environ.get("AGENTTASKS_FUZZ_SCALE") or 1)
EXAMPLES = {
    mode: max(1, round(count * SCALE))
    for mode, count in {
        GenerationMode.POSITIVE: 14,
        GenerationMode.NEGATIVE: 12,
        "real": 10,
    }.items()
}


def real_resources(api) -> dict:
    """alice's task (with a file), its conversation, a pending approval and a schedule."""
    task = api.create(
        "docs", "hello", files=[{"name": "a.txt", "content": b64(b"abc"), "mimeType": "text/plain"}]
    )
    paused = api.create("approver", "prod")
    action = (
        api.wait_status(paused["id"], "waiting_for_input", timeout=30)
        and (api.task(paused["id"])["pendingActions"][0])
    )
    schedule = api.post("/schedules", {"agentId": "echo", "input": "x", "intervalSeconds": 3600})
    return {
        "scheduleId": schedule.json()["schedule"]["id"],
        "runId": Task.objects.get(pk=task["id"]).run_id,
        "taskId": task["id"],
        "conversationId": task["conversationId"],
        "fileId": task["files"][0]["id"],
        "actionId": action["id"],
        "agentId": "echo",
        "_paused": paused["conversationId"],
    }


def fuzz(strategy, count: int, label: str, run) -> None:
    """Call `run(case, label)` on up to `count` cases the strategy generates."""

    @settings(
        max_examples=count,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def cases(case):
        run(case, label)

    try:
        cases()
    except Unsatisfiable:
        # Nothing to mutate (an operation without parameters or body has no negative cases).
        assert label == str(GenerationMode.NEGATIVE)


def test_rest_12_08_never_a_500_for_bad_input(live_server, start_cluster, as_alice, alice):
    cluster_settings = {**ALLOW_LOOPBACK, "MAX_STATUS_WAIT": 1}
    start_cluster(**cluster_settings)
    token = Token.objects.get(user=alice).key
    base = live_server.url + "/api/agents"
    schema = schemathesis.openapi.from_url(base + "/docs/openapi.json")
    operations = [
        result.ok()
        for result in schema.get_all_operations()
        if not result.ok().label.endswith("/events/stream")
    ]
    # Every operation but the stream; schemathesis leaves out the document's own URL.
    assert len(operations) == 36
    real = real_resources(as_alice)
    session = requests.Session()
    headers = {"Authorization": f"Token {token}"}
    counted: dict[str, int] = {}
    failures: list[str] = []

    def run(case, label):
        response = case.call(base_url=base, session=session, headers=headers, timeout=30)
        counted[label] = counted.get(label, 0) + 1
        try:
            case.validate_response(response, checks=CHECKS, headers=headers)
        except Exception as exc:  # noqa: BLE001 (collected and reported together)
            failures.append(f"{case.method} {case.formatted_path}: {exc}")
            return
        if not 200 <= response.status_code < 300:
            body = response.json()
            if set(body) != {"error"} or body["error"].get("code") not in CODES:
                failures.append(f"{case.method} {case.formatted_path}: not an envelope: {body}")

    with agenttasks(**cluster_settings):
        for operation in operations:
            names = {p.name for p in operation.path_parameters}
            for mode, count in EXAMPLES.items():
                if mode == "real":
                    if not names:
                        continue
                    fixed = {n: real[n] for n in names}
                    if "actionId" in names:  # the action lives in the paused task's conversation
                        fixed["conversationId"] = real["_paused"]
                    strategy = operation.as_strategy(path_parameters=fixed)
                else:
                    strategy = operation.as_strategy(generation_mode=mode)

                fuzz(strategy, count, str(mode), run)
    total = sum(counted.values())
    print(f"schemathesis cases: {total} {counted}")
    assert failures == [], "\n".join(failures[:20])
    assert total >= 500 * min(SCALE, 1), counted
