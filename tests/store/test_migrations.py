"""A database migrated one migration at a time has what a fresh one has (PostgreSQL).

The test database is migrated in one go. A second database goes up one migration at a time, down
to before the hot transitions' first functions (0012) and up again; its functions, triggers,
indexes and constraints must equal the test database's, definition for definition. Run as a
module, this file migrates the database of DATABASE_URL that way and prints its catalogue.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]

CATALOGUE = {
    "functions": """
        SELECT p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')',
               pg_get_functiondef(p.oid)
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = 'public'""",
    "triggers": """
        SELECT t.tgname, pg_get_triggerdef(t.oid)
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'public' AND NOT t.tgisinternal""",
    "indexes": "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'",
    "constraints": """
        SELECT c.conrelid::regclass || '.' || c.conname, pg_get_constraintdef(c.oid)
        FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace
        WHERE n.nspname = 'public'""",
}


def catalogue(cursor) -> dict[str, dict[str, str]]:
    """Return each kind of schema object, by name, with its definition (without the faults the
    tests inject, `agenttasks_test_*`, which a test may have left in the test database)."""
    found = {}
    for kind, query in CATALOGUE.items():
        cursor.execute(query)
        found[kind] = {
            name: definition
            for name, definition in sorted(cursor.fetchall())
            if "agenttasks_test_" not in name
        }
    return found


def migrate_step_by_step() -> None:
    """Migrate agenttasks one migration at a time, down to 0012 and up again, then the rest."""
    from django.core.management import call_command
    from django.db.migrations.loader import MigrationLoader

    loader = MigrationLoader(connection)
    names = sorted(name for app, name in loader.disk_migrations if app == "agenttasks")
    for name in names:
        call_command("migrate", "agenttasks", name, verbosity=0)
    call_command("migrate", "agenttasks", "0012_task_counts", verbosity=0)
    call_command("migrate", "agenttasks", verbosity=0)
    call_command("migrate", verbosity=0)


def _admin_url(url: str) -> str:
    return url.rsplit("/", 1)[0] + "/postgres"


@pytest.mark.postgres
@pytest.mark.django_db
def test_a_database_migrated_step_by_step_equals_a_fresh_one():
    name = f"{connection.settings_dict['NAME']}_stepwise"
    url = os.environ["DATABASE_URL"].rsplit("/", 1)[0] + f"/{name}"
    with psycopg.connect(_admin_url(url), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        # template0: other test processes may be copying template1 at this moment.
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
    try:
        env = {**os.environ, "DATABASE_URL": url}
        done = subprocess.run(
            [sys.executable, "-m", "tests.store.test_migrations"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        stepwise = json.loads(done.stdout)
    finally:
        with psycopg.connect(_admin_url(url), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    with connection.cursor() as cursor:
        fresh = catalogue(cursor)
    assert len(fresh["functions"]) > 20 and len(fresh["triggers"]) > 5  # the catalogue is read
    for kind in CATALOGUE:
        assert stepwise[kind].keys() == fresh[kind].keys(), kind
        differ = [key for key in fresh[kind] if stepwise[kind][key] != fresh[kind][key]]
        assert differ == [], (kind, differ)


if __name__ == "__main__":
    import django

    django.setup()
    migrate_step_by_step()
    with connection.cursor() as cursor:
        print(json.dumps(catalogue(cursor)))
