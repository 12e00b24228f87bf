"""The operator admin in a real browser (Debian's Chromium, a live server, a real cluster), and
the REST API from a page of a browser logged into it."""

from pathlib import Path

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth import get_user_model
from django.db import connections
from django.urls import reverse

from agenttasks import lifecycle
from agenttasks.models import Run, Task

from ..cluster import ROOT
from ..conftest import wait_for

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]

pytestmark = [
    pytest.mark.serial,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason="/usr/bin/chromium is missing (apt-get install chromium; .ci/run installs it)",
    ),
]


@pytest.fixture
def browser(monkeypatch):
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop open in this thread, so Django would refuse the
    # test's own ORM calls as "async"; they never run inside that loop, so allow them.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()
        # Inside Playwright's context Django's connections are separate ones (asgiref locals
        # follow the context): close them, or they hold the test database open at teardown.
        connections.close_all()


def admin_path(name: str, *args) -> str:
    return reverse(f"admin:agenttasks_{name}", args=[quote(a) for a in args])


def status_of(task_id: str, statuses) -> Task | None:
    task = Task.objects.get(pk=task_id)
    return task if task.status in statuses else None


def test_operator_cancels_and_approves_in_a_browser(live_server, start_cluster, browser, tmp_path):
    from playwright.sync_api import expect

    ARTIFACTS.mkdir(exist_ok=True)
    start_cluster(HEARTBEAT_INTERVAL=1)
    operator = get_user_model().objects.create_superuser("ops", "ops@example.com", "ops-password")
    gate = lifecycle.create(
        owner=operator,
        agent_id="gate",
        input="Hold the gate until an operator stops it",
        metadata={"gate": str(tmp_path / "never")},
    )
    wait_for(lambda: status_of(gate.pk, ["running"]), timeout=30, message="the gate task runs")

    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    page.set_default_timeout(20_000)
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.fill("#id_username", "ops")
    page.fill("#id_password", "ops-password")
    page.click("input[type=submit]")
    expect(page.locator("#site-name")).to_be_visible()

    page.goto(live_server.url + admin_path("task_changelist"))
    expect(page.locator("#result_list")).to_contain_text(gate.pk)
    page.screenshot(path=ARTIFACTS / "admin-changelist.png", full_page=True)

    # Cancel the running task from its page: the status and the timeline show the stop.
    page.goto(live_server.url + admin_path("task_change", gate.pk))
    expect(page.locator("#task-status .at-badge")).to_have_text("running")
    page.click("#operations button:text-is('Cancel now')")
    expect(page.locator(".messagelist")).to_contain_text("Cancel now: 1 cancelled.")
    expect(page.locator("#task-status .at-badge")).to_have_text("cancelled")
    stop = page.locator('#timeline li[data-type="task.status"]').last
    expect(stop).to_contain_text("Status running → cancelled")
    expect(stop).to_contain_text("stopped")
    wait_for(
        lambda: Run.objects.get(pk=gate.run_id).ended_at,
        timeout=20,
        message="the worker observed the stop",
    )

    # Approve a pending action from its button: the run resumes and the task completes.
    approver = lifecycle.create(owner=operator, agent_id="approver", input="prod")
    wait_for(
        lambda: status_of(approver.pk, ["waiting_for_input"]),
        timeout=30,
        message="the approver asks",
    )
    page.goto(live_server.url + admin_path("task_change", approver.pk))
    expect(page.locator("#pending-actions")).to_contain_text("Approval: deploy")
    # A pause that said nothing has no result yet (it showed an empty "partial" one).
    expect(page.locator("#result")).to_contain_text("No result yet.")
    expect(page.locator("#result .at-badge")).to_have_count(0)
    page.screenshot(path=ARTIFACTS / "admin-task-waiting.png", full_page=True)
    page.click("#pending-actions button:text-is('Approve')")
    expect(page.locator(".messagelist")).to_contain_text("Approved deploy")
    # Live, without a reload: the task completes and its stop buttons go with the rest.
    expect(page.locator("#task-status .at-badge")).to_have_text("completed", timeout=30_000)
    expect(page.locator("#operations button")).to_have_count(0)
    expect(page.locator("#result")).to_contain_text("deployed to prod")
    page.reload()
    expect(page.locator("#task-status .at-badge")).to_have_text("completed")
    expect(page.locator("#result")).to_contain_text("deployed to prod")
    expect(page.locator("#timeline")).to_contain_text("Approval approved")
    page.screenshot(path=ARTIFACTS / "admin-task-detail.png", full_page=True)

    # Something running and something failed, for the overview.
    boom = lifecycle.create(owner=operator, agent_id="boom", input="Fail on purpose")
    busy = lifecycle.create(
        owner=operator,
        agent_id="gate",
        input="Still working",
        metadata={"gate": str(tmp_path / "never")},
    )
    wait_for(lambda: status_of(boom.pk, ["failed"]), timeout=30, message="boom fails")
    wait_for(lambda: status_of(busy.pk, ["running"]), timeout=30, message="busy runs")
    page.goto(live_server.url + admin_path("task_overview"))
    expect(page.locator("#running")).to_contain_text(busy.pk)
    expect(page.locator("#failures")).to_contain_text("kaboom")
    expect(page.locator("#counts")).to_contain_text("completed")
    expect(page.locator("#chart svg")).to_be_visible()
    page.screenshot(path=ARTIFACTS / "admin-overview.png", full_page=True)


CREATE_WITH_FETCH = """async (token) => {
  const headers = {"Content-Type": "application/json"};
  if (token !== null) headers["X-CSRFToken"] = token;
  const response = await fetch("/api/agents/tasks", {
    method: "POST",
    headers,
    credentials: "same-origin",
    body: JSON.stringify({agentId: "echo", input: "from the browser"}),
  });
  return {status: response.status, body: await response.json()};
}"""
CSRF_COOKIE = (
    """() => document.cookie.split("; ").find(c => c.startsWith("csrftoken=")).slice(10)"""
)


def test_a_logged_in_browser_creates_a_task_with_fetch(live_server, browser):
    """Session authentication: the admin's login, then the REST API from a page of the site."""
    operator = get_user_model().objects.create_superuser("ops", "ops@example.com", "ops-password")
    page = browser.new_page()
    page.set_default_timeout(20_000)
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.fill("#id_username", "ops")
    page.fill("#id_password", "ops-password")
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_server.url}/admin/")
    page.goto(live_server.url + "/")
    token = page.evaluate(CSRF_COOKIE)

    created = page.evaluate(CREATE_WITH_FETCH, token)
    assert created["status"] == 201, created
    task = Task.objects.get(pk=created["body"]["task"]["id"])
    assert (task.owner_id, task.input) == (operator.pk, "from the browser")

    for wrong in (None, "x" * 32):
        refused = page.evaluate(CREATE_WITH_FETCH, wrong)
        assert refused["status"] == 403, refused
        assert refused["body"]["error"]["code"] == "FORBIDDEN"
        assert refused["body"]["error"]["message"].startswith("CSRF Failed: ")
    assert Task.objects.count() == 1


def test_the_task_list_fits_1280_pixels_with_what_an_operator_reads_first(live_server, browser):
    """Status, progress, agent, owner, the last update and the duration, without scrolling
    sideways; the id, the attempt and the parent stay reachable in the first column."""
    operator = get_user_model().objects.create_superuser("ops", "ops@example.com", "ops-password")
    root = lifecycle.create_conversation(owner=operator, agent_id="echo")
    for i in range(3):
        lifecycle.create(
            owner=operator,
            agent_id="slow",
            input=f"a long input {i}",
            label=f"Quarterly report for the northern region, part {i}",
        )
    spawned = lifecycle.spawn(root.id, "slow", "child", label="child of a conversation")
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(20_000)
    page.goto(f"{live_server.url}/admin/login/?next={admin_path('task_changelist')}")
    page.fill("#id_username", "ops")
    page.fill("#id_password", "ops-password")
    page.click("input[type=submit]")
    page.wait_for_selector("#result_list")
    widths = page.evaluate(
        "() => ({page: document.documentElement.scrollWidth,"
        " table: document.querySelector('#result_list').scrollWidth,"
        " box: document.querySelector('.results').clientWidth})"
    )
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=ARTIFACTS / "admin-task-list-1280.png", full_page=True)
    assert widths["page"] <= 1280 and widths["table"] <= widths["box"], widths
    headers = page.locator("#result_list thead th").all_inner_texts()
    assert [h.strip().lower() for h in headers[1:]] == [
        "task",
        "status",
        "progress",
        "agent",
        "owner",
        "updated",
        "duration",
    ]
    row = page.locator("#result_list tbody tr", has_text="child of a conversation")
    assert spawned.task_id in row.inner_text()
    assert row.locator(f"a[href*='{quote(root.id)}']").count() == 1  # the parent, one click away


def busy_task(operator) -> Task:
    """A task with the runs and approvals a long-lived task collects: retries, a wake-up, a
    running run with its lease, usage, errors, and approvals decided, pending and expired."""
    from datetime import timedelta

    from django.utils import timezone

    from agenttasks.models import PendingAction

    from ..factories import RunFactory, TaskFactory

    task = TaskFactory(owner=operator, agent="researcher", status="running", attempt=2)
    now = timezone.now()
    worker = "agent-worker-7d9f8c6b5-x2kqz:48213"
    Run.objects.filter(pk=task.run_id).update(worker=worker, attempt=2, trigger="retry")
    for status, trigger, error in (
        ("failed", "initial", "RateLimitError: 429 Too Many Requests from the provider"),
        ("completed", "wakeup", ""),
        ("cancelled", "comment", ""),
    ):
        RunFactory(
            conversation=task.conversation,
            task=task,
            status=status,
            trigger=trigger,
            worker=worker,
            error=error,
            started_at=now - timedelta(hours=3),
            heartbeat_at=now - timedelta(hours=2, minutes=59),
            ended_at=now - timedelta(hours=2, minutes=58),
            usage_known=True,
            prompt_tokens=123456,
            completion_tokens=7890,
            total_tokens=131346,
        )
    run = Run.objects.get(pk=task.run_id)
    for status, call in (
        ("approved", "c1"),
        ("denied", "c2"),
        ("expired", "c3"),
        ("pending", "c4"),
    ):
        PendingAction.objects.create(
            conversation=task.conversation,
            run=run,
            task=task,
            kind="approval",
            tool_name="deploy_to_production",
            tool_call_id=call,
            args={"env": "prod"},
            status=status,
            resolution={"comment": "ship it"} if status == "approved" else None,
            decided_by=operator if status in ("approved", "denied") else None,
            decided_at=now if status != "pending" else None,
        )
    return task


def test_the_task_page_fits_1280_pixels(live_server, browser):
    """The Runs and Approvals tables fit their column, and a date is one line (issue: 948 and
    926 pixels in a 901-pixel column, dates on four lines)."""
    operator = get_user_model().objects.create_superuser("ops", "ops@example.com", "ops-password")
    task = busy_task(operator)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(20_000)
    page.route("**/live/", lambda route: route.abort())  # a still page: no stream to end
    page.goto(f"{live_server.url}/admin/login/?next={admin_path('task_change', task.pk)}")
    page.fill("#id_username", "ops")
    page.fill("#id_password", "ops-password")
    page.click("input[type=submit]")
    page.wait_for_selector("#runs table")
    widths = page.evaluate(
        """() => {
          const size = (id) => {
            const table = document.querySelector(`#${id} table`);
            return {table: table.getBoundingClientRect().width,
                    box: document.querySelector(`#${id}`).clientWidth};
          };
          // An inline element has one box per line it takes.
          const lines = [...document.querySelectorAll('#runs .at-date, #actions .at-date')]
            .map(date => date.getClientRects().length);
          return {page: document.documentElement.scrollWidth, runs: size('runs'),
                  actions: size('actions'), lines};
        }"""
    )
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=ARTIFACTS / "admin-task-page-1280.png", full_page=True)
    assert widths["page"] <= 1280, widths
    for part in ("runs", "actions"):
        assert widths[part]["table"] <= widths[part]["box"], widths
    # Started, heartbeat and ended of three runs, started and heartbeat of the running one; four
    # actions asked, three decided: each date on one line.
    assert len(widths["lines"]) == 3 * 3 + 2 + 4 + 3 and set(widths["lines"]) == {1}, widths
