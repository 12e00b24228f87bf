"""The demo's home page is a playground: a real browser creates an `asker` task and answers it."""

import pytest
from django.contrib.auth import get_user_model

from agenttasks.models import Task

from . import test_admin_browser as chrome
from .test_admin_browser import ARTIFACTS, CHROMIUM

browser = chrome.browser  # the fixture: Debian's Chromium through Playwright

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason="/usr/bin/chromium is missing (apt-get install chromium; .ci/run installs it)",
    ),
]


def test_an_anonymous_visitor_is_asked_to_log_in(live_server, browser):
    from playwright.sync_api import expect

    page = browser.new_page()
    page.goto(live_server.url + "/")
    expect(page.locator("main")).to_contain_text("Log in to try it")
    assert page.locator("a[href='/admin/login/?next=/']").count() == 1


def test_create_an_asker_task_answer_it_inline_and_see_the_result(
    live_server, start_cluster, browser
):
    from playwright.sync_api import expect

    ARTIFACTS.mkdir(exist_ok=True)
    start_cluster()
    get_user_model().objects.create_superuser("ops", "ops@example.com", "ops-password")
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(30_000)
    page.goto(f"{live_server.url}/admin/login/?next=/")
    page.fill("#id_username", "ops")
    page.fill("#id_password", "ops-password")
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_server.url}/")

    expect(page.locator("#agent option[value=asker]")).to_have_count(1)
    page.select_option("#agent", "asker")
    page.fill("#input", "Export the report")
    page.click("#create-form button[type=submit]")
    page.evaluate("() => { window.notReloaded = true; }")

    expect(page.locator("#task-status")).to_have_text("waiting_for_input")
    expect(page.locator("#actions")).to_contain_text("Which format?")
    expect(page.locator("#recent")).to_contain_text("Export the report")
    page.screenshot(path=ARTIFACTS / "playground-question.png", full_page=True)
    page.check("#actions input[value=PDF]")
    page.click("#actions button:text-is('Answer')")

    expect(page.locator("#log")).to_contain_text("format: PDF")
    expect(page.locator("#task-status")).to_have_text("completed")
    expect(page.locator("#actions form")).to_have_count(0)
    assert page.evaluate("() => window.notReloaded") is True
    page.screenshot(path=ARTIFACTS / "playground-answered.png", full_page=True)
    (task,) = Task.objects.all()
    assert (task.agent, task.status, task.result) == ("asker", "completed", "format: PDF")
