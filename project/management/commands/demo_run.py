"""Run the demo: check the port, migrate, set up the demo user, then the web server and the
cluster together until Ctrl-C (what `make run` does)."""

import errno
import os
import signal
import socket
import subprocess
import sys

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand

STOP_TIMEOUT = 20


def unavailable(host: str, port: int) -> str | None:
    """Why the web server could not listen on host:port, or None if it can."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # As runserver binds: a port left in TIME_WAIT by the previous run is free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return (
                    f"Port {port} on {host} is busy (another server is listening there); "
                    f"choose another one: make run PORT={port + 1}"
                )
            return f"Cannot listen on {host}:{port}: {exc.strerror}; choose another HOST or PORT"
    return None


class Command(BaseCommand):
    help = "Run the demo: web server and django-q2 cluster together, until Ctrl-C."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)

    def handle(self, *args, host, port, **options):
        reason = unavailable(host, port)
        if reason:
            self.stderr.write(reason)
            sys.exit(1)
        try:
            created = ensure_database()
        except OSError as exc:
            self.stderr.write(str(exc))
            sys.exit(1)
        if created:
            self.stdout.write(f"Created the PostgreSQL database {created}")
        call_command("migrate", interactive=False, verbosity=0)
        call_command("demo_setup", host=host, port=port)
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        manage = [sys.executable, str(settings.BASE_DIR / "manage.py")]
        # Each child leads a process group of its own, so a Ctrl-C reaches only this process,
        # which then stops each group once (signalling our own group would signal make too).
        children = [
            subprocess.Popen([*manage, "qcluster"], start_new_session=True),
            subprocess.Popen([*manage, "runserver", address], start_new_session=True),
        ]
        # A stop asked for (Ctrl-C, SIGTERM) is a clean end: exit 0, so `make run` reports no
        # error; a child that ended on its own passes its status on.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        code = 0
        try:
            code = wait_any(children)
        except KeyboardInterrupt:
            code = 0
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut this
            stop(children)
        sys.exit(code)


def ensure_database() -> str | None:
    """Create the demo's PostgreSQL database when it does not exist yet; return its name if
    created. A server that cannot be reached is one line (OSError), not a retry loop."""
    db = settings.DATABASES["default"]
    if db["ENGINE"] != "django.db.backends.postgresql":
        return None
    import psycopg
    from psycopg import sql

    server = {
        "host": db["HOST"] or None,
        "port": db["PORT"] or None,
        "user": db["USER"] or None,
        "password": db["PASSWORD"] or None,
        "connect_timeout": 5,
    }
    try:
        psycopg.connect(dbname=db["NAME"], **server).close()
        return None
    except psycopg.OperationalError as exc:
        if "does not exist" not in str(exc):
            where = f"{db['HOST'] or 'localhost'}:{db['PORT'] or 5432}"
            reason = str(exc).strip().splitlines()[-1]
            raise OSError(f"Cannot reach PostgreSQL at {where} (DATABASE_URL): {reason}") from None
    with psycopg.connect(dbname="postgres", autocommit=True, **server) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db["NAME"])))
    return str(db["NAME"])


def wait_any(children) -> int:
    """Wait until one child exits; return its exit status."""
    while True:
        for child in children:
            try:
                return child.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                continue


def stop(children) -> None:
    """Stop every child's process group as one Ctrl-C would (SIGINT: django-q2 then stops its
    workers gracefully), then SIGKILL what is left after STOP_TIMEOUT seconds."""
    for child in children:
        _signal_group(child, signal.SIGINT)
    for child in children:
        try:
            child.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            _signal_group(child, signal.SIGKILL)
            child.wait()
        _signal_group(child, signal.SIGKILL)  # what the group leader left behind


def _signal_group(child, sig) -> None:
    try:
        os.killpg(child.pid, sig)
    except ProcessLookupError:
        pass
