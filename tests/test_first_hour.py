"""What a new user meets in the first hour, beyond `make run` itself: the demo's PostgreSQL
database, its authentication, and the README's MCP client example's install."""

import base64
import re
import uuid

import psycopg
import pytest
import tomllib
from django.conf import settings
from django.contrib.auth import get_user_model

from project.management.commands.demo_run import ensure_database

from .cluster import ROOT


@pytest.mark.django_db
def test_the_demo_takes_http_basic_as_the_readme_says(client):
    get_user_model().objects.create_user("basic", password="secret")
    token = base64.b64encode(b"basic:secret").decode()
    answer = client.get("/api/agents/agents", HTTP_AUTHORIZATION=f"Basic {token}")
    assert answer.status_code == 200, answer.content
    wrong = base64.b64encode(b"basic:wrong").decode()
    assert client.get("/api/agents/agents", HTTP_AUTHORIZATION=f"Basic {wrong}").status_code == 401


def postgres_at(monkeypatch, **changes) -> dict:
    db = {
        **settings.DATABASES["default"],
        "ENGINE": "django.db.backends.postgresql",
        "HOST": "127.0.0.1",
        "PORT": "5432",
        "USER": "postgres",
        "PASSWORD": "",
        **changes,
    }
    monkeypatch.setitem(settings.DATABASES, "default", db)
    return db


@pytest.mark.postgres
@pytest.mark.django_db
def test_make_run_creates_its_postgresql_database_when_it_is_missing(monkeypatch):
    name = f"agenttasks_demo_{uuid.uuid4().hex[:8]}"
    postgres_at(monkeypatch, NAME=name)
    try:
        assert ensure_database() == name
        assert ensure_database() is None  # it exists now: nothing to do
    finally:
        with psycopg.connect(
            host="127.0.0.1", user="postgres", dbname="postgres", autocommit=True
        ) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}"')


def test_an_unreachable_postgresql_is_one_line(monkeypatch):
    postgres_at(monkeypatch, NAME="whatever", PORT="1")
    with pytest.raises(OSError) as failed:
        ensure_database()
    message = str(failed.value)
    assert message.startswith("Cannot reach PostgreSQL at 127.0.0.1:1 (DATABASE_URL): ")
    assert "\n" not in message


def test_the_readme_mcp_client_example_is_installable_by_an_extra():
    readme = (ROOT / "README.md").read_text()
    example = re.search(
        r"```python\nimport asyncio, httpx2\nfrom mcp import Client.*?```", readme, re.S
    )
    assert example is not None
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert extras["mcp-client"] == ["mcp==2.3.0"]
    before = readme[: example.start()]
    assert 'pip install -e ".[mcp-client]"' in before.rsplit("\n\n", 2)[-2]


@pytest.mark.django_db
def test_the_playgrounds_rest_api_link_opens_the_swagger_ui(client):
    user = get_user_model().objects.create_user("reader", password="secret")
    client.force_login(user)
    page = client.get("/").content.decode()
    (href,) = re.findall(r'<a href="([^"]+)"[^>]*>REST API</a>', page)
    assert href == "/api/agents/docs"
    docs = client.get(href)
    assert docs.status_code == 200 and docs["Content-Type"].startswith("text/html")


@pytest.mark.both
@pytest.mark.django_db
def test_the_playground_says_replies_stream_only_on_postgresql(client):
    from django.db import connection

    client.force_login(get_user_model().objects.create_user("watcher", password="secret"))
    page = client.get("/").content.decode()
    assert ('id="streaming-note"' in page) == (connection.vendor != "postgresql")


def test_loading_the_urls_imports_no_surface_until_its_first_request():
    import os
    import subprocess
    import sys

    script = (
        "import sys, django; django.setup()\n"
        "from django.urls import resolve\n"
        "from django.test import Client\n"
        "mcp = resolve('/api/agents/mcp').url_name\n"
        "card = resolve('/api/agents/a2a/echo/.well-known/agent-card.json').url_name\n"
        "print(mcp, card, 'mcp_types' in sys.modules, 'a2a' in sys.modules)\n"
        "Client().get('/api/agents/a2a/echo/.well-known/agent-card.json')\n"
        "print('a2a' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "project.settings"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["mcp", "a2a-card", "False", "False", "True"]
