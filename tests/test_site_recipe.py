"""The README's site recipe, copied as written into a fresh `startproject`: its settings, its
urls.py and its Agents example make a site that checks, migrates and runs a task (issue: a
module named in AGENTS that registers its agent on import made `check` hang)."""

import os
import re
import subprocess
import sys
import textwrap

import pytest

from .cluster import ROOT

pytestmark = pytest.mark.serial  # processes of their own


def readme_block(after: str, starts: str) -> str:
    """The first ```python block after the heading `after` whose code starts with `starts`."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index(after) :]
    for block in re.findall(r"```python\n(.*?)```", section, re.S):
        if block.lstrip().startswith(starts):
            return block
    raise AssertionError(f"no python block starting {starts!r} after {after!r}")


def manage(site, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {
        k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL")
    }
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=site,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def site(tmp_path):
    """A fresh `startproject mysite` with the README's settings and urls.py pasted in (its `...`
    standing for what the project already has)."""
    subprocess.run(
        [sys.executable, "-m", "django", "startproject", "mysite"], cwd=tmp_path, check=True
    )
    site = tmp_path / "mysite"
    settings_file = site / "mysite" / "settings.py"
    settings = settings_file.read_text()
    apps = re.search(r"INSTALLED_APPS = \[\n(.*?)\]", settings, re.S).group(1)
    recipe = readme_block("## Install into your site", "INSTALLED_APPS")
    settings = settings.replace(
        re.search(r"INSTALLED_APPS = \[.*?\]\n", settings, re.S).group(0), ""
    )
    settings_file.write_text(settings + "\n" + recipe.replace("    ...,\n", apps))
    urls_file = site / "mysite" / "urls.py"
    urls = readme_block("## Install into your site", "# urls.py")
    existing = re.search(r"urlpatterns = \[\n(.*?)\]", urls_file.read_text(), re.S).group(1)
    pasted = urls.replace("[..., ", "[\n" + existing + "    ")
    urls_file.write_text("from django.contrib import admin\n" + pasted)
    return site


def test_the_readme_site_recipe_checks_migrates_and_runs_a_task(site):
    agents = readme_block("## Agents", "from agenttasks import registry")
    # The settings register `mysite.agents.summarize`; the module keeps the handler only.
    handler = agents.split("\n\nregistry.register(")[0]
    (site / "mysite" / "agents.py").write_text(handler + "\n")
    checked = manage(site, "check")
    assert checked.returncode == 0, checked.stderr
    migrated = manage(site, "migrate", "-v", "0")
    assert migrated.returncode == 0, migrated.stderr
    script = textwrap.dedent(
        """
        from django.contrib.auth import get_user_model
        from agenttasks import lifecycle
        from agenttasks.execution import worker
        from agenttasks.models import PendingAction

        user = get_user_model().objects.create_user("alice")
        task = lifecycle.create(owner=user, agent_id="summarizer", input="the report")
        worker.execute_run(task.run_id)
        asked = PendingAction.objects.get(task_id=task.id)
        print(lifecycle.status(task.id).status, asked.tool_name, asked.args["doc"])
        """
    )
    ran = manage(site, "shell", "-c", script)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines()[-1].split() == ["waiting_for_input", "publish", "the", "report"]


def test_the_agents_example_beside_the_settings_is_a_clear_error_not_a_hang(site):
    # Both verbatim: the settings name the handler's module, which registers it on import too.
    (site / "mysite" / "agents.py").write_text(
        readme_block("## Agents", "from agenttasks import registry")
    )
    checked = manage(site, "check", timeout=60)
    assert checked.returncode != 0
    assert "summarizer" in checked.stderr and "both" in checked.stderr, checked.stderr
