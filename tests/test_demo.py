"""`make run`: the demo listens on loopback, says what is unsafe, fails in one line on a busy
port, stops everything on Ctrl-C, and reads a body sent without a Content-Type as JSON."""

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import uuid
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test.utils import override_settings

from .cluster import ROOT
from .conftest import wait_for

VENV = Path(sys.executable).parent.parent

# Processes of their own, timed by the clock: outside the parallel part of the suite.
pytestmark = pytest.mark.serial


def make_run(tmp_path, port: int, *args: str, marker: str = "") -> subprocess.Popen:
    """`make run` in a process group of its own, on a fresh SQLite file (never the demo's)."""
    env = {
        **{
            k: v
            for k, v in os.environ.items()
            if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")
        },
        "SQLITE_PATH": str(tmp_path / "demo.sqlite3"),
        "MEDIA_ROOT": str(tmp_path / "media"),
        "PYTHONUNBUFFERED": "1",
        "AGENTTASKS_DEMO_TEST": marker,
    }
    return subprocess.Popen(
        # -o: the virtualenv is this one, already installed; never reinstall it here.
        ["make", "run", f"VENV={VENV}", "-o", f"{VENV}/.demo", f"PORT={port}", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # whatever it signals, it cannot reach the test
        # As a terminal's shell starts it: a suite run as a background job (`.ci/run &`) would
        # hand on an ignored SIGINT, and Ctrl-C would then reach nothing.
        preexec_fn=_default_interrupts,
    )


def _default_interrupts() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def stuck_processes(marker: str) -> str:
    """What each demo process still alive is doing: its command line and its threads' states."""
    out = []
    for pid in processes_marked(marker):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            threads = sorted(Path(f"/proc/{pid}/task").iterdir())
            states = [(t.name, (t / "stat").read_text().split(")")[1].split()[0]) for t in threads]
        except OSError:
            continue
        out.append(f"{pid} {command[:120]} threads={len(states)} {states[:12]}")
    return "\n".join(out)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_busy_port_is_one_clear_line(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        process = make_run(tmp_path, port)
        output, _ = process.communicate(timeout=120)
    assert process.returncode != 0
    ours = [line for line in output.splitlines() if not line.startswith("make")]
    assert ours == [
        f"Port {port} on 127.0.0.1 is busy (another server is listening there); "
        f"choose another one: make run PORT={port + 1}"
    ], output[:2000]


def listening(port: int) -> set[str]:
    """The local addresses with a socket listening on this port (Linux's /proc/net/tcp*)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(address)
    return found


def processes_marked(marker: str) -> list[int]:
    """Processes whose environment carries this test's marker (make's children and theirs)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if f"AGENTTASKS_DEMO_TEST={marker}".encode() in environ.split(b"\0"):
            pids.append(int(entry))
    return pids


def post(port: int, token: str, body: bytes, content_type: str | None) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Authorization": f"Token {token}"}
    if content_type is not None:
        headers["Content-Type"] = content_type
    # http.client adds no Content-Type of its own.
    connection.request("POST", "/api/agents/tasks", body=body, headers=headers)
    status = connection.getresponse().status
    connection.close()
    return status


def test_make_run_listens_on_loopback_and_ctrl_c_stops_everything(tmp_path):
    marker = uuid.uuid4().hex
    port = free_port()
    process = make_run(tmp_path, port, marker=marker)
    lines: list[str] = []
    reader = threading.Thread(
        target=lambda: lines.extend(line.rstrip() for line in process.stdout), daemon=True
    )
    reader.start()
    try:
        wait_for(
            lambda: (
                any("Starting development server" in line for line in lines)
                and any("running." in line for line in lines)
            ),
            timeout=90,
            message="the web server and the cluster",
        )
        output = "\n".join(lines)
        assert f"http://127.0.0.1:{port}/admin/" in output
        assert (
            "Demo settings, unsafe on a reachable server: DEBUG is on (DJANGO_DEBUG=0 turns it "
            'off); ALLOWED_HOSTS is "*"; SECRET_KEY is the fixed demo key (set '
            "DJANGO_SECRET_KEY); the superuser is admin / admin."
        ) in output
        assert "Listening on 127.0.0.1 only (make run HOST=0.0.0.0 opens it to others)." in output
        assert listening(port) == {"0100007F"}  # 127.0.0.1, and nothing else

        token = re.search(r"Authorization: Token (\w+)", output).group(1)
        body = json.dumps({"agentId": "echo", "input": "untyped"}).encode()
        assert post(port, token, body, None) == 201
        assert post(port, token, body, "text/plain") == 415  # a declared type still counts
        # The demo serves its metrics, and says where.
        assert f"Metrics:   http://127.0.0.1:{port}/api/agents/metrics" in output
        metrics = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        metrics.request("GET", "/api/agents/metrics")
        scraped = metrics.getresponse()
        assert scraped.status == 200 and b"agenttasks_tasks" in scraped.read()
        metrics.close()
    finally:
        # Ctrl-C reaches the demo (make may be told too: then it dies of it, and says nothing).
        for pid in processes_marked(marker):
            if b"demo_run" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGINT)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            print("\n".join(["the demo did not stop on Ctrl-C; it said:", *lines[-60:]]))
            print(stuck_processes(marker))
            os.killpg(process.pid, signal.SIGINT)  # the whole group, as a terminal would
            process.wait(60)
    assert process.returncode == 0, lines[-5:]  # a clean stop: no "make: *** … Error 130"
    assert not any(line.startswith("make: ***") for line in lines), lines[-5:]
    wait_for(lambda: not processes_marked(marker), timeout=60, message="every demo process exits")
    assert listening(port) == set()
    assert not any("RecursionError" in line or "Traceback" in line for line in lines), lines


@pytest.mark.django_db
def test_the_banner_names_each_insecure_choice_still_in_effect():
    out = StringIO()
    with override_settings(DEBUG=False, ALLOWED_HOSTS=["demo.example"], SECRET_KEY="k" * 50):
        call_command("demo_setup", host="0.0.0.0", port="8001", stdout=out)
    text = out.getvalue()
    assert "Admin:     http://127.0.0.1:8001/admin/" in text
    assert "Playground: http://127.0.0.1:8001/   (sign in as admin" in text  # the README's first
    assert "Demo settings, unsafe on a reachable server: the superuser is admin / admin." in text
    assert (
        "WARNING: listening on 0.0.0.0: anyone who can reach this machine can use it with the "
        "settings above." in text
    )


@pytest.mark.django_db
def test_every_page_has_its_icon(client):
    icon = client.get("/favicon.ico")
    assert icon.status_code == 200 and icon["Content-Type"] == "image/svg+xml"
    assert icon.content.startswith(b"<svg")
