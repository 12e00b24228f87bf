"""The admin updates live, in a real browser (Debian's Chromium, a live server, a real cluster)."""

import pytest
from django.contrib.auth import get_user_model

from agenttasks import lifecycle

from ..conftest import wait_for
from . import test_browser as chrome
from .test_browser import ARTIFACTS, CHROMIUM, admin_path, status_of

browser = chrome.browser  # the fixture: Debian's Chromium through Playwright

pytestmark = [
    pytest.mark.serial,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason="/usr/bin/chromium is missing (apt-get install chromium; .ci/run installs it)",
    ),
]


def logged_in(browser, live_server):
    from playwright.sync_api import expect

    get_user_model().objects.create_superuser("ops", "ops@example.com", "ops-password")
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    page.set_default_timeout(30_000)
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.fill("#id_username", "ops")
    page.fill("#id_password", "ops-password")
    page.click("input[type=submit]")
    expect(page.locator("#site-name")).to_be_visible()
    return page


def test_a_task_page_follows_the_task_without_a_reload(live_server, start_cluster, browser):
    from playwright.sync_api import expect

    ARTIFACTS.mkdir(exist_ok=True)
    start_cluster(HEARTBEAT_INTERVAL=1)
    page = logged_in(browser, live_server)
    operator = get_user_model().objects.get(username="ops")

    slow = lifecycle.create(
        owner=operator,
        agent_id="slow",
        input="Sleep in steps",
        metadata={"seconds": 5, "progress": True},
    )
    page.goto(live_server.url + admin_path("task_change", slow.pk))
    page.evaluate("() => { window.notReloaded = true; }")  # gone if the page reloads
    expect(page.locator("#content-main")).to_have_attribute("data-live-connected", "1")
    progress = page.locator("#fields tr", has_text="Progress")
    for step in (1, 2, 3):  # three progress lines, each swapped in as it happens
        expect(progress).to_contain_text(f"step {step}/5 (sleep)")
    expect(page.locator("#task-status .at-badge")).to_have_text("completed", timeout=30_000)
    expect(page.locator('#timeline li[data-type="task.progress"]')).to_have_count(5)
    expect(page.locator("#runs")).to_contain_text("completed")
    assert page.evaluate("() => window.notReloaded") is True
    page.screenshot(path=ARTIFACTS / "admin-live-slow.png", full_page=True)

    approver = lifecycle.create(owner=operator, agent_id="approver", input="prod")
    page.goto(live_server.url + admin_path("task_change", approver.pk))
    page.evaluate("() => { window.notReloaded = true; }")
    expect(page.locator("#pending-actions")).to_contain_text("Approval: deploy")
    assert page.evaluate("() => window.notReloaded") is True
    page.screenshot(path=ARTIFACTS / "admin-task.png", full_page=True)
    page.click("#pending-actions button:text-is('Approve')")
    expect(page.locator(".messagelist")).to_contain_text("Approved deploy")
    wait_for(
        lambda: status_of(approver.pk, ["completed"]), timeout=30, message="the task completes"
    )
    page.evaluate("() => { window.notReloaded = true; }")
    expect(page.locator("#task-status .at-badge")).to_have_text("completed")
    expect(page.locator("#result")).to_contain_text("deployed to prod")
    assert page.evaluate("() => window.notReloaded") is True


def test_the_change_list_and_the_overview_keep_up(live_server, start_cluster, browser):
    from playwright.sync_api import expect

    start_cluster(HEARTBEAT_INTERVAL=1, REAP_INTERVAL=1)
    page = logged_in(browser, live_server)
    operator = get_user_model().objects.get(username="ops")
    task = lifecycle.create(
        owner=operator, agent_id="slow", input="Sleep", metadata={"seconds": 3, "progress": True}
    )
    page.goto(live_server.url + admin_path("task_changelist"))
    page.evaluate("() => { window.notReloaded = true; }")
    row = page.locator("#result_list tbody tr", has_text=task.pk)
    expect(row.locator(".field-status_badge")).to_have_text("completed", timeout=30_000)
    assert page.evaluate("() => window.notReloaded") is True

    page.goto(live_server.url + admin_path("task_overview"))
    queue = page.locator("#queue")
    expect(queue).to_contain_text("runs queued")
    expect(queue).to_contain_text("oldest queued run")
    expect(queue).to_contain_text("expired leases")
    expect(queue).to_contain_text("since the last reaper pass")
    expect(page.locator("#last-pass")).not_to_contain_text("never")
    page.screenshot(path=ARTIFACTS / "admin-overview-queue.png", full_page=True)
